//! The reference backend (`memory://`) as a fault target and as a side of a dual
//! deployment: in-process, so no servers to break and no links to proxy.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use conformance::memory::MemoryFactory;
use lock_core::{DistributedLock, LockOptions};

use crate::chaos::{ChaosTarget, Link, ServerControl, Topology};
use crate::dual::SideFactory;

#[async_trait]
impl ChaosTarget for MemoryFactory {
    fn topology(&self) -> Topology {
        Topology::InProcess
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let client = self.memory_lock(options);
        (client.clone(), Link::Memory(client))
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        Vec::new()
    }
}

impl SideFactory for MemoryFactory {
    fn addrs(&self) -> Vec<SocketAddr> {
        Vec::new()
    }
}
