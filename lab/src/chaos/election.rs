//! The fault scenarios on leader elections: [`Elected`] turns a deployment into one whose
//! clients campaign instead of locking. A campaign is an acquire of a candidate's hold and
//! its leadership a guard whose fencing token is the term, so every scenario, its workload
//! and its fenced checker apply unchanged: "two holders at once" is then "two leaders at
//! once", and "a token going back" a term going back.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::factory::{Crash, Factory, StartedFactory};
use lock_core::raw::{ChangeFeed, HoldKind};
use lock_core::{
    AcquireOptions, Capabilities, DistributedLock, LockGuard, LockName, LockOptions, Occupancy,
    Participant, Result,
};

use super::topology::{ChaosTarget, Link, ServerControl, Topology};

/// A deployment whose clients campaign for leadership where others take the lock.
pub struct Elected<T> {
    inner: T,
}

impl<T: ChaosTarget> Elected<T> {
    /// `started`'s deployment, its clients campaigning; `None` when it did not start
    /// (a missing server binary, said loudly by the harness).
    pub fn of(started: impl StartedFactory<Factory = T>) -> Option<Self> {
        started.started().map(|inner| Elected { inner })
    }
}

impl<T: ChaosTarget> fmt::Debug for Elected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Elected")
            .field("deployment", &self.inner.label())
            .finish()
    }
}

/// A client that campaigns (with a value naming it) wherever it is asked to acquire.
struct Candidate {
    lock: Arc<dyn DistributedLock>,
    value: Vec<u8>,
}

impl Candidate {
    fn wrap(lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        let value = format!("candidate-{}", uuid::Uuid::new_v4().simple()).into_bytes();
        Arc::new(Candidate { lock, value })
    }
}

impl fmt::Debug for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Candidate")
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "candidate on {}", self.lock)
    }
}

#[async_trait]
impl DistributedLock for Candidate {
    async fn acquire(
        &self,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        let mut options = options.clone();
        options.kind = HoldKind::Candidate {
            value: self.value.clone(),
        };
        self.lock.acquire(name, &options).await
    }

    fn capabilities(&self) -> Capabilities {
        self.lock.capabilities()
    }

    fn options(&self) -> &LockOptions {
        self.lock.options()
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        self.lock.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        self.lock.list(prefix).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        self.lock.force_release(name).await
    }

    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        self.lock.changes(name).await
    }

    async fn close(&self) -> Result<()> {
        self.lock.close().await
    }
}

#[async_trait]
impl<T: ChaosTarget> Factory for Elected<T> {
    fn label(&self) -> String {
        format!("{} election", self.inner.label())
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    fn short_ttl(&self) -> Duration {
        self.inner.short_ttl()
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        Candidate::wrap(self.inner.client(options).await)
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, crash) = self.inner.crashable_client(options).await;
        (Candidate::wrap(client), crash)
    }

    async fn steal(&self, name: &LockName) {
        self.inner.steal(name).await;
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        self.inner.leftovers(names).await
    }
}

#[async_trait]
impl<T: ChaosTarget> ChaosTarget for Elected<T> {
    fn topology(&self) -> Topology {
        self.inner.topology()
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (client, link) = self.inner.linked_client(options).await;
        (Candidate::wrap(client), link)
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.inner.servers()
    }

    async fn leader(&self) -> Option<usize> {
        self.inner.leader().await
    }

    async fn primary(&self, name: &LockName) -> Option<usize> {
        self.inner.primary(name).await
    }

    async fn promoted(&self, name: &LockName, old: usize, limit: Duration) -> Option<usize> {
        self.inner.promoted(name, old, limit).await
    }

    async fn migrate(
        &self,
        name: &LockName,
        pause: Duration,
    ) -> Option<std::result::Result<String, String>> {
        self.inner.migrate(name, pause).await
    }

    fn replication_link(&self, primary: usize) -> Option<Link> {
        self.inner.replication_link(primary)
    }

    fn isolation_link(&self, primary: usize) -> Option<Link> {
        self.inner.isolation_link(primary)
    }

    async fn follower_link(
        &self,
        options: LockOptions,
    ) -> Option<(Arc<dyn DistributedLock>, Link)> {
        let (client, link) = self.inner.follower_link(options).await?;
        Some((Candidate::wrap(client), link))
    }
}

/// The scenarios an election runs in `make test` on a deployment that runs the mutex's
/// (the others in `make chaos`): a leader cut off, paused past its lease, its server
/// crashed and restarted, and a leader whose session or lease ends while it waits.
pub const ELECTION_SHORT_SCENARIOS: &[&str] = &[
    "holder_partitioned",
    "holder_paused_beyond_ttl",
    "server_crash_restart",
    "waiter_long_connection_reset",
];
