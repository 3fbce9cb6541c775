//! A conformance [`Factory`](conformance::Factory) over Redis behind Sentinel: a primary, two replicas and three
//! Sentinels (`redis+sentinel://`, or `rediss+sentinel://` with every process on TLS), also
//! a [`ChaosTarget`] for the fault scenarios.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use std::time::Duration;

use conformance::{connect_patiently, Crash};
use harness::shared::Shared;
use harness::{or_skip, Cluster, HarnessError, RedisSentinel, Sentinel, SentinelOptions};
use lab::chaos::{ChaosTarget, Link, ServerControl, Topology};
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_redis::{RedisConfig, RedisLock, RedisNode, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;

use super::{lease_on, leftovers_on, raw, shared_prefix, url_with_prefix};

/// The deployments shared by the factories of a test binary, plain and on TLS.
static SHARED: Shared<RedisSentinel> = Shared::new();
static SHARED_TLS: Shared<RedisSentinel> = Shared::new();

/// Makes clients of one Sentinel deployment.
pub struct SentinelFactory {
    /// The servers and Sentinels (killed when the last factory holding them drops).
    pub deployment: Arc<RedisSentinel>,
    /// The key prefix of this factory's clients: the default one, or a prefix of its own
    /// over a shared deployment.
    prefix: String,
    /// What crashable clients go through: a proxy in front of the primary and a Sentinel
    /// of their own that names it, kept as long as the factory.
    crashable: Mutex<Vec<(Link, Cluster<Sentinel>)>>,
    /// `wait_replicas` of every client (`None`: the default).
    wait_replicas: Option<u32>,
    /// Whether the clients made from now on queue their waiters.
    pub queue: AtomicBool,
}

impl SentinelFactory {
    /// A factory over a fresh deployment; `None` (after a loud notice) when redis-server is
    /// not installed and strict mode is off.
    pub async fn start() -> Option<Self> {
        Self::start_with(SentinelOptions::default(), None).await
    }

    /// A factory for the fault scenarios: the first primary behind fault proxies (see
    /// `SentinelOptions::partitionable`), clients that wait for `wait_replicas` replicas.
    pub async fn chaos(wait_replicas: u32) -> Option<Self> {
        let options = SentinelOptions::default().partitionable(true);
        Self::start_with(options, Some(wait_replicas)).await
    }

    /// A factory over a fresh deployment serving TLS (`rediss+sentinel://`): clients know
    /// only the TLS ports of the Sentinels and of the servers they name.
    pub async fn start_tls() -> Option<Self> {
        Self::over(RedisSentinel::start_tls().await, None)
    }

    async fn start_with(options: SentinelOptions, wait_replicas: Option<u32>) -> Option<Self> {
        Self::over(RedisSentinel::start_with(options).await, wait_replicas)
    }

    /// A factory over the deployment the factories of this test binary share (on TLS
    /// when `tls`), started now if none runs; its keys live under a prefix of its own.
    pub async fn shared(tls: bool) -> Option<Self> {
        let slot = if tls { &SHARED_TLS } else { &SHARED };
        let deployment = slot
            .get_or_start(|| async {
                or_skip(if tls {
                    RedisSentinel::start_tls().await
                } else {
                    RedisSentinel::start_with(SentinelOptions::default()).await
                })
            })
            .await?;
        Some(Self::over_arc(deployment, None, shared_prefix()))
    }

    fn over(
        deployment: Result<RedisSentinel, HarnessError>,
        wait_replicas: Option<u32>,
    ) -> Option<Self> {
        let deployment = Arc::new(or_skip(deployment)?);
        Some(Self::over_arc(
            deployment,
            wait_replicas,
            DEFAULT_PREFIX.to_owned(),
        ))
    }

    fn over_arc(
        deployment: Arc<RedisSentinel>,
        wait_replicas: Option<u32>,
        prefix: String,
    ) -> Self {
        lock_core::raw::driver::register::<lock_redis::RedisBackend>();
        SentinelFactory {
            deployment,
            prefix,
            crashable: Mutex::new(Vec::new()),
            wait_replicas,
            queue: AtomicBool::new(true),
        }
    }

    /// A client configuration for the Sentinels at `sentinels`.
    pub fn config(&self, sentinels: &Cluster<Sentinel>, options: LockOptions) -> RedisConfig {
        let nodes = sentinels
            .members()
            .iter()
            .map(|s| {
                let addr = s.client_addr();
                RedisNode::new(addr.ip().to_string(), addr.port())
            })
            .collect();
        let mut config = RedisConfig::sentinel(nodes, self.deployment.master_name());
        config.options = options;
        config.prefix.clone_from(&self.prefix);
        config.wait_replicas = self.wait_replicas;
        config.queue = self.queue.load(Ordering::Relaxed);
        if let Some(ca) = self.deployment.ca_file() {
            config.tls = true;
            config.ca_file = Some(ca);
        }
        config
    }

    /// A client of the deployment's Sentinels.
    pub async fn make(&self, options: LockOptions) -> Arc<RedisLock> {
        self.make_with(self.config(self.deployment.sentinels(), options))
            .await
    }

    /// A client with `config`.
    pub async fn make_with(&self, config: RedisConfig) -> Arc<RedisLock> {
        Arc::new(connect_patiently("connect", || RedisLock::connect(config.clone())).await)
    }

    /// A raw connection to the current primary.
    pub async fn raw_primary(&self) -> MultiplexedConnection {
        let primary = self.deployment.primary().await.expect("a primary");
        raw(self.deployment.server(primary).addr()).await
    }
}

redis_factory!(SentinelFactory, prefixed and linked);

impl SentinelFactory {
    fn deployment_url(&self) -> String {
        url_with_prefix(self.deployment.url(), &self.prefix)
    }

    /// The primary of the moment keeps every key.
    async fn owners(&self, _key: &str) -> Vec<MultiplexedConnection> {
        vec![self.raw_primary().await]
    }
}

/// A linked client reaches the primary of the moment through a fault proxy, named by a
/// Sentinel of its own that follows the others' failovers (it learns them from their
/// gossip) but never starts one.
#[async_trait]
impl ChaosTarget for SentinelFactory {
    fn topology(&self) -> Topology {
        Topology::Replicated {
            shards: 1,
            replicas: self.deployment.servers().len() - 1,
            // The default waits for one replica (the primary has two).
            acked: self.wait_replicas.unwrap_or(1),
        }
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let primary = self.deployment.primary().await.expect("a primary");
        let primary_addr = self.deployment.server(primary).client_addr();
        let (link, addrs) = Link::proxied(&[primary_addr]).await;
        let own = self
            .deployment
            .own_sentinel(addrs[0])
            .await
            .expect("a Sentinel of the linked client's own");
        let client = self.make_with(self.config(&own, options)).await;
        self.crashable
            .lock()
            .expect("crashable")
            .push((link.clone(), own));
        (client, link)
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.deployment
            .servers()
            .iter()
            .map(|s| s as &dyn ServerControl)
            .collect()
    }

    async fn primary(&self, _name: &LockName) -> Option<usize> {
        self.deployment.primary().await.ok()
    }

    async fn promoted(&self, _name: &LockName, old: usize, limit: Duration) -> Option<usize> {
        self.deployment.wait_for_new_primary(old, limit).await.ok()
    }

    fn replication_link(&self, primary: usize) -> Option<Link> {
        let front = self.deployment.front().filter(|_| primary == 0)?;
        Some(Link::Proxies(Arc::clone(&front.replication)))
    }

    fn isolation_link(&self, primary: usize) -> Option<Link> {
        let front = self.deployment.front().filter(|_| primary == 0)?;
        Some(Link::All(vec![
            Link::Proxies(Arc::clone(&front.others)),
            Link::Proxies(Arc::clone(&front.replication)),
        ]))
    }
}

impl std::fmt::Debug for SentinelFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelFactory")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
