//! [`DistributedLockExt`]: the convenience methods of every lock, and scoped runs (do some
//! work while holding a lock, cancelled when the lock is lost).

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::guard::{LockGuard, LockWatch};
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::options::AcquireOptions;
use crate::state::{LostReason, ReleaseOutcome};
use crate::token::FencingToken;

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
            let guard = self.acquire(&name, &AcquireOptions::forever()).await?;
            waited(guard, &name)
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
            let guard = self
                .acquire(&name, &AcquireOptions::timeout(timeout))
                .await?;
            waited(guard, &name)
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

/// The guard of a wait that cannot come back empty (forever, or with a timeout that fails
/// with [`Error::Timeout`]).
pub(crate) fn waited<G>(got: Option<G>, name: &LockName) -> Result<G> {
    got.ok_or_else(|| unexpected_none(name))
}

fn unexpected_none(name: &LockName) -> Error {
    Error::Protocol {
        backend: "distlock",
        message: format!("waiting acquire of `{name}` ended without a lock"),
        source: None,
    }
}

/// What the work of a scoped run gets to know about its lock.
#[derive(Debug, Clone)]
pub struct LockContext {
    /// The lock name.
    pub name: LockName,
    /// The fencing token to pass to the protected resource.
    pub fencing_token: FencingToken,
    /// The hold's state.
    pub watch: LockWatch,
}

/// How a scoped run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum RunOutcome<T> {
    /// The work finished while the lock was held; then the lock was released.
    Completed {
        /// What the work returned.
        value: T,
        /// What the release found. [`ReleaseOutcome::AlreadyLost`] means the lock ended
        /// after the work's last check but before the release.
        release: ReleaseOutcome,
    },
    /// The lock was lost while the work ran; the work was cancelled.
    Lost {
        /// Why the lock was lost.
        reason: LostReason,
    },
    /// A [`crate::Wait::Try`] found the lock held; the work did not run.
    NotAcquired,
}

impl<T> RunOutcome<T> {
    /// The work's value if it completed.
    pub fn completed(self) -> Option<T> {
        match self {
            RunOutcome::Completed { value, .. } => Some(value),
            _ => None,
        }
    }
}

/// Acquires `name`, runs `work`, releases; cancels `work` if the lock is lost.
pub(crate) async fn run_locked<L, F, Fut, T>(
    lock: &L,
    name: &str,
    options: &AcquireOptions,
    work: F,
) -> Result<RunOutcome<T>>
where
    L: DistributedLock + ?Sized,
    F: FnOnce(LockContext) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    let name = LockName::new(name)?;
    match lock.acquire(&name, options).await? {
        Some(guard) => run_held(guard, work).await,
        None => Ok(RunOutcome::NotAcquired),
    }
}

/// Runs `work` while `guard` holds, then releases; cancels `work` if the hold is lost.
pub(crate) async fn run_held<F, Fut, T>(guard: LockGuard, work: F) -> Result<RunOutcome<T>>
where
    F: FnOnce(LockContext) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    match work_while_held(guard, work, std::future::pending()).await {
        HeldEnd::Done(value, guard) => {
            let release = guard.release().await?;
            Ok(RunOutcome::Completed { value, release })
        }
        HeldEnd::Lost(reason) => Ok(RunOutcome::Lost { reason }),
        HeldEnd::Stopped(_) => unreachable!("a pending stop never resolves"),
    }
}

/// How [`work_while_held`] ended.
pub(crate) enum HeldEnd<T> {
    /// The work returned; the guard is still to be released.
    Done(T, LockGuard),
    /// The hold was lost: the work was dropped, then the guard (an owner-checked
    /// release in the background, safe even if someone else holds the name now).
    Lost(LostReason),
    /// `stop` resolved first: the work was dropped; the guard is still to be released.
    Stopped(LockGuard),
}

/// Runs `work` with `guard`'s context until it returns, the hold is lost (the work is
/// dropped at once) or `stop` resolves (the work is dropped). The select drops every
/// branch's future before its handler runs, so the work is gone before the guard is
/// touched.
pub(crate) async fn work_while_held<F, Fut, T>(
    guard: LockGuard,
    work: F,
    stop: impl Future<Output = ()>,
) -> HeldEnd<T>
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = T>,
{
    let context = LockContext {
        name: guard.name().clone(),
        fencing_token: guard.fencing_token(),
        watch: guard.watch(),
    };
    let lost = guard.lost();
    tokio::select! {
        biased;
        reason = lost => {
            drop(guard);
            HeldEnd::Lost(reason)
        }
        value = work(context) => HeldEnd::Done(value, guard),
        () = stop => HeldEnd::Stopped(guard),
    }
}
