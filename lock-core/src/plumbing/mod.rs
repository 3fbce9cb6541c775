//! Plumbing every part of the crate shares, written once so that no backend keeps a copy:
//! poison-free mutexes, a tracked set of background tasks, backoff, and cleanups that run
//! when their owner is dropped.

mod background;
mod backoff;
mod cleanup;

use std::sync::{Mutex, MutexGuard};

pub use background::Background;
pub use backoff::Backoff;
pub use cleanup::{Cleanup, CleanupOnDrop};

/// Locks `mutex`, taking the data over if a thread panicked while holding it.
///
/// Every mutex of this workspace guards state that a panic elsewhere cannot leave worse
/// than losing the lock service altogether, so poisoning is not propagated.
pub fn lock_unpoisoned<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
