//! The suite's factory for `memory://`, the reference backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::memory::{MemoryBackend, MemoryLock, MemorySpace};
use lock_core::{DistributedLock, LockName, LockOptions, OwnerToken};

use crate::factory::{Crash, Factory, ServerLease};

/// Clients of one private memory space.
#[derive(Debug)]
pub struct MemoryFactory {
    space: Arc<MemorySpace>,
    space_name: String,
}

impl MemoryFactory {
    /// A factory over a fresh, private space.
    pub fn new() -> Self {
        let space_name = format!("conformance-{}", uuid::Uuid::new_v4().simple());
        MemoryFactory {
            space: MemorySpace::named(&space_name),
            space_name,
        }
    }

    /// A new client of this factory's space, as its concrete type.
    pub fn memory_lock(&self, options: LockOptions) -> Arc<MemoryLock> {
        Arc::new(
            MemoryBackend::client(Arc::clone(&self.space), options)
                .expect("suite options are valid"),
        )
    }
}

impl Default for MemoryFactory {
    fn default() -> Self {
        Self::new()
    }
}

/// The crash of an in-process client: its backend stops, as a killed process would.
#[derive(Debug)]
pub struct MemoryCrash(pub Arc<MemoryLock>);

#[async_trait]
impl Crash for MemoryCrash {
    async fn crash(&self) {
        self.0.backend().crash();
    }
}

#[async_trait]
impl Factory for MemoryFactory {
    fn label(&self) -> String {
        format!("memory://{}", self.space_name)
    }

    fn url(&self) -> String {
        format!("memory://{}", self.space_name)
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        self.memory_lock(options)
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let client = self.memory_lock(options);
        (client.clone(), Box::new(MemoryCrash(client)))
    }

    async fn steal(&self, name: &LockName) {
        self.space.steal(name);
    }

    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        match self.space.lease_left(name, owner) {
            Some(left) => ServerLease::Left(left),
            None => ServerLease::Absent,
        }
    }

    fn lease_resolution(&self) -> Duration {
        Duration::ZERO
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let mut left = Vec::new();
        for name in names {
            if let Some(holder) = self.space.holder(name) {
                left.push(format!("{name:?} held by {holder}"));
            }
            let waiters = self.space.waiters(name);
            if waiters > 0 {
                left.push(format!("{name:?} has {waiters} queued waiters"));
            }
        }
        left
    }
}
