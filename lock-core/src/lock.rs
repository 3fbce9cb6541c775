//! The `DistributedLock` trait, its extension trait, and forwarding impls.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::name::LockName;
use crate::options::{AcquireOptions, LockOptions, Wait};
use crate::run::{run_locked, LockContext, RunOutcome};

/// A distributed lock service: Redis, ZooKeeper, etcd or the in-memory reference.
///
/// Used as `Arc<dyn DistributedLock>` (see [`crate::connect`]); the convenience methods
/// live in [`DistributedLockExt`].
///
/// # Contract
/// Every implementation honours the rules of the conformance suite: mutual exclusion
/// while a guard is valid; a server-side lease on every hold; atomic owner-checked
/// release and extend; background renewal at TTL/3 unless manual; strictly increasing
/// fencing tokens; a validity deadline on the monotonic clock; a lost signal; typed
/// release; cancellation-safe acquisition; push-driven waiting with a bounded re-check.
///
/// # Cancellation
/// Dropping an acquire future at any await point leaves nothing queued or held on the
/// server: whatever was created is removed in a background task.
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug + fmt::Display {
    /// Acquires `name` as `options` say.
    ///
    /// Returns `Ok(None)` only for [`Wait::Try`] when another owner holds the lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when a [`Wait::Timeout`] runs out; [`Error::InvalidConfig`] or
    /// [`Error::Unsupported`] for options the backend cannot honour; connection and
    /// availability errors from the backend.
    async fn acquire(&self, name: &LockName, options: &AcquireOptions)
        -> Result<Option<LockGuard>>;

    /// What this backend offers.
    fn capabilities(&self) -> Capabilities;

    /// The client-wide defaults.
    fn options(&self) -> &LockOptions;
}

/// Convenience methods for every [`DistributedLock`], `dyn` included.
pub trait DistributedLockExt: DistributedLock {
    /// One attempt: `Ok(None)` if another owner holds `name`.
    fn try_lock(&self, name: &str) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        async move {
            let name = LockName::new(name)?;
            self.acquire(&name, &AcquireOptions::try_once()).await
        }
    }

    /// Waits until `name` is acquired.
    fn lock(&self, name: &str) -> impl Future<Output = Result<LockGuard>> + Send {
        async move {
            let name = LockName::new(name)?;
            self.acquire(&name, &AcquireOptions::forever())
                .await?
                .ok_or_else(|| unexpected_none(&name))
        }
    }

    /// Waits at most `timeout` for `name`.
    fn lock_timeout(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        async move {
            let name = LockName::new(name)?;
            self.acquire(&name, &AcquireOptions::timeout(timeout))
                .await?
                .ok_or_else(|| unexpected_none(&name))
        }
    }

    /// Acquires `name`, runs `work` while holding it, and releases it.
    ///
    /// If the lock is lost while `work` runs, `work` is dropped (cancelled at its next
    /// await point) and the outcome says why. See [`RunOutcome`].
    fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        options: &AcquireOptions,
        work: F,
    ) -> impl Future<Output = Result<RunOutcome<T>>> + Send
    where
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        run_locked(self, name, options, work)
    }
}

impl<L: DistributedLock + ?Sized> DistributedLockExt for L {}

fn unexpected_none(name: &LockName) -> Error {
    Error::Protocol {
        backend: "distlock",
        message: format!("waiting acquire of `{name}` ended without a lock"),
        source: None,
    }
}

macro_rules! forward_impl {
    ($ty:ty) => {
        #[async_trait]
        impl<L: DistributedLock + ?Sized> DistributedLock for $ty {
            async fn acquire(
                &self,
                name: &LockName,
                options: &AcquireOptions,
            ) -> Result<Option<LockGuard>> {
                (**self).acquire(name, options).await
            }

            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }

            fn options(&self) -> &LockOptions {
                (**self).options()
            }
        }
    };
}

forward_impl!(Arc<L>);
forward_impl!(Box<L>);

/// Checks that a wait option is acceptable.
pub(crate) fn check_wait(wait: Wait) -> Result<()> {
    if let Wait::Timeout(timeout) = wait {
        if timeout > crate::options::MAX_DURATION {
            return Err(Error::config(format!(
                "acquire timeout must be at most one year, got {timeout:?}"
            )));
        }
    }
    Ok(())
}
