//! A conformance [`Factory`] over Redis Cluster (`redis+cluster://`): three primaries with
//! a replica each; also a [`ChaosTarget`] for the scenarios that need no linked client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::chaos::{ChaosTarget, Link, ServerControl, Topology};
use conformance::harness::{or_skip, RedisCluster};
use conformance::{connect_patiently, Crash, Factory};
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_redis::{KeyLayout, RedisConfig, RedisLock, RedisNode, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;

use super::{leftovers_on, raw};

/// Makes clients of one Redis Cluster.
pub(crate) struct ClusterFactory {
    /// The servers (killed on drop).
    pub(crate) cluster: Arc<RedisCluster>,
    /// Crashable clients made so far (each has an ACL user of its own).
    crashable: AtomicUsize,
}

impl ClusterFactory {
    /// A factory over a fresh cluster; `None` (after a loud notice) when redis-server is
    /// not installed and strict mode is off.
    pub(crate) async fn start() -> Option<Self> {
        lock_core::raw::register::<lock_redis::RedisBackend>();
        let cluster = or_skip(RedisCluster::start().await)?;
        Some(ClusterFactory {
            cluster: Arc::new(cluster),
            crashable: AtomicUsize::new(0),
        })
    }

    /// A client configuration with every server as a seed node.
    pub(crate) fn config(&self, options: LockOptions) -> RedisConfig {
        let seeds = self
            .cluster
            .servers()
            .iter()
            .map(|s| RedisNode::new(s.addr().ip().to_string(), s.port()))
            .collect();
        let mut config = RedisConfig::cluster(seeds);
        config.options = options;
        config
    }

    /// A client of the cluster.
    pub(crate) async fn make(&self, options: LockOptions) -> Arc<RedisLock> {
        self.make_with(self.config(options)).await
    }

    /// A client with `config`.
    pub(crate) async fn make_with(&self, config: RedisConfig) -> Arc<RedisLock> {
        Arc::new(connect_patiently("connect", || RedisLock::connect(config.clone())).await)
    }

    /// A raw connection to the primary that serves `key`.
    pub(crate) async fn raw_owner(&self, key: &str) -> MultiplexedConnection {
        let owner = self.cluster.owner_of_key(key).await.expect("owner");
        raw(self.cluster.server(owner).addr()).await
    }

    /// Runs `args` on every running server (for ACL users, which each node keeps alone).
    async fn on_every_node(&self, args: &[&str]) {
        for server in self.cluster.servers().iter().filter(|s| s.is_running()) {
            let mut conn = raw(server.addr()).await;
            let mut cmd = redis::cmd(args[0]);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            let _: redis::Value = cmd.query_async(&mut conn).await.expect("ACL command");
        }
    }
}

/// A client cut off by disabling its ACL user on every node and killing its connections:
/// it cannot reconnect, so it sends nothing that arrives.
struct AclCrash {
    cluster: Arc<RedisCluster>,
    user: String,
}

#[async_trait]
impl Crash for AclCrash {
    async fn crash(&self) {
        for server in self.cluster.servers().iter().filter(|s| s.is_running()) {
            let mut conn = raw(server.addr()).await;
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(&self.user)
                .arg("off")
                .query_async(&mut conn)
                .await
                .expect("ACL SETUSER off");
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("USER")
                .arg(&self.user)
                .query_async(&mut conn)
                .await
                .expect("CLIENT KILL USER");
        }
    }
}

#[async_trait]
impl Factory for ClusterFactory {
    fn label(&self) -> String {
        self.url()
    }

    fn url(&self) -> String {
        self.cluster.url()
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        self.make(options).await
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let user = format!(
            "crashable{}",
            self.crashable.fetch_add(1, Ordering::Relaxed)
        );
        self.on_every_node(&[
            "ACL", "SETUSER", &user, "on", ">secret", "~*", "&*", "+@all",
        ])
        .await;
        let mut config = self.config(options);
        config.username = Some(user.clone());
        config.password = Some("secret".to_owned());
        let client = self.make_with(config).await;
        let crash = AclCrash {
            cluster: Arc::clone(&self.cluster),
            user,
        };
        (client, Box::new(crash))
    }

    async fn steal(&self, name: &LockName) {
        let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(name);
        let mut conn = self.raw_owner(&key).await;
        let _: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let keys = KeyLayout::new(DEFAULT_PREFIX);
        let mut left = Vec::new();
        for name in names {
            let conn = self.raw_owner(&keys.lock_key(name)).await;
            left.extend(leftovers_on(vec![conn], std::slice::from_ref(name)).await);
        }
        left
    }
}

/// The failover scenarios that make their clients with `client` run on a cluster; a
/// linked client (one whose network a scenario faults) has no fault proxy here, since
/// every node sends its clients on (`MOVED`, `ASK`) to the addresses the nodes announce.
#[async_trait]
impl ChaosTarget for ClusterFactory {
    fn topology(&self) -> Topology {
        Topology::Replicated {
            shards: 3,
            replicas: 1,
            acked: 0,
        }
    }

    /// # Panics
    /// Always: see the impl's doc.
    async fn linked_client(&self, _options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        panic!("a Redis Cluster client follows the nodes' own addresses: no fault proxy");
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.cluster
            .servers()
            .iter()
            .map(|s| s as &dyn ServerControl)
            .collect()
    }

    async fn primary(&self, name: &LockName) -> Option<usize> {
        let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(name);
        self.cluster.owner_of_key(&key).await.ok()
    }

    async fn promoted(&self, name: &LockName, old: usize, limit: Duration) -> Option<usize> {
        let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(name);
        let slot = self.cluster.slot_of(&key).await.ok()?;
        self.cluster.wait_for_new_owner(slot, old, limit).await.ok()
    }

    async fn migrate(&self, name: &LockName, pause: Duration) -> Option<Result<String, String>> {
        let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(name);
        let moved = async {
            let slot = self.cluster.slot_of(&key).await?;
            let from = self.cluster.owner_of(slot).await?;
            let to = (from + 1) % 3;
            let moving = self.cluster.begin_move(slot, to).await?;
            tokio::time::sleep(pause).await;
            let keys = self.cluster.move_keys(&moving).await?;
            tokio::time::sleep(pause).await;
            self.cluster.finish_move(&moving).await?;
            Ok::<_, conformance::harness::HarnessError>(format!(
                "slot {slot} moved from server {from} to server {to} with {keys} keys"
            ))
        };
        Some(moved.await.map_err(|e| e.to_string()))
    }
}
