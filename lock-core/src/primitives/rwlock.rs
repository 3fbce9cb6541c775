//! Read-write locks: a reader is a [`HoldKind::Read`] hold, a writer a
//! [`HoldKind::Write`] hold, each with every guarantee of a lock guard. The queue is
//! FIFO: a reader waits only for the writers before it, a writer for everyone before it,
//! so a stream of readers never starves a writer. An upgradeable reader
//! ([`HoldKind::Upgradeable`]) holds beside readers, one at a time, and becomes the
//! writer without letting another writer in between.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::ext::waited;
use crate::kind::{Amendment, HoldKind};
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::occupancy::Occupancy;
use crate::options::AcquireOptions;

use super::{acquire_kind, checked_name, hold_guard};

/// The read-write lock `name` on a lock service: readers hold together, a writer alone.
///
/// ZooKeeper keeps Curator `InterProcessReadWriteLock`'s layout, so Curator and distlock
/// share one lock; etcd and Redis keep their own (each backend's README).
#[derive(Clone)]
pub struct RwLock {
    lock: Arc<dyn DistributedLock>,
    name: LockName,
}

impl RwLock {
    /// The read-write lock `name` on `lock`.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name;
    /// [`Error::Unsupported`](crate::Error::Unsupported) for a lock service without
    /// read-write locks.
    pub fn new(lock: Arc<dyn DistributedLock>, name: &str) -> Result<Self> {
        let name = checked_name(&*lock, name, |c| c.rwlock, "read-write locks")?;
        Ok(RwLock { lock, name })
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Waits for the read side (behind the writers queued before it).
    ///
    /// # Errors
    /// As [`RwLock::read_with`].
    pub async fn read(&self) -> Result<ReadGuard> {
        let guard = self.read_with(&AcquireOptions::forever()).await?;
        waited(guard, &self.name)
    }

    /// One attempt at the read side: `Ok(None)` when a writer holds or waits.
    ///
    /// # Errors
    /// As [`RwLock::read_with`].
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        self.read_with(&AcquireOptions::try_once()).await
    }

    /// Waits at most `timeout` for the read side.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when it did not come in time; as
    /// [`RwLock::read_with`].
    pub async fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard> {
        let guard = self.read_with(&AcquireOptions::timeout(timeout)).await?;
        waited(guard, &self.name)
    }

    /// Takes the read side, as `options.wait` says (`Ok(None)`: a
    /// [`Wait::Try`](crate::Wait::Try) found a writer holding or waiting).
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`].
    pub async fn read_with(&self, options: &AcquireOptions) -> Result<Option<ReadGuard>> {
        let guard = acquire_kind(&self.lock, &self.name, HoldKind::Read, options).await?;
        Ok(guard.map(ReadGuard))
    }

    /// Waits for the write side (behind everyone queued before it).
    ///
    /// # Errors
    /// As [`RwLock::write_with`].
    pub async fn write(&self) -> Result<WriteGuard> {
        let guard = self.write_with(&AcquireOptions::forever()).await?;
        waited(guard, &self.name)
    }

    /// One attempt at the write side: `Ok(None)` when anyone holds or waits.
    ///
    /// # Errors
    /// As [`RwLock::write_with`].
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.write_with(&AcquireOptions::try_once()).await
    }

    /// Waits at most `timeout` for the write side.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when it did not come in time; as
    /// [`RwLock::write_with`].
    pub async fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard> {
        let guard = self.write_with(&AcquireOptions::timeout(timeout)).await?;
        waited(guard, &self.name)
    }

    /// Takes the write side, as `options.wait` says (`Ok(None)`: a
    /// [`Wait::Try`](crate::Wait::Try) found anyone holding or waiting).
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`].
    pub async fn write_with(&self, options: &AcquireOptions) -> Result<Option<WriteGuard>> {
        let guard = acquire_kind(&self.lock, &self.name, HoldKind::Write, options).await?;
        Ok(guard.map(WriteGuard))
    }

    /// Waits for the upgradeable read side (behind the writers and the upgradeable
    /// reader queued before it).
    ///
    /// # Errors
    /// As [`RwLock::upgradeable_read_with`].
    pub async fn upgradeable_read(&self) -> Result<UpgradeableReadGuard> {
        let guard = self
            .upgradeable_read_with(&AcquireOptions::forever())
            .await?;
        waited(guard, &self.name)
    }

    /// One attempt at the upgradeable read side: `Ok(None)` when a writer or an
    /// upgradeable reader holds or waits.
    ///
    /// # Errors
    /// As [`RwLock::upgradeable_read_with`].
    pub async fn try_upgradeable_read(&self) -> Result<Option<UpgradeableReadGuard>> {
        self.upgradeable_read_with(&AcquireOptions::try_once())
            .await
    }

    /// Waits at most `timeout` for the upgradeable read side.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when it did not come in time; as
    /// [`RwLock::upgradeable_read_with`].
    pub async fn upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<UpgradeableReadGuard> {
        let guard = self
            .upgradeable_read_with(&AcquireOptions::timeout(timeout))
            .await?;
        waited(guard, &self.name)
    }

    /// Takes the upgradeable read side, as `options.wait` says (`Ok(None)`: a
    /// [`Wait::Try`](crate::Wait::Try) found a writer or an upgradeable reader holding or
    /// waiting).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a lock service without
    /// upgradeable readers ([`Capabilities::upgradeable`](crate::Capabilities)); as
    /// [`DistributedLock::acquire`].
    pub async fn upgradeable_read_with(
        &self,
        options: &AcquireOptions,
    ) -> Result<Option<UpgradeableReadGuard>> {
        let guard = acquire_kind(&self.lock, &self.name, HoldKind::Upgradeable, options).await?;
        Ok(guard.map(UpgradeableReadGuard))
    }

    /// Who reads, who writes and who waits, as the server shows it now
    /// ([`Participant::kind`](crate::Participant::kind) tells readers from writers).
    ///
    /// # Errors
    /// As [`DistributedLock::inspect`].
    pub async fn occupancy(&self) -> Result<Occupancy> {
        self.lock.inspect(&self.name).await
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("lock", &format_args!("{}", self.lock))
            .field("name", &self.name)
            .finish()
    }
}

hold_guard!(
    /// The read side of a [`RwLock`], held beside other readers and no writer.
    ReadGuard
);

hold_guard!(
    /// The write side of a [`RwLock`], held alone.
    WriteGuard
);

hold_guard!(
    /// The upgradeable read side of a [`RwLock`]: held beside readers, beside no writer
    /// and no other upgradeable reader; [`UpgradeableReadGuard::upgrade`] makes it the
    /// writer.
    UpgradeableReadGuard
);

impl UpgradeableReadGuard {
    /// Turns this upgradeable reader into the writer in its place in the queue, with no
    /// writer let in between: from the first step on, readers and writers queued after it
    /// wait; it returns once the readers that held beside it have left. The fencing
    /// token and lease stay: the token is above every earlier writer's and below every
    /// later writer's, as writers are granted in queue order and none beside it.
    ///
    /// # Cancellation
    /// The guard moves into the upgrade: dropping the future (a timeout around it)
    /// drops the guard, so the hold, upgraded or not, is released in the background as
    /// any dropped guard is, and the readers and writers behind it go on.
    ///
    /// # Errors
    /// [`Error::Lost`](crate::Error::Lost) if the hold is no longer ours (also while it
    /// waits); connection errors, after which it may or may not be upgraded. Either way
    /// the guard is dropped, so the hold is released in the background.
    pub async fn upgrade(self) -> Result<WriteGuard> {
        self.0.amend(Amendment::Upgrade).await?;
        Ok(WriteGuard(self.0))
    }
}

impl WriteGuard {
    /// Turns this writer into a reader in its place in the queue, with no moment in
    /// which it holds neither: the readers queued behind it may then be granted, writers
    /// still wait. The fencing token and lease stay.
    ///
    /// # Errors
    /// [`Error::Lost`](crate::Error::Lost) if the hold is no longer ours; connection
    /// errors, after which it may or may not be downgraded. Either way the guard is
    /// dropped, so the hold is released in the background.
    pub async fn downgrade(self) -> Result<ReadGuard> {
        self.0.amend(Amendment::Downgrade).await?;
        Ok(ReadGuard(self.0))
    }
}
