//! Plumbing every part of the crate shares, written once so that no backend keeps a copy:
//! poison-free mutexes, a tracked set of background tasks, backoff, cleanups that run
//! when their owner is dropped, and configuration files read off the runtime.

mod background;
mod backoff;
mod cleanup;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};

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

/// The contents of `path`, the file of configuration option `what` (a CA, a certificate, a
/// key), read on a blocking thread; an [`Error::InvalidConfig`] naming both when it cannot
/// be read.
///
/// # Errors
/// [`Error::InvalidConfig`] when the file cannot be read.
pub async fn read_config_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    let owned = path.to_owned();
    let read = tokio::task::spawn_blocking(move || std::fs::read(owned))
        .await
        .map_err(|err| Error::InvalidConfig {
            message: format!("reading {what} {} failed", path.display()),
            source: Some(Box::new(err)),
        })?;
    read.map_err(|err| Error::InvalidConfig {
        message: format!("cannot read {what} {}", path.display()),
        source: Some(Box::new(err)),
    })
}
