//! Multi-locks: several names held together, all or nothing. The names are taken one by
//! one in one fixed order (sorted), so two callers asking for overlapping sets never
//! wait for each other in a cycle; each part is an ordinary hold with its own lease and
//! fencing token, and the parts taken before a failure or a cancellation are released.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::ext::waited;
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::options::{AcquireOptions, Wait};
use crate::state::{LockState, LostReason, ReleaseOutcome};
use crate::token::FencingToken;

/// The names `names` of one lock service, acquired together.
#[derive(Clone)]
pub struct MultiLock {
    lock: Arc<dyn DistributedLock>,
    names: Vec<LockName>,
}

impl MultiLock {
    /// The names `names` on `lock` (duplicates count once).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidConfig`] for no names.
    pub fn new<I, S>(lock: Arc<dyn DistributedLock>, names: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut names = names
            .into_iter()
            .map(|name| LockName::new(name.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        if names.is_empty() {
            return Err(Error::config("a multi-lock needs at least one name"));
        }
        names.sort();
        names.dedup();
        Ok(MultiLock { lock, names })
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> &[LockName] {
        &self.names
    }

    /// Waits for every name.
    ///
    /// # Errors
    /// As [`MultiLock::acquire_with`].
    pub async fn acquire(&self) -> Result<MultiGuard> {
        let guard = self.acquire_with(&AcquireOptions::forever()).await?;
        waited(guard, &self.names[0])
    }

    /// One attempt, all or nothing: `Ok(None)` when any name is held.
    ///
    /// # Errors
    /// As [`MultiLock::acquire_with`].
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_with(&AcquireOptions::try_once()).await
    }

    /// Waits at most `timeout` for every name together.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] naming the part not granted in time (the
    /// parts taken are released); as [`MultiLock::acquire_with`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        let guard = self.acquire_with(&AcquireOptions::timeout(timeout)).await?;
        waited(guard, &self.names[0])
    }

    /// Acquires every name, as `options.wait` says for the whole (`Ok(None)`: a
    /// [`Wait::Try`] found one of them held; a [`Wait::Timeout`] bounds all the waits
    /// together). The names are taken in sorted order. On any failure the parts already
    /// taken are released before this returns; when the future is dropped at any point,
    /// they are released in the background.
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`] for the part that failed; [`Error::Timeout`]
    /// names the part that was not granted in time.
    pub async fn acquire_with(&self, options: &AcquireOptions) -> Result<Option<MultiGuard>> {
        let deadline = match options.wait {
            Wait::Timeout(limit) => Some(Instant::now() + limit),
            Wait::Try | Wait::Forever => None,
        };
        let mut parts = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let mut part_options = options.clone();
            if let Some(deadline) = deadline {
                part_options.wait =
                    Wait::Timeout(deadline.saturating_duration_since(Instant::now()));
            }
            // A drop of this future drops `parts`: each guard releases in the background.
            match self.lock.acquire(name, &part_options).await {
                Ok(Some(guard)) => parts.push(guard),
                Ok(None) => {
                    release_parts(parts).await;
                    return Ok(None);
                }
                Err(err) => {
                    release_parts(parts).await;
                    return Err(err);
                }
            }
        }
        Ok(Some(MultiGuard { parts }))
    }
}

/// Releases `parts` together (each release has its own deadlines, and one that fails is
/// left to the background and the server-side TTL): nothing of a failed multi-lock is
/// held once it reports the failure.
async fn release_parts(parts: Vec<LockGuard>) {
    let _ = join_all(parts.into_iter().map(LockGuard::release)).await;
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("lock", &format_args!("{}", self.lock))
            .field("names", &self.names)
            .finish()
    }
}

/// Every part of a [`MultiLock`], held together: held while every part is, lost as soon
/// as any part is. Dropping it releases every part in the background.
#[must_use = "dropping the guard releases every part in the background"]
#[derive(Debug)]
pub struct MultiGuard {
    parts: Vec<LockGuard>,
}

impl MultiGuard {
    /// The part guards, in name order.
    pub fn parts(&self) -> &[LockGuard] {
        &self.parts
    }

    /// Each name with its fencing token, in name order: pass each to the resource that
    /// name protects.
    pub fn fencing_tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.parts
            .iter()
            .map(|part| (part.name().clone(), part.fencing_token()))
            .collect()
    }

    /// The state of the whole: Lost if any part is (the first one's reason), else
    /// Suspect if any part is, else Held.
    pub fn state(&self) -> LockState {
        let states = self.parts.iter().map(LockGuard::state);
        let mut whole = LockState::Held;
        for state in states {
            match state {
                LockState::Lost(_) => return state,
                LockState::Suspect => whole = LockState::Suspect,
                LockState::Held => {}
            }
        }
        whole
    }

    /// Whether every part is Held, before its validity deadline.
    pub fn is_held(&self) -> bool {
        self.parts.iter().all(LockGuard::is_held)
    }

    /// The earliest validity deadline of the parts: the whole is guaranteed until then.
    pub fn valid_until(&self) -> Instant {
        self.parts
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Resolves as soon as any part is lost, with its reason.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let parts: Vec<_> = self
            .parts
            .iter()
            .map(|part| Box::pin(part.lost()))
            .collect();
        async move { select_all(parts).await.0 }
    }

    /// Releases every part, concurrently: `Released` when each was still held, else the
    /// first part's loss.
    ///
    /// # Errors
    /// The first error among the parts; every part is still released (or left to the
    /// background and the server-side TTL).
    pub async fn release(self) -> Result<ReleaseOutcome> {
        let outcomes = join_all(self.parts.into_iter().map(LockGuard::release)).await;
        let mut whole = ReleaseOutcome::Released;
        for outcome in outcomes {
            match outcome? {
                ReleaseOutcome::Released => {}
                lost if whole == ReleaseOutcome::Released => whole = lost,
                _ => {}
            }
        }
        Ok(whole)
    }
}
