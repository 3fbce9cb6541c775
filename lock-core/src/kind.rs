//! The kinds of hold a lock service grants: the mutex, and the primitives built on it,
//! with the one grant rule every queueing backend applies to them, and the writes a kind
//! may make on its own hold.

use crate::error::{Error, Result};
use crate::name::LockName;

/// The kind of hold an acquisition asks for. A backend grants the kinds its
/// [`Capabilities`](crate::Capabilities) name; the lease client refuses the others before they reach it.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HoldKind {
    /// Exclusive: one holder at a time. The default.
    #[default]
    Mutex,
    /// A candidate of a leader election: exclusive like the mutex (the holder leads), and
    /// the candidate's `value` (its identity or address) is stored with its entry, where
    /// [`Backend::inspect`](crate::raw::backend::Backend::inspect) shows it and an
    /// [`Amendment::Proclaim`] changes it.
    Candidate {
        /// What the candidate proclaims; readers see it as the leader's value.
        value: Vec<u8>,
    },
    /// One permit of a semaphore of `permits`: at most `permits` holders at a time.
    Permit {
        /// How many permits the semaphore has; every participant must say the same.
        permits: u32,
    },
    /// The shared side of a read-write lock: readers hold together, beside no writer.
    Read,
    /// The exclusive side of a read-write lock: a writer holds alone.
    Write,
    /// The upgradeable read side of a read-write lock: a reader that may become the
    /// writer ([`Amendment::Upgrade`]). It holds beside readers, beside no writer and no
    /// other upgradeable reader.
    Upgradeable,
}

impl HoldKind {
    /// Whether a hold of this kind is granted behind `ahead`: the kinds of the entries
    /// of its name that hold or queue before it, in queue order. The rule of every
    /// queueing backend: a reader waits only for writers ahead (never overtaking one, so
    /// writers are not starved), an upgradeable reader for anyone ahead but readers (a
    /// reader passes one upgradeable reader ahead, which then holds, never a second), a
    /// permit for fewer than `permits` ahead, any other kind for nobody ahead.
    pub fn granted_behind<'a>(&self, ahead: impl IntoIterator<Item = &'a HoldKind>) -> bool {
        let mut count: u64 = 0;
        let mut upgradeable_ahead = false;
        for other in ahead {
            count += 1;
            let shares = match (self, other) {
                (HoldKind::Read, HoldKind::Read)
                | (HoldKind::Upgradeable, HoldKind::Read)
                | (HoldKind::Permit { .. }, HoldKind::Permit { .. }) => true,
                // Only the first upgradeable reader ahead holds; a reader never overtakes
                // the second, which waits.
                (HoldKind::Read, HoldKind::Upgradeable) => {
                    !std::mem::replace(&mut upgradeable_ahead, true)
                }
                _ => false,
            };
            if !shares {
                return false;
            }
        }
        match self {
            HoldKind::Permit { permits } => count < u64::from(*permits),
            _ => true,
        }
    }

    /// Refuses to queue this kind on `name` beside `other`, a kind already there, where
    /// the two cannot be one primitive: semaphores whose participants disagree on the
    /// number of permits (one of them would over-grant), or a name used as two kinds.
    ///
    /// # Errors
    /// [`Error::Conflict`] naming both.
    pub fn check_beside(&self, other: &HoldKind, name: &LockName) -> Result<()> {
        let family = |kind: &HoldKind| match kind {
            HoldKind::Mutex | HoldKind::Candidate { .. } => 0,
            HoldKind::Permit { .. } => 1,
            HoldKind::Read | HoldKind::Write | HoldKind::Upgradeable => 2,
        };
        let agree = match (self, other) {
            (HoldKind::Permit { permits: a }, HoldKind::Permit { permits: b }) => a == b,
            _ => family(self) == family(other),
        };
        if agree {
            return Ok(());
        }
        Err(Error::Conflict {
            name: name.to_string(),
            ours: self.describe(),
            theirs: other.describe(),
        })
    }

    /// Whether holds of this kind may be granted several at a time.
    pub fn is_shared(&self) -> bool {
        matches!(self, HoldKind::Read | HoldKind::Permit { .. })
    }

    /// The kind as inspections show it ([`Participant::kind`](crate::Participant::kind))
    /// and the by-kind metrics count it: a permit, a read or a write; `None` for a mutex
    /// or a candidate, which their layouts already tell apart.
    pub fn shown(&self) -> Option<HoldKind> {
        match self {
            HoldKind::Permit { .. } | HoldKind::Read | HoldKind::Write | HoldKind::Upgradeable => {
                Some(self.clone())
            }
            HoldKind::Mutex | HoldKind::Candidate { .. } => None,
        }
    }

    /// A stable short name: `mutex`, `candidate`, `permit`, `read`, `write` or
    /// `upgradeable` (the `kind`
    /// field of acquire spans, the `kind` label of the by-kind metrics).
    pub fn label(&self) -> &'static str {
        match self {
            HoldKind::Mutex => "mutex",
            HoldKind::Candidate { .. } => "candidate",
            HoldKind::Permit { .. } => "permit",
            HoldKind::Read => "read",
            HoldKind::Write => "write",
            HoldKind::Upgradeable => "upgradeable",
        }
    }

    /// The kind in words, for errors and operators (`a semaphore of 4 permits`).
    pub fn describe(&self) -> String {
        match self {
            HoldKind::Mutex => "a mutex".into(),
            HoldKind::Candidate { .. } => "an election".into(),
            HoldKind::Permit { permits: 1 } => "a semaphore of 1 permit".into(),
            HoldKind::Permit { permits } => format!("a semaphore of {permits} permits"),
            HoldKind::Read => "a read-write lock (read)".into(),
            HoldKind::Write => "a read-write lock (write)".into(),
            HoldKind::Upgradeable => "a read-write lock (upgradeable read)".into(),
        }
    }
}

/// A write on one's own hold, owner-checked like a release
/// ([`Backend::amend`](crate::raw::backend::Backend::amend)).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amendment<'a> {
    /// A [`HoldKind::Candidate`] hold's new value: an election's proclaim. The observers
    /// of its name are told.
    Proclaim(&'a [u8]),
    /// A [`HoldKind::Write`] hold becomes a `Read` hold in its place in the queue, with
    /// no moment between in which it holds neither: readers queued behind it may then be
    /// granted, writers still wait.
    Downgrade,
    /// A [`HoldKind::Upgradeable`] hold becomes a `Write` hold in its place in the queue:
    /// from the first step on, nobody queued after it is granted beside it; it holds
    /// alone once the readers granted beside it have left. Each step is owner-checked
    /// and may be repeated: [`Amended::Pending`](crate::raw::backend::Amended) while
    /// readers still hold, `Done` once it holds alone.
    Upgrade,
}

impl Amendment<'_> {
    /// What the amendment does, for errors and spans (`proclaim`, `downgrade`,
    /// `upgrade`).
    pub fn label(&self) -> &'static str {
        match self {
            Amendment::Proclaim(_) => "proclaim",
            Amendment::Downgrade => "downgrade",
            Amendment::Upgrade => "upgrade",
        }
    }

    /// The error of a backend that cannot make this amendment.
    pub fn unsupported(&self, backend: &'static str) -> Error {
        Error::unsupported(backend, format!("amending a hold ({})", self.label()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permit(permits: u32) -> HoldKind {
        HoldKind::Permit { permits }
    }

    #[test]
    fn exclusive_kinds_need_nobody_ahead() {
        for kind in [HoldKind::Mutex, HoldKind::Write] {
            assert!(kind.granted_behind([]));
            assert!(!kind.granted_behind([&HoldKind::Read]));
            assert!(!kind.granted_behind([&HoldKind::Write]));
        }
    }

    #[test]
    fn readers_share_and_never_overtake_a_writer() {
        assert!(HoldKind::Read.granted_behind([&HoldKind::Read, &HoldKind::Read]));
        assert!(!HoldKind::Read.granted_behind([&HoldKind::Read, &HoldKind::Write]));
        assert!(!HoldKind::Read.granted_behind([&HoldKind::Write, &HoldKind::Read]));
    }

    #[test]
    fn one_upgradeable_reader_beside_readers() {
        let (read, upgradeable) = (HoldKind::Read, HoldKind::Upgradeable);
        assert!(upgradeable.granted_behind([&read, &read]));
        assert!(read.granted_behind([&upgradeable, &read]));
        assert!(!upgradeable.granted_behind([&read, &upgradeable]));
        assert!(!upgradeable.granted_behind([&HoldKind::Write]));
        // The second one ahead waits, and a reader does not overtake it.
        assert!(!read.granted_behind([&upgradeable, &read, &upgradeable]));
        assert!(!HoldKind::Write.granted_behind([&upgradeable]));
        // Nobody overtakes a queued writer, an upgradeable reader no more than a reader.
        assert!(!upgradeable.granted_behind([&read, &HoldKind::Write]));
        assert!(!read.granted_behind([&upgradeable, &HoldKind::Write]));
        assert!(upgradeable
            .check_beside(&HoldKind::Write, &LockName::new("t").expect("valid"))
            .is_ok());
    }

    #[test]
    fn permits_count_what_is_ahead() {
        let two = permit(2);
        assert!(two.granted_behind([]));
        assert!(two.granted_behind([&two]));
        assert!(!two.granted_behind([&two, &two]));
        assert!(!permit(1).granted_behind([&permit(1)]));
    }

    #[test]
    fn disagreements_are_conflicts() {
        let name = LockName::new("jobs").expect("valid");
        assert!(permit(3).check_beside(&permit(3), &name).is_ok());
        let err = permit(3)
            .check_beside(&permit(4), &name)
            .expect_err("disagree");
        assert_eq!(err.kind(), crate::ErrorKind::Conflict);
        assert!(err.to_string().contains("4 permits"), "{err}");
        assert!(HoldKind::Read.check_beside(&HoldKind::Write, &name).is_ok());
        assert!(HoldKind::Mutex
            .check_beside(&HoldKind::Read, &name)
            .is_err());
    }
}
