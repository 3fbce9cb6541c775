//! A conformance [`Factory`](conformance::Factory) over Redis Cluster (`redis+cluster://`): three primaries with
//! a replica each; also a [`ChaosTarget`] whose linked clients are cut off by ACL.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{connect_patiently, Crash};
use harness::{or_skip, RedisCluster};
use lab::chaos::{ChaosTarget, Link, ServerControl, Switch, Topology};
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_redis::{KeyLayout, RedisConfig, RedisLock, RedisNode, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;
use tokio::time::{sleep, Instant};

use super::{lease_on, leftovers_on, raw, unique_name};

/// Makes clients of one Redis Cluster.
pub struct ClusterFactory {
    /// The servers (killed on drop).
    pub cluster: Arc<RedisCluster>,
    /// Clients with an ACL user of their own made so far (crashable or linked).
    users: AtomicUsize,
    /// The links of linked clients, kept as long as the factory.
    links: Mutex<Vec<Link>>,
    /// Whether the clients made from now on queue their waiters.
    pub queue: AtomicBool,
}

impl ClusterFactory {
    /// A factory over a fresh cluster; `None` (after a loud notice) when redis-server is
    /// not installed and strict mode is off.
    pub async fn start() -> Option<Self> {
        Self::with(RedisCluster::start().await)
    }

    /// As [`ClusterFactory::start`], over a cluster that fails over fast (see
    /// [`RedisCluster::start_for_failover`]): for the tests that kill a primary.
    pub async fn start_for_failover() -> Option<Self> {
        Self::with(RedisCluster::start_for_failover().await)
    }

    fn with(cluster: Result<RedisCluster, harness::HarnessError>) -> Option<Self> {
        lock_core::raw::driver::register::<lock_redis::RedisBackend>();
        let cluster = or_skip(cluster)?;
        Some(ClusterFactory {
            cluster: Arc::new(cluster),
            users: AtomicUsize::new(0),
            links: Mutex::new(Vec::new()),
            queue: AtomicBool::new(true),
        })
    }

    /// A client configuration with every server as a seed node.
    pub fn config(&self, options: LockOptions) -> RedisConfig {
        let seeds = self
            .cluster
            .servers()
            .iter()
            .map(|s| RedisNode::new(s.addr().ip().to_string(), s.port()))
            .collect();
        let mut config = RedisConfig::cluster(seeds);
        config.options = options;
        // Grants unacknowledged, as the chaos expectations for this deployment assume:
        // a fresh cluster's replicas and two busy cores miss WAIT's deadline at times.
        // Acknowledged grants on a cluster are tested by
        // `replica_acknowledged_grants_wait_for_the_slots_replica`, the default by the
        // Sentinel suites.
        config.wait_replicas = Some(0);
        config.queue = self.queue.load(Ordering::Relaxed);
        config
    }

    /// A client of the cluster.
    pub async fn make(&self, options: LockOptions) -> Arc<RedisLock> {
        self.make_with(self.config(options)).await
    }

    /// A client with `config`.
    pub async fn make_with(&self, config: RedisConfig) -> Arc<RedisLock> {
        Arc::new(connect_patiently("connect", || RedisLock::connect(config.clone())).await)
    }

    /// A raw connection to the primary that serves `key`.
    pub async fn raw_owner(&self, key: &str) -> MultiplexedConnection {
        let owner = self.cluster.owner_of_key(key).await.expect("owner");
        raw(self.cluster.server(owner).addr()).await
    }

    /// Which primaries the cluster failed over since it formed (servers 0, 1, 2 serve
    /// slots 0, 5462 and 10924 first).
    pub async fn failed_over(&self) -> String {
        let mut moved = Vec::new();
        for (first, slot) in [0, 5462, 10924].into_iter().enumerate() {
            match self.cluster.owner_of(slot).await {
                Ok(owner) if owner == first => {}
                Ok(owner) => moved.push(format!("slot {slot}: server {first} -> {owner}")),
                Err(err) => moved.push(format!("slot {slot}: {err}")),
            }
        }
        if moved.is_empty() {
            "no failover".to_owned()
        } else {
            format!("failed over: {}", moved.join(", "))
        }
    }

    /// A client with an ACL user of its own on every node (each node keeps its users
    /// alone), and the user's name.
    async fn client_of_its_own(&self, options: LockOptions) -> (Arc<RedisLock>, String) {
        let user = format!("linked{}", self.users.fetch_add(1, Ordering::Relaxed));
        let failed = lock_out(&self.cluster, &user, false).await;
        assert!(failed.is_empty(), "create {user}: {failed:?}");
        let mut config = self.config(options);
        config.username = Some(user.clone());
        config.password = Some("secret".to_owned());
        (self.make_with(config).await, user)
    }
}

/// Bound on each ACL change at one node (a paused node is skipped).
const ACL_TIMEOUT: Duration = Duration::from_secs(2);

/// Locks ACL user `user` out of every running node (`ACL SETUSER off`, then `CLIENT KILL
/// USER`: its client cannot reconnect, so nothing it sends arrives) or, with `out` false,
/// lets it in again (recreated where a node restarted without it). What failed, by node.
async fn lock_out(cluster: &RedisCluster, user: &str, out: bool) -> Vec<String> {
    let mut failed = Vec::new();
    for server in cluster.servers().iter().filter(|s| s.is_running()) {
        let change = async {
            let mut conn = redis::Client::open(format!("redis://{}", server.addr()))?
                .get_multiplexed_async_connection()
                .await?;
            let mut setuser = redis::cmd("ACL");
            setuser.arg("SETUSER").arg(user);
            if out {
                setuser.arg("off");
            } else {
                setuser.arg(&["on", ">secret", "~*", "&*", "+@all"]);
            }
            let () = setuser.query_async(&mut conn).await?;
            if out {
                let _: i64 = redis::cmd("CLIENT")
                    .arg(&["KILL", "USER", user])
                    .query_async(&mut conn)
                    .await?;
            }
            Ok::<_, redis::RedisError>(())
        };
        match tokio::time::timeout(ACL_TIMEOUT, change).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => failed.push(format!("{}: {err}", server.addr())),
            Err(_) => failed.push(format!("{}: no answer in {ACL_TIMEOUT:?}", server.addr())),
        }
    }
    failed
}

/// A client cut off for good by [`lock_out`].
struct AclCrash {
    cluster: Arc<RedisCluster>,
    user: String,
}

#[async_trait]
impl Crash for AclCrash {
    async fn crash(&self) {
        let failed = lock_out(&self.cluster, &self.user, true).await;
        assert!(failed.is_empty(), "lock out {}: {failed:?}", self.user);
    }
}

/// The link of a client with an ACL user of its own, cut and healed by [`lock_out`] in a
/// task of its own that applies every change in order (a cut takes a few milliseconds; a
/// cut healed at once still kills the client's connections, as a reset does).
struct AclSwitch {
    wish: mpsc::UnboundedSender<bool>,
}

impl AclSwitch {
    fn spawn(cluster: Arc<RedisCluster>, user: String) -> Self {
        let (wish, mut wished) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(out) = wished.recv().await {
                let failed = lock_out(&cluster, &user, out).await;
                if !failed.is_empty() {
                    eprintln!("[chaos] lock {user} out ({out}): {failed:?}");
                }
            }
        });
        AclSwitch { wish }
    }
}

impl Switch for AclSwitch {
    fn set(&self, cut: bool) {
        // Fails only once the task is gone, with its runtime.
        let _ = self.wish.send(cut);
    }
}

redis_factory!(ClusterFactory);

impl ClusterFactory {
    /// Cluster factories keep the default key prefix.
    fn prefix(&self) -> &str {
        DEFAULT_PREFIX
    }

    fn deployment_url(&self) -> String {
        self.cluster.url()
    }

    async fn crashable(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, user) = self.client_of_its_own(options).await;
        let crash = AclCrash {
            cluster: Arc::clone(&self.cluster),
            user,
        };
        (client, Box::new(crash))
    }

    /// The primary that serves the key's slot keeps it.
    async fn owners(&self, key: &str) -> Vec<MultiplexedConnection> {
        vec![self.raw_owner(key).await]
    }
}

/// A linked client has an ACL user of its own, which its link locks out of every node
/// (`AclSwitch`): no fault proxy can stand in a cluster client's path, since every node
/// sends its clients on (`MOVED`, `ASK`) to the addresses the nodes announce. So the link
/// can be cut, not delayed or reset.
#[async_trait]
impl ChaosTarget for ClusterFactory {
    fn topology(&self) -> Topology {
        Topology::Replicated {
            shards: 3,
            replicas: 1,
            acked: 0,
        }
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (client, user) = self.client_of_its_own(options).await;
        let link = Link::Switched(Arc::new(AclSwitch::spawn(Arc::clone(&self.cluster), user)));
        self.links.lock().expect("links").push(link.clone());
        (client, link)
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
            Ok::<_, harness::HarnessError>(format!(
                "slot {slot} moved from server {from} to server {to} with {keys} keys"
            ))
        };
        Some(moved.await.map_err(|e| e.to_string()))
    }
}

/// The lock key of `name`.
pub fn key(name: &LockName) -> String {
    KeyLayout::new(DEFAULT_PREFIX).lock_key(name)
}

/// A fresh name for `test` whose lock key server `owner` serves.
pub async fn name_on(factory: &ClusterFactory, test: &str, owner: usize) -> LockName {
    for _ in 0..1000 {
        let candidate = unique_name(test);
        if factory
            .cluster
            .owner_of_key(&key(&candidate))
            .await
            .expect("owner")
            == owner
        {
            return candidate;
        }
    }
    panic!("no name of server {owner} in 1000 tries");
}

/// `key`'s value and PTTL on server `i` (`None` when it is not there).
pub async fn key_on(factory: &ClusterFactory, i: usize, key: &str) -> (Option<String>, i64) {
    let mut conn = raw(factory.cluster.server(i).addr()).await;
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    // A node that does not serve the key answers MOVED: then it is not there.
    pipe.query_async(&mut conn).await.unwrap_or((None, -2))
}

/// The sharded channels of `name` (its wake-up channels, `<prefix>{<lock key>}:*`) that
/// server `i` has subscribers for.
pub async fn shard_channels(factory: &ClusterFactory, i: usize, name: &LockName) -> Vec<String> {
    let mut conn = raw(factory.cluster.server(i).addr()).await;
    redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(format!("{DEFAULT_PREFIX}{{{}}}:*", key(name)))
        .query_async(&mut conn)
        .await
        .expect("PUBSUB SHARDCHANNELS")
}

/// How long a subscription may take to be made (again): a bound for a loaded machine,
/// not a speed (a resubscription after a slot moved waits for the client's next look at
/// the slot map; 2 s was once too short under `make test`'s four jobs on two cores).
const SUBSCRIBED_WITHIN: Duration = Duration::from_secs(10);

/// Polls until server `i` has `want` sharded channels of `name` subscribed, for at most
/// `SUBSCRIBED_WITHIN` (10 s): how long it took.
pub async fn await_shard_channels(
    factory: &ClusterFactory,
    i: usize,
    name: &LockName,
    want: usize,
) -> Duration {
    let started = Instant::now();
    loop {
        let seen = shard_channels(factory, i, name).await;
        if seen.len() == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < SUBSCRIBED_WITHIN,
            "server {i}: sharded channels of {name}: {seen:?}, want {want}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// `ASKING` calls on server `i` (`INFO commandstats`).
pub async fn asking_calls(factory: &ClusterFactory, i: usize) -> u64 {
    factory.cluster.command_calls(i, "asking").await
}

impl std::fmt::Debug for ClusterFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterFactory").finish_non_exhaustive()
    }
}
