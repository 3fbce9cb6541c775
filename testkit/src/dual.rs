//! The dual deployments the dual tests run on: the backends' test factories of this kit
//! as the sides, each test starting its own servers (the fault
//! scenarios kill and pause them), or, for the conformance suites, the servers the tests
//! of the binary share (`shared_*`), each test under a namespace of its own.

use std::future::Future;
use std::net::SocketAddr;

use async_trait::async_trait;
use lab::dual::{DualFactory, SideFactory};
use lock_core::LockName;

use crate::etcd::{keys_under, EtcdFactory};
use crate::postgres::PostgresFactory;
use crate::redis::RedisFactory;
use crate::zookeeper::ZkFactory;

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

/// The factory's [`leftovers`](conformance::Factory::leftovers) are already its schema's
/// entries only (nothing per client, unlike etcd's leases), so they serve as the side's.
impl SideFactory for PostgresFactory {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.addrs()
    }
}

/// The dual deployment of the sides that `old` and `new` start side by side; `None` when
/// either is `None` (a server binary is missing).
async fn pair<O, N>(
    old: impl Future<Output = Option<O>>,
    new: impl Future<Output = Option<N>>,
) -> Option<DualFactory<O, N>>
where
    O: SideFactory,
    N: SideFactory,
{
    let (old, new) = tokio::join!(old, new);
    Some(DualFactory::new(old?, new?))
}

/// A standalone ZooKeeper server (old) and a single Redis (new).
pub async fn zk_redis() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    pair(ZkFactory::start(), RedisFactory::single()).await
}

/// A standalone ZooKeeper server (old) and RedLock over 3 Redis nodes (new).
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run no RedLock pair
pub async fn zk_redlock() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    pair(ZkFactory::start(), RedisFactory::redlock(3)).await
}

/// [`zk_redis`] on the servers the tests of this binary share.
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run on servers of their own
pub async fn shared_zk_redis() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    pair(ZkFactory::shared(), RedisFactory::shared_single()).await
}

/// [`zk_redlock`] on the servers the tests of this binary share.
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run on servers of their own
pub async fn shared_zk_redlock() -> Option<DualFactory<ZkFactory, RedisFactory>> {
    pair(ZkFactory::shared(), RedisFactory::shared_redlock(3)).await
}

/// [`etcd_redis`] on the servers the tests of this binary share.
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run on servers of their own
pub async fn shared_etcd_redis() -> Option<DualFactory<EtcdFactory, RedisFactory>> {
    pair(EtcdFactory::shared_side(), RedisFactory::shared_single()).await
}

/// A single etcd member (old) and a single Redis (new).
pub async fn etcd_redis() -> Option<DualFactory<EtcdFactory, RedisFactory>> {
    pair(EtcdFactory::start(), RedisFactory::single()).await
}

/// A PostgreSQL server (old) and a single Redis (new), on the servers the tests of this
/// binary share: a team leaving Postgres locks for Redis.
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run on servers of their own
pub async fn shared_postgres_redis() -> Option<DualFactory<PostgresFactory, RedisFactory>> {
    pair(PostgresFactory::shared(), RedisFactory::shared_single()).await
}

/// A standalone ZooKeeper server (old) and a PostgreSQL server (new), on the servers the
/// tests of this binary share: Postgres as the new side, its counter raised to the old
/// side's tokens (`fence_at_least`).
#[allow(dead_code)] // the fault scenarios of dual_chaos.rs run on servers of their own
pub async fn shared_zk_postgres() -> Option<DualFactory<ZkFactory, PostgresFactory>> {
    pair(ZkFactory::shared(), PostgresFactory::shared()).await
}
