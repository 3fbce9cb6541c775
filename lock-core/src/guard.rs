//! The guard of a held lock and the watch of its state.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Result;
use crate::kind::Amendment;
use crate::name::LockName;
use crate::plumbing::lock_unpoisoned;
use crate::state::{LockState, LostReason, ReleaseOutcome};
use crate::token::{FencingToken, OwnerToken};

/// Observes the state of one hold: poll it, or await a change or the loss.
#[derive(Debug, Clone)]
pub struct LockWatch {
    state: watch::Receiver<LockState>,
    valid_until: Arc<AtomicInstant>,
}

impl LockWatch {
    /// The current state.
    pub fn state(&self) -> LockState {
        *self.state.borrow()
    }

    /// Until when the hold is guaranteed, on the monotonic clock.
    pub fn valid_until(&self) -> Instant {
        self.valid_until.load()
    }

    /// Waits for the next state change and returns the new state.
    pub async fn changed(&mut self) -> LockState {
        if self.state.changed().await.is_err() {
            // The hold's machinery is gone: nothing renews it any more.
            return LockState::Lost(self.lost_reason_or(LostReason::Expired));
        }
        *self.state.borrow_and_update()
    }

    /// Resolves when the hold is lost, with the reason.
    pub async fn lost(&mut self) -> LostReason {
        let seen = match self.state.wait_for(|s| s.is_lost()).await {
            Ok(state) => Some(*state),
            Err(_) => None,
        };
        match seen {
            Some(LockState::Lost(reason)) => reason,
            _ => self.lost_reason_or(LostReason::Expired),
        }
    }

    fn lost_reason_or(&self, fallback: LostReason) -> LostReason {
        match *self.state.borrow() {
            LockState::Lost(reason) => reason,
            _ => fallback,
        }
    }
}

/// An [`Instant`] that can be shared and updated without a lock.
#[derive(Debug)]
pub(crate) struct AtomicInstant {
    base: Instant,
    nanos: AtomicU64,
}

impl AtomicInstant {
    pub(crate) fn new(base: Instant, value: Instant) -> Self {
        let this = AtomicInstant {
            base,
            nanos: AtomicU64::new(0),
        };
        this.store(value);
        this
    }

    pub(crate) fn load(&self) -> Instant {
        self.base + Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    pub(crate) fn store(&self, value: Instant) {
        let nanos = u64::try_from(value.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX);
        self.nanos.store(nanos, Ordering::Release);
    }
}

/// What a hold shares between its guard(s), its watches and the lease machinery.
#[derive(Debug)]
pub(crate) struct HoldInfo {
    pub(crate) id: u64,
    pub(crate) name: LockName,
    pub(crate) token: OwnerToken,
    pub(crate) fencing_token: FencingToken,
    pub(crate) acquired_at: Instant,
    pub(crate) valid_until: Arc<AtomicInstant>,
    pub(crate) state: Mutex<StateSlot>,
    /// Told of the transition to Lost (the hold's metrics).
    pub(crate) observer: Arc<dyn HoldObserver>,
}

/// The state of a hold, and the channel of its watches. The channel is made when the
/// first watch is taken and dropped when no watch is left: most holds are released
/// unwatched, and then they neither allocate one nor notify anybody.
#[derive(Debug)]
pub(crate) struct StateSlot {
    current: LockState,
    watchers: Option<watch::Sender<LockState>>,
}

impl StateSlot {
    pub(crate) fn new(current: LockState) -> Self {
        StateSlot {
            current,
            watchers: None,
        }
    }
}

impl HoldInfo {
    pub(crate) fn state(&self) -> LockState {
        lock_unpoisoned(&self.state).current
    }

    /// Moves to `next` unless already lost (Lost is terminal). Returns whether it changed.
    pub(crate) fn transition(&self, next: LockState) -> bool {
        let mut slot = lock_unpoisoned(&self.state);
        if slot.current.is_lost() || slot.current == next {
            return false;
        }
        slot.current = next;
        if let Some(watchers) = &slot.watchers {
            if watchers.receiver_count() == 0 {
                slot.watchers = None;
            } else {
                watchers.send_replace(next);
            }
        }
        drop(slot);
        if let LockState::Lost(reason) = next {
            self.observer.ended(reason);
        }
        true
    }

    pub(crate) fn watch(&self) -> LockWatch {
        let mut slot = lock_unpoisoned(&self.state);
        let current = slot.current;
        let state = slot
            .watchers
            .get_or_insert_with(|| watch::Sender::new(current))
            .subscribe();
        LockWatch {
            state,
            valid_until: Arc::clone(&self.valid_until),
        }
    }
}

/// Told when a hold ends, once per transition to Lost. The metrics observe holds this
/// way, so that the guard does not know them.
pub(crate) trait HoldObserver: Send + Sync + fmt::Debug {
    fn ended(&self, reason: LostReason);
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The lease machinery as seen by a guard.
pub(crate) trait HoldOps: Send + Sync + fmt::Debug {
    fn extend<'a>(
        &'a self,
        hold: &'a HoldInfo,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Instant>>;
    fn release(&self, id: u64) -> BoxFuture<'_, Result<ReleaseOutcome>>;
    /// Amends the hold on the server (see [`Amendment`]).
    fn amend<'a>(
        &'a self,
        hold: &'a HoldInfo,
        amendment: Amendment<'a>,
    ) -> BoxFuture<'a, Result<()>>;
    /// Never blocks: hands the release to the background.
    fn release_in_background(&self, id: u64);
}

/// A held lock.
///
/// Carries the lock name, this acquisition's owner token, its [`FencingToken`], its
/// validity deadline and its [`LockState`]. Pass the fencing token to the protected
/// resource with every write; watch [`LockGuard::lost`] to stop work when the lock is
/// lost.
///
/// # Release
/// [`LockGuard::release`] consumes the guard and reports whether the lock was still
/// held. Release is an atomic compare-and-delete on the server: it never removes a
/// successor's lock.
///
/// # Drop
/// Dropping a guard without releasing it never blocks and never panics: the release
/// is handed to a background task of the client, which removes the hold promptly.
/// If that task cannot run (the runtime is shutting down, the connection is gone),
/// the server-side TTL frees the lock at the latest.
#[must_use = "dropping a guard releases the lock in the background"]
pub struct LockGuard {
    info: Arc<HoldInfo>,
    ops: Arc<dyn HoldOps>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(info: Arc<HoldInfo>, ops: Arc<dyn HoldOps>) -> Self {
        LockGuard {
            info,
            ops,
            released: false,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.info.name
    }

    /// This acquisition's owner token.
    pub fn owner_token(&self) -> &OwnerToken {
        &self.info.token
    }

    /// The fencing token: strictly greater than any earlier holder's of this name.
    pub fn fencing_token(&self) -> FencingToken {
        self.info.fencing_token
    }

    /// When the lock was acquired.
    pub fn acquired_at(&self) -> Instant {
        self.info.acquired_at
    }

    /// Until when the hold is guaranteed, on the monotonic clock: measured from before
    /// the winning request was sent, minus a drift margin. Renewals move it forward.
    ///
    /// A lock handed over by its last holder's release can start on a first lease
    /// shorter than the TTL (a second or two on Redis), renewed a third of the way into
    /// it. Work planned against this deadline can [`LockGuard::extend`] first.
    pub fn valid_until(&self) -> Instant {
        self.info.valid_until.load()
    }

    /// The current state.
    pub fn state(&self) -> LockState {
        self.info.state()
    }

    /// Whether the state is [`LockState::Held`] and the deadline has not passed.
    pub fn is_held(&self) -> bool {
        self.state() == LockState::Held && Instant::now() < self.valid_until()
    }

    /// A watch of this hold's state, which outlives the guard.
    pub fn watch(&self) -> LockWatch {
        self.info.watch()
    }

    /// Resolves when the lock is lost, with the reason.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut watch = self.watch();
        async move { watch.lost().await }
    }

    /// Renews the hold now for its TTL and returns the new validity deadline.
    ///
    /// # Errors
    /// [`crate::Error::Lost`] if the lock is no longer held; [`crate::Error::Closed`] once
    /// its client is closed; connection errors if the renewal could not be made (the state
    /// becomes [`LockState::Suspect`]).
    pub async fn extend(&self) -> Result<Instant> {
        self.ops.extend(&self.info, None).await
    }

    /// Renews the hold now for `ttl` (backends with a session-wide lease reject a
    /// different value) and returns the new validity deadline.
    ///
    /// With automatic renewal, the watchdog plans its next renewal from this lease
    /// (at a third of it) and renews for the hold's own TTL again. Renewals of one hold
    /// never overlap: an extension waits for a renewal already in flight, so the
    /// deadline the guard keeps is always the one the server applied last.
    ///
    /// # Errors
    /// As [`LockGuard::extend`], and [`crate::Error::Unsupported`] for a TTL the
    /// backend cannot honour.
    pub async fn extend_for(&self, ttl: Duration) -> Result<Instant> {
        self.ops.extend(&self.info, Some(ttl)).await
    }

    /// Amends this hold on the server, if it is still ours (see
    /// [`crate::Leadership::proclaim`], [`crate::WriteGuard::downgrade`]).
    pub(crate) async fn amend(&self, amendment: Amendment<'_>) -> Result<()> {
        self.ops.amend(&self.info, amendment).await
    }

    /// Releases the lock and reports what happened.
    ///
    /// # Cancellation
    /// Once called, the release completes in the background even if this future is
    /// dropped.
    ///
    /// # Errors
    /// Connection errors if the server could not be told; the server-side TTL then
    /// frees the lock.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.released = true;
        self.ops.release(self.info.id).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            self.ops.release_in_background(self.info.id);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.info.name)
            .field("fencing_token", &self.info.fencing_token)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}
