//! The dual deployments the dual tests run on (`dual.rs`, `dual_chaos.rs`): the backends'
//! own test factories as the sides, each test starting its own servers. The including
//! test crate declares the backends' `tests/common` modules at its root.

use std::net::SocketAddr;

use async_trait::async_trait;
use lab::dual::{DualFactory, SideFactory};
use lock_core::LockName;

use crate::etcd_common::{keys_under, EtcdFactory};
use crate::redis_common::RedisFactory;
use crate::zk_common::ZkFactory;

impl SideFactory for ZkFactory {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.addrs()
    }
}

impl SideFactory for RedisFactory {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.addrs()
    }
}

#[async_trait]
impl SideFactory for EtcdFactory {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.addrs()
    }

    /// The lock keys only: the etcd factory tells leaked leases from its own clients'
    /// ones, and the leases of dual clients are not its clients'.
    async fn side_leftovers(&self, names: &[LockName]) -> Vec<String> {
        let mut left = Vec::new();
        for name in names {
            for (key, revision) in keys_under(self.admin(), &self.range(name)).await {
                left.push(format!("{name:?}: key {key} (create revision {revision})"));
            }
        }
        left
    }
}

/// A standalone ZooKeeper server (old) and a single Redis (new).
pub(crate) async fn zk_redis() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    let (old, new) = tokio::join!(ZkFactory::start(), RedisFactory::single());
    Some(DualFactory::new(old?, new?))
}

/// A standalone ZooKeeper server (old) and RedLock over 3 Redis nodes (new).
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run no RedLock pair
pub(crate) async fn zk_redlock() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    let (old, new) = tokio::join!(ZkFactory::start(), RedisFactory::redlock(3));
    Some(DualFactory::new(old?, new?))
}

/// A single etcd member (old) and a single Redis (new).
pub(crate) async fn etcd_redis() -> Option<DualFactory<EtcdFactory, RedisFactory>> {
    let (old, new) = tokio::join!(EtcdFactory::start(), RedisFactory::single());
    Some(DualFactory::new(old?, new?))
}
