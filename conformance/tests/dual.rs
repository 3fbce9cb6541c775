//! The dual lock (`dual:<old>|<new>`) against real servers: the whole conformance suite on
//! ZooKeeper -> Redis, ZooKeeper -> RedLock (3 nodes) and etcd -> Redis, and the fault
//! scenarios with faults on either side (`faults`). Each test starts its own servers.
//!
//! The sides are the backends' own test factories (their `tests/common`, compiled in here),
//! so the dual deployments steal, crash and list leftovers exactly as each backend's suite
//! does; this crate's library stays free of backend crates.

#[path = "../../lock-etcd/tests/common/mod.rs"]
mod etcd_common;
#[path = "../../lock-redis/tests/common/mod.rs"]
mod redis_common;
#[path = "../../lock-zookeeper/tests/common/mod.rs"]
mod zk_common;

#[path = "dual/faults.rs"]
mod faults;

use std::net::SocketAddr;

use async_trait::async_trait;
use conformance::dual::{DualFactory, SideFactory};
use etcd_common::{keys_under, EtcdFactory};
use lock_core::LockName;
use redis_common::RedisFactory;
use zk_common::ZkFactory;

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
pub(crate) async fn zk_redlock() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    let (old, new) = tokio::join!(ZkFactory::start(), RedisFactory::redlock(3));
    Some(DualFactory::new(old?, new?))
}

/// A single etcd member (old) and a single Redis (new).
pub(crate) async fn etcd_redis() -> Option<DualFactory<EtcdFactory, RedisFactory>> {
    let (old, new) = tokio::join!(EtcdFactory::start(), RedisFactory::single());
    Some(DualFactory::new(old?, new?))
}

/// Every rule on ZooKeeper -> Redis; the suite's steal removes the new side's key.
mod zk_to_redis {
    conformance::conformance_suite!(async { crate::zk_redis().await });
}

/// The rules that steal, with the steal on the old side (the ZooKeeper node).
mod zk_to_redis_old_side_stolen {
    use conformance::dual::Sides;
    conformance::conformance_suite!(@rules
        async { crate::zk_redis().await.map(|dual| dual.steal_on(Sides::Old)) };
        lost_signal_on_steal,
        reentrant_release_reports_loss,
        scoped_run_cancels_on_loss,
    );
}

/// Every rule on ZooKeeper -> RedLock over 3 nodes.
mod zk_to_redlock {
    conformance::conformance_suite!(async { crate::zk_redlock().await });
}

/// Every rule on etcd -> Redis.
mod etcd_to_redis {
    conformance::conformance_suite!(async { crate::etcd_redis().await });
}
