//! The fault scenarios on the primitives: [`Kinded`] turns a deployment into one whose
//! clients take another kind of hold where the scenarios lock: campaign in an election,
//! take the one permit of a semaphore, or take a read-write lock's write side. Each is an
//! exclusive hold with a guard and a fencing token (an election's term), so every
//! scenario, its workload and its fenced checker apply unchanged: "two holders at once" is
//! then two leaders, two permit holders of a semaphore of one, or two writers; "a token
//! going back" a term going back. (Limits above one, and readers, are the conformance
//! rules' to judge: a fenced resource orders one holder at a time.)

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::factory::{Crash, Factory, StartedFactory};
use conformance::ServerLease;
use lock_core::raw::backend::{ChangeFeed, HoldKind};
use lock_core::{
    AcquireOptions, Capabilities, DistributedLock, LockGuard, LockName, LockOptions, Occupancy,
    OwnerToken, Participant, Result,
};

use super::topology::{ChaosTarget, Link, ServerControl, Topology};

/// Which primitive a [`Kinded`] deployment's clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// Campaign in an election (each client with a value of its own).
    Election,
    /// Take the one permit of a semaphore of one.
    Semaphore,
    /// Take the write side of a read-write lock.
    Writer,
}

impl Primitive {
    /// The kind of hold a new client asks for.
    fn kind(self) -> HoldKind {
        match self {
            Primitive::Election => HoldKind::Candidate {
                value: format!("candidate-{}", uuid::Uuid::new_v4().simple()).into_bytes(),
            },
            Primitive::Semaphore => HoldKind::Permit { permits: 1 },
            Primitive::Writer => HoldKind::Write,
        }
    }

    /// What a report row calls it (after the deployment's label).
    pub fn label(self) -> &'static str {
        match self {
            Primitive::Election => "election",
            Primitive::Semaphore => "semaphore",
            Primitive::Writer => "rwlock writer",
        }
    }
}

/// A deployment whose clients take a primitive's hold where others take the lock.
pub struct Kinded<T> {
    inner: T,
    primitive: Primitive,
}

impl<T: ChaosTarget> Kinded<T> {
    /// `started`'s deployment, its clients using `primitive`; `None` when it did not
    /// start (a missing server binary, said loudly by the harness).
    pub fn of(primitive: Primitive, started: impl StartedFactory<Factory = T>) -> Option<Self> {
        started.started().map(|inner| Kinded { inner, primitive })
    }

    fn wrap(&self, lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        Arc::new(KindedClient {
            lock,
            kind: self.primitive.kind(),
        })
    }
}

impl<T: ChaosTarget> fmt::Debug for Kinded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kinded")
            .field("deployment", &self.inner.label())
            .field("primitive", &self.primitive)
            .finish()
    }
}

/// A client that asks for its kind of hold wherever it is asked to acquire.
struct KindedClient {
    lock: Arc<dyn DistributedLock>,
    kind: HoldKind,
}

impl fmt::Debug for KindedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KindedClient")
            .field("lock", &self.lock)
            .field("kind", &self.kind.label())
            .finish()
    }
}

impl fmt::Display for KindedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.kind.label(), self.lock)
    }
}

#[async_trait]
impl DistributedLock for KindedClient {
    async fn acquire(
        &self,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        let mut options = options.clone();
        options.kind = self.kind.clone();
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
impl<T: ChaosTarget> Factory for Kinded<T> {
    fn label(&self) -> String {
        format!("{} {}", self.inner.label(), self.primitive.label())
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    fn short_ttl(&self) -> Duration {
        self.inner.short_ttl()
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        self.wrap(self.inner.client(options).await)
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, crash) = self.inner.crashable_client(options).await;
        (self.wrap(client), crash)
    }

    async fn steal(&self, name: &LockName) {
        self.inner.steal(name).await;
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        self.inner.leftovers(names).await
    }

    fn set_queue(&self, on: bool) -> bool {
        self.inner.set_queue(on)
    }

    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        self.inner.server_lease(name, owner).await
    }

    fn lease_resolution(&self) -> Duration {
        self.inner.lease_resolution()
    }
}

#[async_trait]
impl<T: ChaosTarget> ChaosTarget for Kinded<T> {
    fn topology(&self) -> Topology {
        self.inner.topology()
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (client, link) = self.inner.linked_client(options).await;
        (self.wrap(client), link)
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
        Some((self.wrap(client), link))
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
