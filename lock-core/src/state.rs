//! The states of a hold and how a hold ends: the words every other part of the contract
//! speaks (errors name a [`LostReason`], guards and watches report a [`LockState`]).

use std::fmt;

/// The state of a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    /// Held and renewed as planned.
    Held,
    /// Possibly still held, but renewal is failing or the connection is suspended.
    /// Stop starting new work; finish or abandon what is in flight before the
    /// validity deadline.
    Suspect,
    /// Not held any more. Terminal.
    Lost(LostReason),
}

impl LockState {
    /// Whether the state is [`LockState::Lost`].
    pub fn is_lost(self) -> bool {
        matches!(self, LockState::Lost(_))
    }
}

/// Why a hold ended.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The validity deadline passed without a successful renewal.
    Expired,
    /// The key, node or lease is gone on the server.
    Vanished,
    /// Another owner holds the lock now.
    Taken,
    /// The backend session (ZooKeeper session, etcd lease) expired.
    SessionExpired,
    /// [`crate::LockOptions::max_hold`] was reached.
    HoldCapReached,
    /// The hold was released by its guard.
    Released,
    /// An operator removed the hold on the server
    /// ([`crate::DistributedLock::force_release`]).
    Broken,
    /// One side of a dual (migration) lock was lost, for `reason`.
    OnSide {
        /// The side that was lost.
        side: Side,
        /// Why that side was lost (never itself `OnSide`).
        reason: &'static LostReason,
    },
}

/// A side of a dual (migration) lock: the backend a fleet moves from, or the one it
/// moves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The backend the fleet moves from.
    Old,
    /// The backend the fleet moves to.
    New,
}

impl Side {
    /// `old` or `new`, as in the `side` label of [`crate::metrics::LOSSES`].
    pub fn label(self) -> &'static str {
        match self {
            Side::Old => "old",
            Side::New => "new",
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl LostReason {
    /// `reason` on `side`. A reason that already names a side keeps it.
    pub fn on_side(side: Side, reason: LostReason) -> LostReason {
        let reason: &'static LostReason = match reason {
            LostReason::Expired => &LostReason::Expired,
            LostReason::Vanished => &LostReason::Vanished,
            LostReason::Taken => &LostReason::Taken,
            LostReason::SessionExpired => &LostReason::SessionExpired,
            LostReason::HoldCapReached => &LostReason::HoldCapReached,
            LostReason::Released => &LostReason::Released,
            LostReason::Broken => &LostReason::Broken,
            on_side @ LostReason::OnSide { .. } => return on_side,
        };
        LostReason::OnSide { side, reason }
    }

    /// The reason without the side it happened on.
    pub fn without_side(self) -> LostReason {
        match self {
            LostReason::OnSide { reason, .. } => *reason,
            reason => reason,
        }
    }

    /// The side of a dual lock it happened on, if any.
    pub fn side(self) -> Option<Side> {
        match self {
            LostReason::OnSide { side, .. } => Some(side),
            _ => None,
        }
    }

    /// A stable snake_case name of the reason without its side (`expired`, `taken`,
    /// `session_expired`, …), as in the `reason` label of [`crate::metrics::LOSSES`].
    pub fn label(self) -> &'static str {
        match self.without_side() {
            LostReason::Expired => "expired",
            LostReason::Vanished => "vanished",
            LostReason::Taken => "taken",
            LostReason::SessionExpired => "session_expired",
            LostReason::HoldCapReached => "hold_cap_reached",
            LostReason::Released => "released",
            LostReason::Broken => "broken",
            // `without_side` never returns one; named for the match to be exhaustive.
            LostReason::OnSide { .. } => "on_side",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "its validity deadline passed without a renewal",
            LostReason::Vanished => "it is gone on the server",
            LostReason::Taken => "another owner holds it",
            LostReason::SessionExpired => "the session expired",
            LostReason::HoldCapReached => "the maximum hold time was reached",
            LostReason::Released => "it was released",
            LostReason::Broken => "an operator broke it with a forced release",
            LostReason::OnSide { side, reason } => {
                return write!(f, "on the {side} backend, {reason}")
            }
        })
    }
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lock was held and is now released.
    Released,
    /// The lock had already been lost; nothing was removed on the server.
    AlreadyLost(LostReason),
}
