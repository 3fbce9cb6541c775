//! Redis deployments for tests: a conformance [`Factory`] over real redis-servers (one, or N for
//! RedLock; Sentinel deployments in `sentinel.rs`, Redis Cluster in `cluster.rs`), raw connections that reach behind the library, and helpers.
//!
//! A factory's servers are its own, or shared by the factories of a test binary
//! (`shared` constructors, see [`harness::shared`]); each factory over a shared deployment
//! keeps its keys under a key prefix of its own ([`shared_prefix`]).

/// Implements [`conformance::Factory`] for a Redis factory from its inherent
/// `deployment_url`, `make`, `crashable`, `owners` (raw connections to the servers that
/// keep a key) and `queue` field (with `prefixed and linked`, `prefix()` is its `prefix`
/// field and a crashable client is its `linked_client`): a steal deletes the lock key there, leftovers are
/// looked for there (with [`leftovers_on`]) and leases read there (with [`lease_on`]; the
/// calling module must have both in scope), all under the factory's `prefix()`.
macro_rules! redis_factory {
    ($factory:ty, prefixed and linked) => {
        impl $factory {
            fn prefix(&self) -> &str {
                &self.prefix
            }

            /// A crashable client reaches its servers through fault proxies it cuts.
            async fn crashable(
                &self,
                options: LockOptions,
            ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
                let (client, link) = self.linked_client(options).await;
                (client, Box::new(link))
            }
        }

        redis_factory!($factory);
    };
    ($factory:ty) => {
        #[::async_trait::async_trait]
        impl ::conformance::Factory for $factory {
            fn label(&self) -> String {
                self.deployment_url()
            }

            fn url(&self) -> String {
                self.deployment_url()
            }

            async fn client(
                &self,
                options: ::lock_core::LockOptions,
            ) -> ::std::sync::Arc<dyn ::lock_core::DistributedLock> {
                self.make(options).await
            }

            async fn crashable_client(
                &self,
                options: ::lock_core::LockOptions,
            ) -> (
                ::std::sync::Arc<dyn ::lock_core::DistributedLock>,
                Box<dyn ::conformance::Crash>,
            ) {
                self.crashable(options).await
            }

            async fn steal(&self, name: &::lock_core::LockName) {
                let key = ::lock_redis::KeyLayout::new(self.prefix()).lock_key(name);
                for mut conn in self.owners(&key).await {
                    let _: i64 = redis::cmd("DEL")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .expect("DEL");
                }
            }

            fn set_queue(&self, on: bool) -> bool {
                self.queue.store(on, ::std::sync::atomic::Ordering::Relaxed);
                true
            }

            async fn server_lease(
                &self,
                name: &::lock_core::LockName,
                owner: &::lock_core::OwnerToken,
            ) -> ::conformance::ServerLease {
                let keys = ::lock_redis::KeyLayout::new(self.prefix());
                let (key, table) = (keys.lock_key(name), keys.holders_key(name));
                lease_on(self.owners(&key).await, &key, &table, owner.as_str()).await
            }

            fn lease_resolution(&self) -> ::std::time::Duration {
                ::std::time::Duration::from_millis(5)
            }

            async fn leftovers(&self, names: &[::lock_core::LockName]) -> Vec<String> {
                let keys = ::lock_redis::KeyLayout::new(self.prefix());
                let mut left = Vec::new();
                for name in names {
                    let conns = self.owners(&keys.lock_key(name)).await;
                    let found = leftovers_on(conns, self.prefix(), std::slice::from_ref(name));
                    left.extend(found.await);
                }
                left
            }
        }
    };
}

mod cluster;
mod sentinel;
mod server;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
#[allow(unused_imports)] // not every test file uses it
pub use conformance::with_ttl;
use conformance::{connect_patiently, lock_patiently, Crash, Factory, FencedResource};
use harness::shared::{namespace, Shared};
use harness::{or_skip, Deployment, Redis, RedisNodes, RedisOptions, RedisServer};
use lab::chaos::{ChaosTarget, Link, ServerControl, Topology};
use lock_core::{
    DistributedLock, FencingToken, LockGuard, LockName, LockOptions, LockState, LockWatch,
    LostReason, ReleaseOutcome,
};
use lock_redis::{KeyLayout, RedisConfig, RedisLock, RedisNode, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

#[allow(unused_imports)] // not every test file uses it
pub use cluster::{
    asking_calls, await_shard_channels, key, key_on, name_on, shard_channels, ClusterFactory,
};
#[allow(unused_imports)] // not every test file uses it
pub use sentinel::SentinelFactory;
#[allow(unused_imports)] // not every test file uses it
pub use server::{lease_on, leftovers_on};

/// The servers behind a factory: one (`redis://`) or independent nodes (`redlock://`).
pub type Servers = Deployment<Redis>;

/// The deployments shared by the factories of a test binary: one server, RedLock's 3
/// and 5 servers.
static SINGLE: Shared<Servers> = Shared::new();
static REDLOCK_3: Shared<Servers> = Shared::new();
static REDLOCK_5: Shared<Servers> = Shared::new();

/// A key prefix no other factory uses, for a factory over a shared deployment.
pub fn shared_prefix() -> String {
    format!("distlock-{}:", namespace())
}

/// `url` with `prefix` in its query string, unless it is the default one.
pub fn url_with_prefix(url: String, prefix: &str) -> String {
    if prefix == DEFAULT_PREFIX {
        url
    } else {
        conformance::with_query(&url, &format!("prefix={prefix}"))
    }
}

/// Makes clients of one Redis topology for the conformance suite.
pub struct RedisFactory {
    /// The servers (killed when the last factory holding them drops).
    pub servers: Arc<Servers>,
    /// The key prefix of this factory's clients: [`DEFAULT_PREFIX`], or
    /// [`shared_prefix`] over a shared deployment.
    prefix: String,
    /// Proxies of crashable clients, kept alive as long as the factory.
    proxies: Mutex<Vec<Link>>,
    /// Whether the clients made from now on queue their waiters.
    pub queue: AtomicBool,
}

/// A raw connection to `addr`.
pub async fn raw(addr: SocketAddr) -> MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}"))
        .expect("raw client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// The waiter ids in `name`'s queue, in order, on the server of `conn`.
pub async fn queue_of(conn: &mut MultiplexedConnection, name: &LockName) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(KeyLayout::new(DEFAULT_PREFIX).queue_key(name))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("ZRANGE")
}

/// Waits (bounded) until `name`'s queue has `n` entries.
pub async fn until_queued(conn: &mut MultiplexedConnection, name: &LockName, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue_of(conn, name).await.len() != n {
        assert!(
            Instant::now() < deadline,
            "the queue never reached {n} entries"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// How often the server behind `conn` ran `command` (calls from scripts included), from
/// `INFO commandstats`.
pub async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let needle = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(needle.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A task that works on `fences` under `guards` (a section each, `work` long, both begun
/// at once) and hands the guards back: a holder across a failover.
pub fn hold_sections(
    guards: (LockGuard, LockGuard),
    fences: (FencedResource, FencedResource),
    work: Duration,
) -> JoinHandle<(LockGuard, LockGuard)> {
    tokio::spawn(async move {
        let (first, second) = tokio::join!(
            fences.0.hold_section(&guards.0, sleep(work)),
            fences.1.hold_section(&guards.1, sleep(work)),
        );
        assert!(first.is_ok() && second.is_ok(), "the first sections begin");
        guards
    })
}

/// A task that takes `lock` on `client` patiently (within `patience`, see
/// [`lock_patiently`]) and then works on `fence` once: a waiter across a failover.
pub fn fenced_waiter(
    client: &Arc<RedisLock>,
    lock: &LockName,
    fence: &FencedResource,
    patience: Duration,
) -> JoinHandle<LockGuard> {
    let (client, lock, fence) = (Arc::clone(client), lock.clone(), fence.clone());
    tokio::spawn(async move {
        let guard = lock_patiently(&*client, &lock, patience).await;
        fence
            .hold_section(&guard, sleep(Duration::from_millis(100)))
            .await
            .expect("the waiter's token is the highest");
        guard
    })
}

/// Closes the replication links of the primary at `primary` (`CLIENT KILL TYPE replica`):
/// with its replicas paused, nothing it writes from now on reaches them.
pub async fn cut_replicas(primary: SocketAddr) {
    let mut conn = raw(primary).await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL TYPE replica");
}

/// Kills `primary` (SIGKILL): the failover of a test.
pub async fn kill_primary(primary: &RedisServer) {
    primary.kill9().await.expect("kill the primary");
}

/// Releases `guard`, which must still be held.
pub async fn assert_released(guard: LockGuard) {
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Releases `guard` of `lock` and checks that nothing of `lock` is left on the servers.
pub async fn release_leaving_nothing(factory: &dyn Factory, guard: LockGuard, lock: &LockName) {
    guard.release().await.expect("release");
    assert!(factory
        .leftovers(std::slice::from_ref(lock))
        .await
        .is_empty());
}

/// A holder and a waiter across a failover (see [`across_failover`]).
pub struct AcrossFailover {
    /// The resource of the lock whose grant the failover keeps.
    pub kept_fence: FencedResource,
    /// The resource of the lock whose grant the failover drops.
    pub dropped_fence: FencedResource,
    /// The kept lock's state, as its holder sees it.
    pub kept_watch: LockWatch,
    /// The dropped lock's state, as its holder sees it.
    pub dropped_watch: LockWatch,
    /// The holder's sections ([`hold_sections`]).
    pub holding: JoinHandle<(LockGuard, LockGuard)>,
    /// The waiter on the kept lock ([`fenced_waiter`]).
    pub kept_waiter: JoinHandle<LockGuard>,
    /// The waiter on the dropped lock ([`fenced_waiter`]).
    pub dropped_waiter: JoinHandle<LockGuard>,
}

impl AcrossFailover {
    /// After the failover: waits (at most `lost_within`) for the second hold, whose key was
    /// lost, to turn Lost, then (at most `granted_within`) for its waiter to be granted.
    /// The reason, when the hold turned Lost, and the waiter's guard.
    pub async fn dropped_lost(
        &mut self,
        lost_within: Duration,
        granted_within: Duration,
    ) -> (LostReason, Instant, LockGuard) {
        let reason = tokio::time::timeout(lost_within, self.dropped_watch.lost())
            .await
            .expect("the hold of a lost key turns Lost by its next renewal");
        let lost_at = Instant::now();
        let next = tokio::time::timeout(granted_within, &mut self.dropped_waiter)
            .await
            .expect("the waiter of the lost key is granted")
            .expect("waiter task");
        (reason, lost_at, next)
    }
}

/// The holder works on a resource of each of `names` under `guards` (sections `work`
/// long) while `waiter` waits for both (within `patience`); returns once they have been at
/// it for 300 ms, ready for the failover.
pub async fn across_failover(
    waiter: &Arc<RedisLock>,
    guards: (LockGuard, LockGuard),
    names: (&LockName, &LockName),
    work: Duration,
    patience: Duration,
) -> AcrossFailover {
    let (kept_fence, dropped_fence) = (FencedResource::new(), FencedResource::new());
    let (kept_watch, dropped_watch) = (guards.0.watch(), guards.1.watch());
    let holding = hold_sections(guards, (kept_fence.clone(), dropped_fence.clone()), work);
    let kept_waiter = fenced_waiter(waiter, names.0, &kept_fence, patience);
    let dropped_waiter = fenced_waiter(waiter, names.1, &dropped_fence, patience);
    sleep(Duration::from_millis(300)).await;
    AcrossFailover {
        kept_fence,
        dropped_fence,
        kept_watch,
        dropped_watch,
        holding,
        kept_waiter,
        dropped_waiter,
    }
}

/// Ends the holds of `run` (see [`across_failover`]) after a failover: the first
/// (replicated) hold, seen `kept_state`, is Held with its key's value `owner` on the new
/// primary, or Lost; the second is dropped, the first released, and its waiter must then be
/// granted within `bound` with a token above `kept_token`: its guard.
pub async fn end_holds(
    run: &mut AcrossFailover,
    kept_state: LockState,
    owner: Option<String>,
    kept_token: FencingToken,
    bound: Duration,
) -> LockGuard {
    let (kept_guard, dropped_guard) = (&mut run.holding).await.expect("holder task");
    if kept_state == LockState::Held {
        assert_eq!(owner.as_deref(), Some(kept_guard.owner_token().as_str()));
    } else {
        assert!(kept_state.is_lost(), "{kept_state:?}");
    }
    drop(dropped_guard);
    let _ = kept_guard.release().await;
    let kept_next = tokio::time::timeout(bound, &mut run.kept_waiter)
        .await
        .expect("the waiter of the kept name is granted")
        .expect("waiter task");
    assert!(
        kept_next.fencing_token() > kept_token,
        "tokens never go back"
    );
    kept_next
}

/// A lock name of its own for `test` (a fresh UUID in it).
pub fn unique_name(test: &str) -> LockName {
    LockName::new(format!(
        "redis-test/{test}/{}",
        uuid::Uuid::new_v4().simple()
    ))
    .expect("name")
}

/// A client configuration for servers at `addrs`.
pub fn config_for(addrs: &[SocketAddr], redlock: bool, options: LockOptions) -> RedisConfig {
    let nodes: Vec<RedisNode> = addrs
        .iter()
        .map(|a| RedisNode::new(a.ip().to_string(), a.port()))
        .collect();
    let mut config = if redlock {
        RedisConfig::redlock(nodes)
    } else {
        RedisConfig::single(addrs[0].ip().to_string(), addrs[0].port())
    };
    config.options = options;
    config
}

impl RedisFactory {
    /// A factory over one fresh server; `None` (after a loud notice) when redis-server is
    /// not installed and strict mode is off.
    pub async fn single() -> Option<Self> {
        Self::single_with(RedisOptions::default()).await
    }

    /// A factory over one fresh server started with `options`; `None` as for
    /// [`RedisFactory::single`].
    pub async fn single_with(options: RedisOptions) -> Option<Self> {
        let server = or_skip(RedisServer::start_with(options).await)?;
        Some(Self::over(
            Arc::new(Deployment::Single(Box::new(server))),
            DEFAULT_PREFIX,
        ))
    }

    /// A factory over the one server the factories of this test binary share, started
    /// now if none runs; its keys live under a prefix of its own.
    pub async fn shared_single() -> Option<Self> {
        let servers = SINGLE
            .get_or_start(|| async {
                let server = or_skip(RedisServer::start().await)?;
                Some(Deployment::Single(Box::new(server)))
            })
            .await?;
        Some(Self::over(servers, &shared_prefix()))
    }

    /// A factory over the `n` independent servers (RedLock, `n` 3 or 5) the factories
    /// of this test binary share, as [`RedisFactory::shared_single`].
    pub async fn shared_redlock(n: usize) -> Option<Self> {
        let slot = match n {
            3 => &REDLOCK_3,
            5 => &REDLOCK_5,
            _ => panic!("no shared RedLock deployment of {n} servers"),
        };
        let servers = slot
            .get_or_start(|| async {
                let options = RedisOptions::default().members(n);
                Some(Deployment::Cluster(or_skip(
                    RedisNodes::start_with(options).await,
                )?))
            })
            .await?;
        Some(Self::over(servers, &shared_prefix()))
    }

    fn over(servers: Arc<Servers>, prefix: &str) -> Self {
        lock_core::raw::driver::register::<lock_redis::RedisBackend>();
        RedisFactory {
            servers,
            prefix: prefix.to_owned(),
            proxies: Mutex::new(Vec::new()),
            queue: AtomicBool::new(true),
        }
    }

    /// A factory over `n` fresh independent servers (RedLock); `None` as for
    /// [`RedisFactory::single`].
    pub async fn redlock(n: usize) -> Option<Self> {
        let nodes = or_skip(RedisNodes::start_with(RedisOptions::default().members(n)).await)?;
        Some(Self::over(
            Arc::new(Deployment::Cluster(nodes)),
            DEFAULT_PREFIX,
        ))
    }

    /// [`RedisFactory::redlock`] over three servers when `redlock`, else
    /// [`RedisFactory::single`].
    pub async fn single_or_redlock(redlock: bool) -> Option<Self> {
        if redlock {
            Self::redlock(3).await
        } else {
            Self::single().await
        }
    }

    fn redlock_mode(&self) -> bool {
        matches!(*self.servers, Deployment::Cluster(_))
    }

    /// A client of these servers.
    pub async fn make(&self, options: LockOptions) -> Arc<RedisLock> {
        self.make_at(&self.servers.addrs(), options).await
    }

    /// A client of the servers at `addrs` (e.g. proxies in front of them).
    pub async fn make_at(&self, addrs: &[SocketAddr], options: LockOptions) -> Arc<RedisLock> {
        let mut config = config_for(addrs, self.redlock_mode(), options);
        config.prefix.clone_from(&self.prefix);
        config.queue = self.queue.load(Ordering::Relaxed);
        Arc::new(connect_patiently("connect", || RedisLock::connect(config.clone())).await)
    }

    /// Deletes `key` on every server, behind the clients' backs.
    pub async fn delete_everywhere(&self, key: &str) {
        for mut conn in self.raw_all().await {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("DEL");
        }
    }

    /// Raw connections to every server.
    pub async fn raw_all(&self) -> Vec<MultiplexedConnection> {
        let mut conns = Vec::new();
        for addr in self.servers.addrs() {
            conns.push(raw(addr).await);
        }
        conns
    }
}

redis_factory!(RedisFactory, prefixed and linked);

impl RedisFactory {
    fn deployment_url(&self) -> String {
        url_with_prefix(self.servers.url(), &self.prefix)
    }

    /// Every server keeps every key (one server, or each of RedLock's).
    async fn owners(&self, _key: &str) -> Vec<MultiplexedConnection> {
        self.raw_all().await
    }
}

#[async_trait]
impl ChaosTarget for RedisFactory {
    fn topology(&self) -> Topology {
        match &*self.servers {
            Deployment::Single(_) => Topology::Single { durable: false },
            Deployment::Cluster(n) => Topology::Independent { nodes: n.len() },
        }
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (link, addrs) = Link::proxied(&self.servers.addrs()).await;
        let client = self.make_at(&addrs, options).await;
        self.proxies.lock().expect("proxies").push(link.clone());
        (client, link)
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.servers.controls()
    }
}

impl std::fmt::Debug for RedisFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFactory")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for AcrossFailover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcrossFailover").finish_non_exhaustive()
    }
}
