//! The fault scenarios can see a broken lock: run against a lock that excludes nobody
//! (every client in a memory space of its own), each scenario that promises safety must
//! report the double grants through the fenced resource.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::factory::{Crash, Factory};
use conformance::memory::MemoryCrash;
use lab::chaos::{self, ChaosTarget, Link, Plan, ServerControl, Topology};
use lock_core::memory::{MemoryBackend, MemoryLock, MemorySpace};
use lock_core::{DistributedLock, LockName, LockOptions};

/// Every client gets every lock at once: each lives in a memory space of its own.
#[derive(Debug)]
struct ExcludesNobody;

impl ExcludesNobody {
    fn make(options: LockOptions) -> Arc<MemoryLock> {
        let space = MemorySpace::named(&format!(
            "excludes-nobody-{}",
            uuid::Uuid::new_v4().simple()
        ));
        Arc::new(MemoryBackend::client(space, options).expect("valid options"))
    }
}

#[async_trait]
impl Factory for ExcludesNobody {
    fn label(&self) -> String {
        "a lock that excludes nobody".to_owned()
    }

    fn url(&self) -> String {
        "memory://excludes-nobody".to_owned()
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        Self::make(options)
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let client = Self::make(options);
        (client.clone(), Box::new(MemoryCrash(client)))
    }

    async fn steal(&self, _name: &LockName) {}

    async fn leftovers(&self, _names: &[LockName]) -> Vec<String> {
        Vec::new()
    }
}

#[async_trait]
impl ChaosTarget for ExcludesNobody {
    fn topology(&self) -> Topology {
        Topology::InProcess
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let client = Self::make(options);
        (client.clone(), Link::Memory(client))
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        Vec::new()
    }
}

/// Runs `scenario` on the lock that excludes nobody: it must report an overlap.
async fn sees_double_grants(scenario: &str) {
    let target = ExcludesNobody;
    let report = chaos::run(scenario, &target, Plan::short(target.short_ttl()))
        .await
        .expect("the scenario applies in-process");
    eprintln!("[chaos power] {report}");
    assert!(
        !report.fence.overlaps.is_empty(),
        "{scenario} did not see that the lock excludes nobody: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_under_faults_sees_double_grants() {
    sees_double_grants("cancellation_under_faults").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_partitioned_sees_double_grants() {
    sees_double_grants("holder_partitioned").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_sees_double_grants() {
    sees_double_grants("nemesis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_head_waiter_sees_double_grants() {
    sees_double_grants("crashed_head_waiter").await;
}
