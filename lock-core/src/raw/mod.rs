//! The backend-author kit: what a crate needs to add a backend, and nothing a lock user
//! touches.
//!
//! A backend implements [`Backend`] (the protocol half: acquire, renew, release) and
//! [`Connect`] (its URL schemes, its configuration and how it opens a connection);
//! [`LeaseClient`] adds everything that is the same for every backend and turns it into a
//! [`DistributedLock`](crate::DistributedLock). [`register`] makes its schemes known to
//! [`connect`](crate::connect). The rest is shared plumbing, written once here so that no
//! backend keeps a copy: [`lock_unpoisoned`], [`Cleanup`]/[`CleanupOnDrop`], [`Background`], [`Backoff`],
//! [`Error::no_answer`](crate::Error::no_answer).

mod background;
mod backoff;
mod cleanup;
mod connect;
pub(crate) mod erased;

use std::sync::{Mutex, MutexGuard};

pub use crate::backend::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionHealth,
    SessionStatus,
};
pub use crate::lease::{drift_margin, validity_deadline, LeaseClient};
pub use crate::lock_url::{HostPort, LockUrl};
pub use crate::name::{escape, escape_where, unescape};
pub use crate::options::{duration_text, format_duration, parse_duration};
pub use crate::registry::{registry, ConnectFuture, Connector, Registry};
pub use background::Background;
pub use backoff::Backoff;
pub use cleanup::{Cleanup, CleanupOnDrop};
pub(crate) use connect::{connect_url, open_url};
pub use connect::{register, Connect};

/// Locks `mutex`, taking the data over if a thread panicked while holding it.
///
/// Every mutex of this workspace guards state that a panic elsewhere cannot leave worse
/// than losing the lock service altogether, so poisoning is not propagated.
pub fn lock_unpoisoned<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
