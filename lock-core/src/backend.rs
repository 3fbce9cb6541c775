//! The protocol half that each backend implements. Everything that is the same for
//! every backend (watchdog timing, lost-state machine, validity deadline, reentrancy,
//! drop-release, scoped run) lives in [`crate::raw::backend::LeaseClient`], which turns a [`Backend`]
//! into a [`crate::DistributedLock`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::changes::ChangeFeed;
use crate::error::Result;
use crate::kind::{Amendment, HoldKind, SemaphoreResize};
use crate::lock::OperatorCall;
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::state::LostReason;
use crate::token::{FencingToken, OwnerToken};

/// What an amendment found on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amended {
    /// The hold was ours and is amended.
    Done,
    /// The hold was already gone or owned by someone else; nothing was touched.
    NotOwner(LostReason),
    /// The hold is ours and amended as far as it can be now; the rest waits for others
    /// (an [`Amendment::Upgrade`] whose readers still hold). The caller repeats the
    /// amendment when the name changes.
    Pending,
}

/// One acquisition asked of a backend.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    /// The lock name.
    pub name: &'a LockName,
    /// The owner token of this attempt. Every attempt of an acquisition (a retry after
    /// a failed attempt included) has a fresh one, so cleanup keyed on the token of a
    /// failed attempt can never remove what a later attempt takes.
    pub token: &'a OwnerToken,
    /// The lease to ask for.
    pub ttl: Duration,
    /// `false`: one attempt; `true`: wait until acquired. The caller enforces any
    /// timeout by dropping the future.
    pub wait: bool,
    /// The fencing token granted must be at least this: `max(counter + 1, floor)`, and
    /// `floor` itself where no counter exists yet (never a seed above it). Set only by the
    /// dual lock, on backends whose [`Capabilities::fence_at_least`] is true; others
    /// ignore it.
    pub fence_at_least: Option<FencingToken>,
    /// The kind of hold.
    pub kind: &'a HoldKind,
}

/// A successful acquisition.
#[derive(Debug)]
pub struct Acquired<H> {
    /// Backend data needed to renew and release this hold.
    pub hold: H,
    /// The fencing token of this hold.
    pub fencing_token: FencingToken,
    /// When the request that won the lock was sent (before sending it), or for a hold
    /// the server handed over without a request of its own (a grant on release), an
    /// instant before the grant that the backend can prove.
    pub requested_at: Instant,
    /// How long the server guarantees the hold from `requested_at`: the TTL, or less for a
    /// hand-over whose first lease is short (the first renewal comes a third of the way
    /// into it and extends the hold to the TTL).
    pub lease: Duration,
    /// The session epoch the hold belongs to (see [`SessionStatus`]); 0 when the
    /// backend has no sessions.
    pub session: u64,
}

/// One hold to renew, with the lease to ask for.
#[derive(Debug, Clone, Copy)]
pub struct RenewItem<'a, H> {
    /// The hold.
    pub hold: &'a H,
    /// The lease to ask for.
    pub ttl: Duration,
}

/// What a renewal found for one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Still ours; the server guarantees it for `lease` from when the request was sent.
    Renewed {
        /// The guaranteed lease.
        lease: Duration,
    },
    /// Not ours any more.
    Lost(LostReason),
    /// This hold could not be decided now (e.g. too few RedLock servers answered for it):
    /// it turns Suspect and is retried soon, while the other holds of the batch keep
    /// their own outcomes.
    Undecided,
}

/// What a release found on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendRelease {
    /// The hold was ours and is removed.
    Released,
    /// The hold was already gone or owned by someone else; nothing was touched.
    NotOwner(LostReason),
}

/// Health of a backend session (ZooKeeper session, etcd lease, connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStatus {
    /// Increases each time a new session replaces an expired one.
    pub epoch: u64,
    /// The health of session `epoch`.
    pub health: SessionHealth,
}

impl SessionStatus {
    /// Whether the session of epoch `epoch` has ended, and every hold of it with it: a
    /// newer session replaced it, or it is `epoch` and expired.
    pub fn has_ended(&self, epoch: u64) -> bool {
        self.epoch > epoch || (self.epoch == epoch && self.health == SessionHealth::Expired)
    }
}

/// See [`SessionStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionHealth {
    /// Connected and the session is valid.
    Connected,
    /// Disconnected; the session may still be valid on the server.
    Suspended,
    /// The session is gone on the server: every hold of this epoch or older is lost.
    Expired,
}

/// The protocol of one backend client.
///
/// # Contract
/// - `acquire` is cancellation-safe: when its future is dropped at any await point,
///   anything it queued or won on the server is removed in a background task.
/// - Every network call has a deadline.
/// - `renew` and `release` compare the owner token (or its equivalent) atomically on
///   the server: they never touch a hold that is not this acquisition's.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + fmt::Display + 'static {
    /// Backend data of one hold (key and token, node path, key and revision).
    type Hold: Send + Sync + fmt::Debug + 'static;

    /// What this backend offers.
    fn capabilities(&self) -> Capabilities;

    /// Acquires `request.name`, once or waiting (see [`AcquireRequest::wait`]).
    /// `Ok(None)` only for a single attempt that found the lock held.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<Self::Hold>>>;

    /// Renews `items` in as few requests as the backend allows; one outcome per item,
    /// in order. `Err` means the renewal could not be done (the holds become Suspect).
    async fn renew(&self, items: &[RenewItem<'_, Self::Hold>]) -> Result<Vec<RenewOutcome>>;

    /// The renewal group of `hold`. The watchdog renews the holds of each group with
    /// `renew` calls of their own, one in flight per group, each decided as soon as it
    /// answers: a group whose server is slow or silent delays only its own holds. A
    /// backend whose holds live on independent servers (the shards of a cluster) puts the
    /// holds of each server in a group of their own; the default puts every hold in one
    /// group, renewed by one call.
    fn renewal_group(&self, hold: &Self::Hold) -> u64 {
        let _ = hold;
        0
    }

    /// Releases `hold` if it is still this acquisition's.
    async fn release(&self, hold: &Self::Hold) -> Result<BackendRelease>;

    /// Why `hold` is lost when its validity deadline passed without a renewal: plain
    /// [`LostReason::Expired`] unless the backend can say more (a dual lock names the side
    /// that could not be renewed).
    fn expired_reason(&self, hold: &Self::Hold) -> LostReason {
        let _ = hold;
        LostReason::Expired
    }

    /// Who holds and who waits for `name` right now, as the server shows it.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) for a backend that cannot tell
    /// (the default); connection errors.
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        Err(OperatorCall::Inspect(name).unsupported(self.capabilities().backend))
    }

    /// The names under `prefix` (a prefix of the lock name, `""` for all) that have a
    /// holder right now, as the server shows them, sorted.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) for a backend that cannot tell
    /// (the default); connection errors.
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        Err(OperatorCall::List(prefix).unsupported(self.capabilities().backend))
    }

    /// Removes the current hold of `name` on the server, whoever holds it, and returns
    /// the holder it removed (`None` when nobody held it). The next waiter is granted the
    /// lock as after a release. The removed holder's renewal (or release) finds
    /// [`LostReason::Broken`]: the backend leaves a short-lived mark naming the broken
    /// owner token beside the lock, where its layout allows one.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) for a backend that cannot
    /// (the default); connection errors, after which the hold may or may not be removed.
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        Err(OperatorCall::Break(name).unsupported(self.capabilities().backend))
    }

    /// Rewrites every hold and request of the semaphore `name` as
    /// [`SemaphoreResize::rewrite`] says, all in one atomic write (nothing on an idle
    /// name), so that the grant rule ([`HoldKind::granted_behind`]) counts with the new
    /// number from then on. See
    /// [`DistributedLock::resize_semaphore`](crate::DistributedLock::resize_semaphore).
    ///
    /// # Errors
    /// [`Error::Conflict`](crate::Error::Conflict) as [`SemaphoreResize::rewrite`];
    /// [`Error::Unsupported`](crate::Error::Unsupported) where the layout cannot (the
    /// default), saying why; connection errors.
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        let _ = resize;
        Err(OperatorCall::Resize(name).unsupported(self.capabilities().backend))
    }

    /// Amends `hold` as `amendment` says, if it is still this acquisition's (an
    /// owner-checked write, like `release`).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) for an amendment the backend
    /// cannot make (the default: none); connection errors, after which the amendment may
    /// or may not be made.
    async fn amend(&self, hold: &Self::Hold, amendment: Amendment<'_>) -> Result<Amended> {
        let _ = hold;
        Err(amendment.unsupported(self.capabilities().backend))
    }

    /// A feed of changes to `name` (a grant, a release, an expiry, a proclaim), pushed by
    /// the server, from now on. It may fire for nothing and may miss changes across a
    /// reconnect: its readers re-read at least every `recheck`. Default: a feed that never
    /// fires (readers then only re-read).
    ///
    /// # Errors
    /// Connection errors of subscribing.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let _ = name;
        Ok(ChangeFeed::never())
    }

    /// Session health changes, for backends whose holds live and die with a session.
    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        None
    }

    /// Ends the client, once the lease client has released its holds (see
    /// [`DistributedLock::close`](crate::DistributedLock::close)): waits, at most the
    /// request timeout, for the backend's own background cleanups (its
    /// [`Background`](crate::raw::plumbing::Background)), then ends its session or revokes its lease
    /// so that nothing of the client outlives it. Default: nothing to do.
    ///
    /// # Errors
    /// Connection errors of ending the session; the server-side expiry ends it then.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}
