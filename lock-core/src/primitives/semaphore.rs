//! Semaphores: a permit is a [`HoldKind::Permit`] hold, so it has every guarantee of a
//! lock guard (its own lease and fencing token, renewal, Held / Suspect / Lost,
//! cancellation-safe acquire, drop-release). Waiters are granted in arrival order. A hold
//! may carry several permits ([`Semaphore::acquire_many`]): one guard, one lease, one
//! fencing token and one release for all of them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ext::waited;
use crate::kind::{HoldKind, SemaphoreResize};
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
///
/// A request for several permits ([`Semaphore::acquire_many`]) is all or nothing and
/// keeps its place in the queue: while it waits at the head, later requests wait behind
/// it even where they would fit, so a big request is never starved by small ones, and
/// two requests never deadlock. [`Semaphore::resize`] changes the number of permits of
/// a semaphore in use, on the backends whose
/// [`Capabilities::semaphore_resize`](crate::Capabilities::semaphore_resize) say so.
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
        HoldKind::permit(permits).check_count()?;
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
        self.acquire_many(1).await
    }

    /// One attempt: `Ok(None)` when every permit is taken or others wait before it.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_with`].
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.try_acquire_many(1).await
    }

    /// Waits at most `timeout` for a permit.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] when none came in time; as
    /// [`Semaphore::acquire_with`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        self.acquire_many_timeout(1, timeout).await
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
        self.acquire_many_with(1, options).await
    }

    /// Waits for `n` permits, taken together as one hold. Dropping the future withdraws
    /// the request, wherever it was.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_many_with`].
    pub async fn acquire_many(&self, n: u32) -> Result<Permit> {
        let permit = self
            .acquire_many_with(n, &AcquireOptions::forever())
            .await?;
        waited(permit, &self.name)
    }

    /// One attempt at `n` permits: `Ok(None)` when fewer are free or others wait before
    /// it.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_many_with`].
    pub async fn try_acquire_many(&self, n: u32) -> Result<Option<Permit>> {
        self.acquire_many_with(n, &AcquireOptions::try_once()).await
    }

    /// Waits at most `timeout` for `n` permits.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] when they did not come in time; as
    /// [`Semaphore::acquire_many_with`].
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Permit> {
        let permit = self
            .acquire_many_with(n, &AcquireOptions::timeout(timeout))
            .await?;
        waited(permit, &self.name)
    }

    /// Takes `n` permits as one hold (one guard, one lease, one fencing token, one
    /// release), all or nothing, as `options.wait` says. The request keeps its place in
    /// the queue: requests behind it are not granted before it, even where they would fit.
    /// Dropping the future withdraws the request, wherever it was.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `n` = 0 or `n` above the number of permits, and
    /// [`Error::Unsupported`] for `n` > 1 where the backend cannot take several permits in
    /// one hold ([`Capabilities::semaphore_many`](crate::Capabilities::semaphore_many)),
    /// both before any request to the server; as [`Semaphore::acquire_with`].
    pub async fn acquire_many_with(
        &self,
        n: u32,
        options: &AcquireOptions,
    ) -> Result<Option<Permit>> {
        let kind = self.kind(n)?;
        let guard = acquire_kind(&self.lock, &self.name, kind, options).await?;
        Ok(guard.map(Permit))
    }

    /// The kind of a hold of `n` permits of this semaphore.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `n` outside 1 ..= permits.
    fn kind(&self, n: u32) -> Result<HoldKind> {
        let kind = HoldKind::Permit {
            permits: self.permits,
            count: n,
        };
        kind.check_count()?;
        Ok(kind)
    }

    /// Changes the semaphore's number of permits to `permits`, for every participant,
    /// and this handle's acquires from then on, so that at no moment are more permits
    /// held than the old number before the change, nor than the new one after it.
    ///
    /// A growth is one atomic write. A shrink first takes the difference (old - new
    /// permits) for itself in the queue, as [`Semaphore::acquire_many`] would, waiting at
    /// most `timeout`: once granted, no more than the new number are held by others, and
    /// the write that changes the number (its own hold becoming one of all the new
    /// permits) is safe; its release follows. Meanwhile, as any request at the head of
    /// the queue, it holds back the requests behind it.
    ///
    /// Participants that still ask with the old number get [`Error::Conflict`] while the
    /// semaphore is in use. Its number lives with its holders and waiters: once nobody
    /// holds or waits, the next acquirer's number is the semaphore's.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] when a shrink's permits did not come in
    /// time (nothing changed); [`Error::Conflict`] when the semaphore is in use with
    /// another number than this handle's, or a hold or request there takes more than
    /// `permits`; [`Error::InvalidConfig`] for 0; [`Error::Unsupported`] where the
    /// backend's layout cannot change it safely, saying why.
    pub async fn resize(&mut self, permits: u32, timeout: Duration) -> Result<()> {
        HoldKind::permit(permits).check_count()?;
        let (from, to) = (self.permits, permits);
        let capabilities = self.lock.capabilities();
        if !capabilities.semaphore_resize {
            let refused = SemaphoreResize {
                from,
                to,
                reservation: None,
            };
            // The backend's own refusal says why its layout cannot.
            self.lock.resize_semaphore(&self.name, &refused).await?;
            return Err(Error::unsupported(
                capabilities.backend,
                "resizing a semaphore",
            ));
        }
        if from == to {
            return Ok(());
        }
        let reservation = match from.checked_sub(to) {
            Some(difference) => Some(self.acquire_many_timeout(difference, timeout).await?),
            None => None,
        };
        let resize = SemaphoreResize {
            from,
            to,
            reservation: reservation.as_ref().map(|held| held.owner_token()),
        };
        let written = self.lock.resize_semaphore(&self.name, &resize).await;
        // After the write the reservation is a hold of every new permit: given back at once.
        let released = match reservation {
            Some(held) => held.release().await.map(drop),
            None => Ok(()),
        };
        written?;
        self.permits = to;
        released
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
