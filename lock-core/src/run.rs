//! Scoped runs: do some work while holding a lock, cancelled when the lock is lost.

use std::future::Future;

use crate::error::Result;
use crate::guard::{LockWatch, LostReason, ReleaseOutcome};
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::options::AcquireOptions;
use crate::token::FencingToken;

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
    let Some(guard) = lock.acquire(&name, options).await? else {
        return Ok(RunOutcome::NotAcquired);
    };
    let context = LockContext {
        name,
        fencing_token: guard.fencing_token(),
        watch: guard.watch(),
    };
    let lost = guard.lost();
    tokio::select! {
        biased;
        reason = lost => {
            // The release is an owner-checked delete, safe even if someone else holds it now.
            drop(guard);
            Ok(RunOutcome::Lost { reason })
        }
        value = work(context) => {
            let release = guard.release().await?;
            Ok(RunOutcome::Completed { value, release })
        }
    }
}
