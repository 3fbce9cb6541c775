//! The kinds of hold a lock service grants: the mutex, and the primitives built on it,
//! with the one grant rule every queueing backend applies to them, and the writes a kind
//! may make on its own hold.

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::token::OwnerToken;

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
    /// `count` permits of a semaphore of `permits`, taken and given back together as
    /// one hold: at most `permits` permits held at a time.
    Permit {
        /// How many permits the semaphore has; every participant must say the same.
        permits: u32,
        /// How many of them this hold takes, from 1 to `permits`.
        count: u32,
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
    /// One permit of a semaphore of `permits`.
    pub const fn permit(permits: u32) -> HoldKind {
        HoldKind::Permit { permits, count: 1 }
    }

    /// Whether a hold of this kind is granted behind `ahead`: the kinds of the entries
    /// of its name that hold or queue before it, in queue order. The rule of every
    /// queueing backend: a reader waits only for writers ahead (never overtaking one, so
    /// writers are not starved), an upgradeable reader for anyone ahead but readers (a
    /// reader passes one upgradeable reader ahead, which then holds, never a second),
    /// permits while the permits ahead and its own `count` are no more than `permits` (so
    /// a request for many at the head of the queue holds back the smaller ones behind it:
    /// it is never starved, and nobody deadlocks), any other kind for nobody ahead.
    pub fn granted_behind<'a>(&self, ahead: impl IntoIterator<Item = &'a HoldKind>) -> bool {
        let mut taken: u64 = 0;
        let mut upgradeable_ahead = false;
        for other in ahead {
            taken += u64::from(other.weight());
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
            HoldKind::Permit { permits, count } => taken + u64::from(*count) <= u64::from(*permits),
            _ => true,
        }
    }

    /// Refuses a permit hold of a semaphore of no permits, or of 0 permits or more than
    /// its semaphore has.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] saying which.
    pub fn check_count(&self) -> Result<()> {
        match self {
            HoldKind::Permit { permits: 0, .. } => {
                Err(Error::config("a semaphore needs at least one permit"))
            }
            HoldKind::Permit { permits, count } if *count == 0 || count > permits => {
                Err(Error::config(format!(
                    "an acquire takes from 1 to {permits} permits of a semaphore of \
                     {permits}, not {count}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// How many of its name's places a hold of this kind takes: a permit hold's `count`,
    /// 1 for any other kind.
    pub fn weight(&self) -> u32 {
        match self {
            HoldKind::Permit { count, .. } => *count,
            _ => 1,
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
            (HoldKind::Permit { permits: a, .. }, HoldKind::Permit { permits: b, .. }) => a == b,
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
            HoldKind::Permit { permits: 1, .. } => "a semaphore of 1 permit".into(),
            HoldKind::Permit { permits, count: 1 } => format!("a semaphore of {permits} permits"),
            HoldKind::Permit { permits, count } => {
                format!("{count} permits of a semaphore of {permits} permits")
            }
            HoldKind::Read => "a read-write lock (read)".into(),
            HoldKind::Write => "a read-write lock (write)".into(),
            HoldKind::Upgradeable => "a read-write lock (upgradeable read)".into(),
        }
    }
}

/// A change of a semaphore's number of permits
/// ([`DistributedLock::resize_semaphore`](crate::DistributedLock::resize_semaphore)): every
/// hold and request of the name is rewritten, in one atomic write, as [`Self::rewrite`]
/// says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemaphoreResize<'a> {
    /// The number of permits the semaphore has.
    pub from: u32,
    /// The number it is to have.
    pub to: u32,
    /// For a shrink: the owner token of the resizer's own hold of `from - to` permits,
    /// taken in the queue beforehand, so that no more than `to` permits are held by
    /// others when the write is made. The write makes it a hold of all `to` permits (so
    /// nobody is granted before its release, which follows).
    pub reservation: Option<&'a OwnerToken>,
}

impl SemaphoreResize<'_> {
    /// The kind the hold or request of `owner` (of `kind`) on `name` has after the
    /// resize: a permit of `to`, with its count, or all of them for the reservation.
    ///
    /// # Errors
    /// [`Error::Conflict`] for anything but a permit of `from` (or of `to`: a retried
    /// resize), or of a count above `to`.
    pub fn rewrite(
        &self,
        kind: &HoldKind,
        owner: Option<&str>,
        name: &LockName,
    ) -> Result<HoldKind> {
        let to = HoldKind::permit(self.to);
        if to.check_beside(kind, name).is_err() {
            HoldKind::permit(self.from).check_beside(kind, name)?;
        }
        let reserved = self
            .reservation
            .is_some_and(|token| owner == Some(token.as_str()));
        let count = if reserved { self.to } else { kind.weight() };
        if count > self.to {
            return Err(Error::Conflict {
                name: name.to_string(),
                ours: to.describe(),
                theirs: kind.describe(),
            });
        }
        Ok(HoldKind::Permit {
            permits: self.to,
            count,
        })
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
        HoldKind::permit(permits)
    }

    fn permits(permits: u32, count: u32) -> HoldKind {
        HoldKind::Permit { permits, count }
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
    fn permits_sum_the_counts_ahead() {
        let one = permit(5);
        let three = permits(5, 3);
        assert!(three.granted_behind([&permits(5, 2)]));
        assert!(!three.granted_behind([&permits(5, 2), &one]));
        assert!(one.granted_behind([&three, &one]));
        assert!(!one.granted_behind([&three, &permits(5, 2)]));
        assert!(permits(5, 5).granted_behind([]));
        assert!(!permits(5, 5).granted_behind([&one]));
    }

    #[test]
    fn a_big_request_ahead_holds_back_the_small_ones() {
        // Held: 2 of 4. Queued first: a request for 3, which waits; behind it a request
        // for 1 that would fit alone waits too (no overtaking), in every backend's
        // settle, which stops at the first waiter not granted.
        let held = [permits(4, 2)];
        let big = permits(4, 3);
        assert!(!big.granted_behind(&held));
        let mut queue = vec![big.clone(), permit(4)];
        let mut ahead: Vec<HoldKind> = held.to_vec();
        let mut granted = Vec::new();
        while let Some(next) = queue.first() {
            if !next.granted_behind(&ahead) {
                break;
            }
            let next = queue.remove(0);
            ahead.push(next.clone());
            granted.push(next);
        }
        assert!(granted.is_empty(), "nobody overtakes the head: {granted:?}");
        // Once the holder goes, the big one is granted, then the small one fits beside it.
        assert!(big.granted_behind([]));
        assert!(permit(4).granted_behind([&big]));
        assert!(!permits(4, 2).granted_behind([&big]));
    }

    #[test]
    fn a_resize_rewrites_permits_and_fills_the_reservation() {
        let name = LockName::new("jobs").expect("valid");
        let reserved = OwnerToken::generate();
        let shrink = SemaphoreResize {
            from: 4,
            to: 2,
            reservation: Some(&reserved),
        };
        let rewrite = |kind: &HoldKind, owner: Option<&str>| shrink.rewrite(kind, owner, &name);
        assert_eq!(
            rewrite(&permits(4, 2), Some("a")).expect("fits"),
            permits(2, 2)
        );
        assert_eq!(
            rewrite(&permits(4, 2), Some(reserved.as_str())).expect("the reservation"),
            permits(2, 2)
        );
        assert_eq!(rewrite(&permit(2), None).expect("a retry"), permit(2));
        for refused in [permits(4, 3), permit(3), HoldKind::Read, HoldKind::Mutex] {
            let err = rewrite(&refused, Some("a")).expect_err("refused");
            assert_eq!(err.kind(), crate::ErrorKind::Conflict, "{refused:?}: {err}");
        }
    }

    #[test]
    fn weight_is_the_count_of_a_permit_hold() {
        assert_eq!(permits(9, 4).weight(), 4);
        assert_eq!(HoldKind::Read.weight(), 1);
        assert_eq!(HoldKind::Mutex.weight(), 1);
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
        assert!(permits(3, 2).check_beside(&permit(3), &name).is_ok());
        assert!(permits(3, 2).check_beside(&permits(4, 2), &name).is_err());
        assert!(HoldKind::Read.check_beside(&HoldKind::Write, &name).is_ok());
        assert!(HoldKind::Mutex
            .check_beside(&HoldKind::Read, &name)
            .is_err());
    }
}
