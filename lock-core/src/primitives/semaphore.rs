//! Semaphores: a permit is a [`HoldKind::Permit`] hold, so it has every guarantee of a
//! lock guard (its own lease and fencing token, renewal, Held / Suspect / Lost,
//! cancellation-safe acquire, drop-release). Waiters are granted in arrival order.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ext::waited;
use crate::kind::HoldKind;
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::occupancy::Occupancy;
use crate::options::AcquireOptions;

use super::{acquire_kind, checked_name, hold_guard};

/// The semaphore `name` of `permits` permits on a lock service: at most `permits`
/// holders at a time, across every process that uses the name.
///
/// Every participant must give the same `permits`: an acquire that finds the name in
/// use with another number fails with [`Error::Conflict`] instead of over-granting.
/// ZooKeeper keeps Curator `InterProcessSemaphoreV2`'s layout, so Curator and distlock
/// share one semaphore; etcd and Redis keep their own (each backend's README).
#[derive(Clone)]
pub struct Semaphore {
    lock: Arc<dyn DistributedLock>,
    name: LockName,
    permits: u32,
}

impl Semaphore {
    /// The semaphore `name` of `permits` permits on `lock`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidConfig`] for zero permits;
    /// [`Error::Unsupported`] for a lock service without semaphores.
    pub fn new(lock: Arc<dyn DistributedLock>, name: &str, permits: u32) -> Result<Self> {
        let name = checked_name(&*lock, name, |c| c.semaphore, "semaphores")?;
        if permits == 0 {
            return Err(Error::config("a semaphore needs at least one permit"));
        }
        Ok(Semaphore {
            lock,
            name,
            permits,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Its number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Waits for a permit. Dropping the future withdraws the request, wherever it was.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_with`].
    pub async fn acquire(&self) -> Result<Permit> {
        let permit = self.acquire_with(&AcquireOptions::forever()).await?;
        waited(permit, &self.name)
    }

    /// One attempt: `Ok(None)` when every permit is taken or others wait before it.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_with`].
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.acquire_with(&AcquireOptions::try_once()).await
    }

    /// Waits at most `timeout` for a permit.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when none came in time; as
    /// [`Semaphore::acquire_with`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        let permit = self.acquire_with(&AcquireOptions::timeout(timeout)).await?;
        waited(permit, &self.name)
    }

    /// Takes a permit, as `options.wait` says (`Ok(None)`: a
    /// [`Wait::Try`](crate::Wait::Try) found every permit taken, or waiters before it).
    /// Dropping the future withdraws the request, wherever it was.
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`]; [`Error::Conflict`] when the name is in use with
    /// another number of permits (or as another kind of lock); [`Error::InvalidConfig`]
    /// for a reentrant acquire (`options.owner` set).
    pub async fn acquire_with(&self, options: &AcquireOptions) -> Result<Option<Permit>> {
        let kind = HoldKind::Permit {
            permits: self.permits,
        };
        let guard = acquire_kind(&self.lock, &self.name, kind, options).await?;
        Ok(guard.map(Permit))
    }

    /// Who holds a permit and who waits, as the server shows it now.
    ///
    /// # Errors
    /// As [`DistributedLock::inspect`].
    pub async fn occupancy(&self) -> Result<Occupancy> {
        self.lock.inspect(&self.name).await
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("lock", &format_args!("{}", self.lock))
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish()
    }
}

hold_guard!(
    /// One permit of a [`Semaphore`]: a lock guard with its own lease and fencing token.
    /// Dropping it gives the permit back in the background.
    Permit
);
