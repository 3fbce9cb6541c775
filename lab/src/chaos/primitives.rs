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
use conformance::factory::StartedFactory;
use conformance::wrap::{AcquireWrap, FactoryWrap, WrappedFactory, WrappedLock};
use lock_core::raw::backend::{AcquireKind, HoldKind};
use lock_core::{AcquireOptions, DistributedLock, LockGuard, LockName, LockOptions, Result};

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
            Primitive::Semaphore => HoldKind::permit(1),
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
pub type Kinded<T> = WrappedFactory<T, KindOf>;

/// `started`'s deployment, its clients using `primitive`; `None` when it did not start (a
/// missing server binary, said loudly by the harness).
pub fn kinded<T: ChaosTarget + 'static>(
    primitive: Primitive,
    started: impl StartedFactory<Factory = T>,
) -> Option<Kinded<T>> {
    let inner = started.started()?;
    Some(WrappedFactory::new(Arc::new(inner), KindOf(primitive)))
}

/// What a [`Kinded`] deployment changes: the primitive its clients use.
#[derive(Debug, Clone, Copy)]
pub struct KindOf(Primitive);

impl FactoryWrap for KindOf {
    fn label(&self, inner: String) -> String {
        format!("{inner} {}", self.0.label())
    }

    /// The shared kinds (a permit, a writer) wait on the queue wherever the backend offers
    /// the choice: Redis grants them only there.
    fn queue(&self, on: bool) -> bool {
        match self.0 {
            Primitive::Election => on,
            Primitive::Semaphore | Primitive::Writer => true,
        }
    }

    fn client(&self, lock: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        WrappedLock::around(lock, AsKind(self.0.kind()))
    }
}

/// A client that asks for its kind of hold wherever it is asked to acquire.
#[derive(Debug)]
struct AsKind(HoldKind);

#[async_trait]
impl AcquireWrap for AsKind {
    async fn acquire(
        &self,
        lock: &dyn DistributedLock,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        let options = options.clone().with_kind(self.0.clone());
        lock.acquire(name, &options).await
    }

    fn describe(&self, lock: &dyn DistributedLock, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {lock}", self.0.label())
    }
}

#[async_trait]
impl<T: ChaosTarget + 'static> ChaosTarget for Kinded<T> {
    fn topology(&self) -> Topology {
        self.inner().topology()
    }

    fn primitive(&self) -> Option<Primitive> {
        Some(self.wrapper().0)
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (client, link) = self.inner().linked_client(options).await;
        (self.wrapper().client(client), link)
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.inner().servers()
    }

    async fn leader(&self) -> Option<usize> {
        self.inner().leader().await
    }

    async fn primary(&self, name: &LockName) -> Option<usize> {
        self.inner().primary(name).await
    }

    async fn promoted(&self, name: &LockName, old: usize, limit: Duration) -> Option<usize> {
        self.inner().promoted(name, old, limit).await
    }

    async fn migrate(
        &self,
        name: &LockName,
        pause: Duration,
    ) -> Option<std::result::Result<String, String>> {
        self.inner().migrate(name, pause).await
    }

    fn replication_link(&self, primary: usize) -> Option<Link> {
        self.inner().replication_link(primary)
    }

    fn isolation_link(&self, primary: usize) -> Option<Link> {
        self.inner().isolation_link(primary)
    }

    async fn follower_link(
        &self,
        options: LockOptions,
    ) -> Option<(Arc<dyn DistributedLock>, Link)> {
        let (client, link) = self.inner().follower_link(options).await?;
        Some((self.wrapper().client(client), link))
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
