//! One side of a dual lock on the acquire path: the old side's hold while the new side
//! is acquired, what acquiring the new side came to, and the release of one side's hold,
//! finished in the background when dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{Acquired, SessionStatus};
use crate::erased::{AnyBackend, AnyHold};
use crate::error::Error;
use crate::lease::{release_patiently, validity_deadline, ServerEnd};
use crate::plumbing::{Cleanup, CleanupOnDrop};

/// The old side's hold while the new side is being acquired.
pub(super) struct OldHold {
    pub(super) release: CleanupOnDrop<ReleaseSide>,
    pub(super) session: u64,
    pub(super) requested_at: Instant,
    pub(super) lease: Duration,
}

impl OldHold {
    pub(super) fn valid_until(&self) -> Instant {
        validity_deadline(self.requested_at, self.lease)
    }

    /// Records a renewal sent at `sent` that granted `lease` (for TTL `ttl`).
    pub(super) fn renewed(&mut self, sent: Instant, lease: Duration, ttl: Duration) {
        (self.requested_at, self.lease) = (sent, lease);
        self.release.state_mut().end = ServerEnd::new(self.session, self.valid_until(), ttl);
    }
}

/// What acquiring the new side came to.
pub(super) enum NewSide {
    Won(Acquired<AnyHold>),
    /// Granted, but the old side's lease or session ran out meanwhile.
    OldLapsed(Acquired<AnyHold>),
    /// A single attempt found it held.
    Refused,
    /// The old side was lost while waiting (found gone, or its session ended).
    OldLost,
}

/// Releases one side's hold on an acquire path: once now, and in the background when
/// dropped before that release, or after it failed in a way worth retrying; the background
/// release tries again while the hold may still exist on its side ([`release_patiently`]):
/// a side whose holds live with a session (ZooKeeper, etcd) keeps one for the session's
/// life, ahead of every other client of the name.
pub(super) struct ReleaseSide {
    pub(super) backend: Arc<dyn AnyBackend>,
    pub(super) hold: Option<AnyHold>,
    /// When the hold ends on its side by itself.
    pub(super) end: ServerEnd,
    /// The side's session status, where it has sessions.
    pub(super) session: Option<watch::Receiver<SessionStatus>>,
}

impl ReleaseSide {
    /// Releases the hold once; keeps it, for the background release, when that failed in
    /// a way worth retrying.
    pub(super) async fn release(&mut self) {
        let Some(hold) = &self.hold else {
            return;
        };
        match self.backend.release(hold).await {
            Err(err) if err.is_retryable() => {
                tracing::debug!(backend = %self.backend, error = %err,
                    "could not release one side of a dual lock yet; retrying in the background");
                return;
            }
            Err(err) => self.failed(&err),
            Ok(_) => {}
        }
        self.hold = None;
    }

    fn failed(&self, err: &Error) {
        tracing::warn!(backend = %self.backend, error = %err,
            "could not release one side of a dual lock; its expiry will");
    }
}

impl Cleanup for ReleaseSide {
    async fn cleanup(mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let session = || self.session.as_ref().map(|status| *status.borrow());
        let release = || self.backend.release(&hold);
        if let Err(err) = release_patiently(self.end, session, release).await {
            self.failed(&err);
        }
    }

    fn is_needed(&self) -> bool {
        self.hold.is_some()
    }
}
