//! What lockbench measures: one target per backend, with its servers, its lock URL and
//! the raw protocol floor on the same servers.

use std::any::Any;
use std::time::Duration;

use std::net::SocketAddr;

use async_trait::async_trait;
use harness::{
    EtcdServer, HarnessError, PostgresOptions, PostgresServer, RedisCluster, RedisNodes,
    RedisOptions, RedisSentinel, RedisServer, ZkEnsemble, ZkOptions, ZkServer, ZkTls,
};

use crate::error::BoxError;
use crate::floors::FloorSpec;

/// A backend under test.
pub(crate) struct Target {
    /// Short label (`memory`, `redis`, `redlock-5`, `zookeeper`, `etcd`, …).
    pub(crate) label: String,
    /// URL of the lock service; workloads append their own query options.
    pub(crate) url: String,
    /// The raw protocol floor on the same servers, if the backend has one.
    pub(crate) floor: Option<FloorSpec>,
    /// Whether a holder in another process can be killed (not for in-process backends).
    pub(crate) cross_process: bool,
    /// Shortest TTL for the takeover workloads (the mutex's and the election's).
    pub(crate) takeover_ttl: Duration,
    /// Whether the backend grants election candidates (`Capabilities::election`), as a
    /// client says once the servers are up ([`Target::check_capabilities`]).
    pub(crate) elections: bool,
    /// Whether it grants semaphore permits (`Capabilities::semaphore`), likewise.
    pub(crate) semaphores: bool,
    /// Whether it grants several permits in one hold (`Capabilities::semaphore_many`),
    /// likewise.
    pub(crate) semaphores_many: bool,
    /// Whether it grants read-write locks (`Capabilities::rwlock`), likewise.
    pub(crate) rwlocks: bool,
    /// The servers' request counter, for the renewal workload.
    pub(crate) requests: Option<Box<dyn RequestCounter>>,
    /// Servers kept alive for the run.
    pub(crate) servers: Vec<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.label)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The URL with `query` appended (to each side of a `dual:` URL, whose sides must
    /// agree on the lock options).
    pub(crate) fn url_with(&self, query: &str) -> String {
        if query.is_empty() {
            return self.url.clone();
        }
        match self.url.strip_prefix(DUAL_PREFIX) {
            Some(sides) => {
                let sides: Vec<String> = sides.split('|').map(|s| format!("{s}?{query}")).collect();
                format!("{DUAL_PREFIX}{}", sides.join("|"))
            }
            None if self.url.contains('?') => format!("{}&{query}", self.url),
            None => format!("{}?{query}", self.url),
        }
    }

    /// The space of an in-process (`memory://`) target, whose clients lockbench can also
    /// open itself to cut them off.
    pub(crate) fn memory_space(&self) -> Option<&str> {
        self.url.strip_prefix(MEMORY_PREFIX)
    }

    /// Asks a client whether this backend grants election candidates, semaphores (one
    /// permit a hold, or several) and read-write locks, and records it.
    pub(crate) async fn check_capabilities(&mut self) -> Result<(), BoxError> {
        let client =
            tokio::time::timeout(Duration::from_secs(30), distlock::connect(&self.url)).await??;
        let offered = client.capabilities();
        self.elections = offered.election;
        self.semaphores = offered.semaphore;
        self.semaphores_many = offered.semaphore && offered.semaphore_many;
        self.rwlocks = offered.rwlock;
        Ok(())
    }
}

/// The prefix of an in-process target's URL: `memory://<space>`.
const MEMORY_PREFIX: &str = "memory://";

/// The backends lockbench knows, in report order. Measured only when asked for:
/// `redis-cluster` (three primaries with a replica each, `redis+cluster://`, grants not
/// waiting for a replica: `wait_replicas=0`), `redis-sentinel` (a primary with two
/// replicas behind three Sentinels, `redis+sentinel://`, `wait_replicas=0`),
/// `redis-sentinel-wait1` (the same, each grant waiting for one replica's acknowledgement:
/// `wait_replicas=1`), `redis-sentinel-default` (the same with the default: a grant asks
/// the primary's `ROLE` and waits for one replica where it lists any), `zookeeper-3` (a 3-member ensemble, the
/// client on a follower) and `zookeeper-tls` (`zks://`, one server, TLS with a private CA).
/// `postgres` is one PostgreSQL server (`postgres://`, the locks in schema `lockbench`).
/// `file` is a directory of lock files of its own in the temp dir (`file://`, no server).
/// `dual` is the migration lock from ZooKeeper to Redis (`dual:zk://…|redis://…`) on
/// servers of its own.
pub(crate) const BACKENDS: &[&str] = &[
    "memory",
    "redis",
    "redis-cluster",
    "redis-sentinel",
    "redis-sentinel-wait1",
    "redis-sentinel-default",
    "redlock",
    "zookeeper",
    "zookeeper-3",
    "zookeeper-tls",
    "etcd",
    "postgres",
    "file",
    "dual",
];

/// The `file` target's directory, removed with the target.
struct LockDir(std::path::PathBuf);

impl LockDir {
    fn create() -> std::io::Result<Self> {
        let name = format!("lockbench-file-{}", uuid::Uuid::new_v4().simple());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir(&dir)?;
        Ok(LockDir(dir))
    }
}

impl Drop for LockDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The prefix of a migration lock's URL: `dual:<old url>|<new url>`.
const DUAL_PREFIX: &str = "dual:";
/// The sides of lockbench's `dual` target, old then new.
pub(crate) const DUAL_SIDES: [&str; 2] = ["zookeeper", "redis"];

/// TTL of the takeover workload on networked backends (etcd leases are whole seconds).
const TAKEOVER_TTL: Duration = Duration::from_secs(2);

/// Counts the requests a server (or set of servers) has processed, from the server's
/// own statistics: Redis `INFO stats`, ZooKeeper `mntr`, etcd `/metrics`, PostgreSQL
/// `pg_stat_statements`.
#[async_trait]
pub(crate) trait RequestCounter: Send + Sync {
    /// Requests processed so far, not counting the ones this counter sent.
    async fn requests(&self) -> Result<u64, BoxError>;
}

struct RedisCounter {
    conns: Vec<redis::aio::MultiplexedConnection>,
}

impl RedisCounter {
    async fn connect(urls: &[String]) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        for url in urls {
            conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        Ok(RedisCounter { conns })
    }
}

#[async_trait]
impl RequestCounter for RedisCounter {
    async fn requests(&self) -> Result<u64, BoxError> {
        // Commands a script runs count in the statistics too: count only what clients send
        // (scripts, and the pings that keep subscriptions alive).
        let mut total = 0;
        for conn in &self.conns {
            let mut conn = conn.clone();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await?;
            for command in ["evalsha", "eval", "ping"] {
                let key = format!("cmdstat_{command}:calls=");
                if let Some(line) = info.lines().find(|l| l.starts_with(&key)) {
                    let calls = line[key.len()..].split(',').next().unwrap_or("0");
                    total += calls.parse::<u64>()?;
                }
            }
        }
        Ok(total)
    }
}

/// The sum of several servers' counters (both sides of a dual lock).
struct SumCounter(Vec<Box<dyn RequestCounter>>);

#[async_trait]
impl RequestCounter for SumCounter {
    async fn requests(&self) -> Result<u64, BoxError> {
        let mut total = 0;
        for counter in &self.0 {
            total += counter.requests().await?;
        }
        Ok(total)
    }
}

struct ZkCounter {
    addrs: Vec<SocketAddr>,
}

#[async_trait]
impl RequestCounter for ZkCounter {
    async fn requests(&self) -> Result<u64, BoxError> {
        // Four-letter words are not counted as packets, nor is traffic between members.
        let mut total = 0;
        for addr in &self.addrs {
            let text = raw_exchange(*addr, b"mntr").await?;
            total += stat(&text, "zk_packets_received")?;
        }
        Ok(total)
    }
}

struct EtcdCounter {
    addr: SocketAddr,
}

#[async_trait]
impl RequestCounter for EtcdCounter {
    async fn requests(&self) -> Result<u64, BoxError> {
        // HTTP requests for /metrics are not gRPC messages, so they are not counted.
        let text = raw_exchange(self.addr, b"GET /metrics HTTP/1.0\r\n\r\n").await?;
        let mut total = 0.0;
        for line in text.lines() {
            if line.starts_with("grpc_server_msg_received_total{") {
                if let Some(value) = line.rsplit(' ').next() {
                    total += value.parse::<f64>()?;
                }
            }
        }
        // Counters are whole numbers, printed as floats by the metrics library.
        Ok(format!("{total:.0}").parse()?)
    }
}

/// Statements a PostgreSQL server has executed, from `pg_stat_statements` (loaded at
/// start): the statements clients send (a pipelined transaction counts each of its
/// statements, `BEGIN` and `COMMIT` included), which is what the renewal workload
/// counts: one batched `UPDATE` per renewal interval. Shared memory, updated as each
/// statement ends (unlike `pg_stat_database`, flushed lazily).
struct PgCounter {
    conninfo: String,
}

#[async_trait]
impl RequestCounter for PgCounter {
    async fn requests(&self) -> Result<u64, BoxError> {
        let count = async {
            let (client, connection) =
                tokio_postgres::connect(&self.conninfo, tokio_postgres::NoTls).await?;
            let driver = tokio::spawn(connection);
            // This query is not counted: it names the view, as no client statement does.
            let row = client
                .query_one(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
                     WHERE query NOT LIKE '%pg_stat_statements%'",
                    &[],
                )
                .await?;
            drop(client);
            let _ = driver.await;
            Ok::<_, BoxError>(u64::try_from(row.get::<_, i64>(0))?)
        };
        tokio::time::timeout(Duration::from_secs(5), count)
            .await
            .map_err(|_| "pg_stat_statements did not answer within 5s")?
    }
}

/// The number after `key` on its line of `text`.
fn stat(text: &str, key: &str) -> Result<u64, BoxError> {
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .ok_or_else(|| format!("no {key} in server statistics"))?;
    let value = line[key.len()..].trim_matches(|c: char| c == ':' || c.is_whitespace());
    Ok(value.parse()?)
}

/// Sends `request` on a fresh connection and reads until the server closes it.
async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Result<String, BoxError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(request).await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    Ok(tokio::time::timeout(Duration::from_secs(5), exchange).await??)
}

fn harness(err: HarnessError) -> String {
    format!("cannot start its servers: {err}")
}

/// A target on servers of the network, holding nothing yet.
fn networked(
    label: &str,
    url: String,
    floor: FloorSpec,
    requests: Box<dyn RequestCounter>,
) -> Target {
    Target {
        requests: Some(requests),
        ..cross_process(label, url, Some(floor))
    }
}

/// A target whose holders may be processes of their own, before the capabilities are
/// asked ([`Target::check_capabilities`]), with no request counter nor servers yet.
fn cross_process(label: &str, url: String, floor: Option<FloorSpec>) -> Target {
    Target {
        label: label.into(),
        url,
        floor,
        cross_process: true,
        takeover_ttl: TAKEOVER_TTL,
        elections: false,
        semaphores: false,
        semaphores_many: false,
        rwlocks: false,
        requests: None,
        servers: Vec::new(),
    }
}

fn counter_err(e: BoxError) -> String {
    format!("request counter client failed: {e}")
}

/// A Redis target whose clients send their scripts to the servers at `counted` (for the
/// renewal workload's request count), kept alive by `servers`.
async fn redis_target(
    label: &str,
    url: String,
    floor: FloorSpec,
    counted: &[String],
    servers: Box<dyn Any + Send + Sync>,
) -> Result<Target, String> {
    let counter = RedisCounter::connect(counted).await.map_err(counter_err)?;
    let mut target = networked(label, url, floor, Box::new(counter));
    target.servers.push(servers);
    Ok(target)
}

/// Each primary of `cluster` (its URL) with a hash tag whose slot it serves: the raw
/// floor's keys carry one, so that each goes straight to its primary.
async fn cluster_shards(cluster: &RedisCluster) -> Result<Vec<(String, String)>, HarnessError> {
    // Three primaries, each with a replica.
    let primaries = cluster.servers().len() / 2;
    let mut shards: Vec<(usize, String)> = Vec::new();
    for n in 0..256 {
        if shards.len() == primaries {
            break;
        }
        let tag = format!("{{{n}}}");
        let owner = cluster.owner_of(cluster.slot_of(&tag).await?).await?;
        if !shards.iter().any(|(server, _)| *server == owner) {
            shards.push((owner, tag));
        }
    }
    Ok(shards
        .into_iter()
        .map(|(server, tag)| (cluster.server(server).url(), tag))
        .collect())
}

/// Starts what `backend` needs on this machine, or says why it cannot.
pub(crate) async fn start(backend: &str) -> Result<Target, String> {
    let scheme = match backend {
        "redis" => "redis",
        "redis-cluster" => "redis+cluster",
        "redis-sentinel" | "redis-sentinel-wait1" | "redis-sentinel-default" => "redis+sentinel",
        "redlock" => "redlock",
        "zookeeper" | "zookeeper-3" => "zk",
        "zookeeper-tls" => "zks",
        "etcd" => "etcd",
        "postgres" => "postgres",
        "file" => "file",
        // Each side is checked when it starts.
        "dual" => "dual",
        _ => "memory",
    };
    if scheme != "dual"
        && !distlock::raw::driver::registry()
            .schemes()
            .iter()
            .any(|s| s == scheme)
    {
        return Err(format!("no backend serves {scheme}:// in this build"));
    }
    match backend {
        "memory" => Ok(Target {
            label: "memory".into(),
            url: format!("{MEMORY_PREFIX}lockbench-{}", uuid::Uuid::new_v4().simple()),
            floor: None,
            cross_process: false,
            takeover_ttl: Duration::from_secs(1),
            elections: false,
            semaphores: false,
            semaphores_many: false,
            rwlocks: false,
            requests: None,
            servers: Vec::new(),
        }),
        "redis" => {
            let server = RedisServer::start().await.map_err(harness)?;
            let url = server.url();
            let floor = FloorSpec::Redis(url.clone());
            redis_target("redis", url.clone(), floor, &[url], Box::new(server)).await
        }
        "redis-cluster" => {
            let cluster = RedisCluster::start().await.map_err(harness)?;
            let shards = cluster_shards(&cluster).await.map_err(harness)?;
            let primaries: Vec<String> = shards.iter().map(|(url, _)| url.clone()).collect();
            let floor = FloorSpec::RedisCluster(shards);
            // Grants unacknowledged (`wait_replicas=0`), as the floor's.
            let url = format!("{}?wait_replicas=0", cluster.url());
            redis_target(backend, url, floor, &primaries, Box::new(cluster)).await
        }
        "redis-sentinel" | "redis-sentinel-wait1" | "redis-sentinel-default" => {
            let deployment = RedisSentinel::start().await.map_err(harness)?;
            // The floor runs on the primary itself, with no discovery in front.
            let primary = deployment.server(0).url();
            let (url, floor) = match backend {
                "redis-sentinel-wait1" => (
                    format!("{}?wait_replicas=1", deployment.url()),
                    FloorSpec::RedisWait(primary.clone(), 1),
                ),
                // The default: the floor waits for the replica, not for the ROLE asked
                // before, so the ratio shows what that question costs.
                "redis-sentinel-default" => {
                    (deployment.url(), FloorSpec::RedisWait(primary.clone(), 1))
                }
                _ => (
                    format!("{}?wait_replicas=0", deployment.url()),
                    FloorSpec::Redis(primary.clone()),
                ),
            };
            redis_target(backend, url, floor, &[primary], Box::new(deployment)).await
        }
        "redlock" => {
            let nodes = RedisNodes::start_with(RedisOptions::default().members(5))
                .await
                .map_err(harness)?;
            let counter = RedisCounter::connect(&nodes.urls())
                .await
                .map_err(counter_err)?;
            let floor = FloorSpec::RedisQuorum(nodes.urls());
            let mut target = networked("redlock-5", nodes.url(), floor, Box::new(counter));
            target.servers.push(Box::new(nodes));
            Ok(target)
        }
        "zookeeper" => {
            let server = ZkServer::start().await.map_err(harness)?;
            let floor = FloorSpec::ZooKeeper(server.connect_string());
            let counter = ZkCounter {
                addrs: vec![server.addr()],
            };
            let url = format!("{}/lockbench", server.url());
            let mut target = networked("zookeeper", url, floor, Box::new(counter));
            target.servers.push(Box::new(server));
            Ok(target)
        }
        "zookeeper-tls" => {
            let tls = ZkTls::make().await.map_err(harness)?;
            let options = ZkOptions::default().tls(tls.clone());
            let server = ZkServer::start_with(options).await.map_err(harness)?;
            let port = server
                .secure_port()
                .ok_or("the TLS server has no secure port")?;
            let hosts = format!("127.0.0.1:{port}");
            let ca_file = tls.ca_file();
            let url = format!("zks://{hosts}/lockbench?ca_file={}", ca_file.display());
            let floor = FloorSpec::ZooKeeperTls(hosts, ca_file);
            let counter = ZkCounter {
                addrs: vec![server.addr()],
            };
            let mut target = networked("zookeeper-tls", url, floor, Box::new(counter));
            target.servers.push(Box::new(server));
            target.servers.push(Box::new(tls));
            Ok(target)
        }
        "zookeeper-3" => {
            let ensemble = ZkEnsemble::start().await.map_err(harness)?;
            let leader = ensemble.leader().await.map_err(harness)?;
            // On a follower: what the leader orders travels one more hop.
            let follower = ensemble.member((leader + 1) % ensemble.len());
            let floor = FloorSpec::ZooKeeper(follower.connect_string());
            let counter = ZkCounter {
                addrs: ensemble.members().iter().map(ZkServer::addr).collect(),
            };
            let url = format!("{}/lockbench", follower.url());
            let mut target = networked("zookeeper-3", url, floor, Box::new(counter));
            target.servers.push(Box::new(ensemble));
            Ok(target)
        }
        "etcd" => {
            let server = EtcdServer::start().await.map_err(harness)?;
            let floor = FloorSpec::Etcd(vec![server.endpoint()]);
            let counter = EtcdCounter {
                addr: server.addr(),
            };
            let url = format!("{}/lockbench", server.url());
            let mut target = networked("etcd", url, floor, Box::new(counter));
            target.servers.push(Box::new(server));
            Ok(target)
        }
        "postgres" => {
            // pg_stat_statements counts the statements clients send (the request counter).
            // A lock client keeps a pooled connection and a listening one: the sweep's 256
            // contenders need more than the harness's 200.
            let options = PostgresOptions::default()
                .setting("shared_preload_libraries", "pg_stat_statements")
                .setting("max_connections", 1000);
            let server = PostgresServer::start_with(options).await.map_err(harness)?;
            server
                .query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .await
                .map_err(harness)?;
            let floor = FloorSpec::Postgres(server.conninfo());
            let counter = PgCounter {
                conninfo: server.conninfo(),
            };
            let url = format!("{}?schema=lockbench", server.url());
            let mut target = networked("postgres", url, floor, Box::new(counter));
            target.servers.push(Box::new(server));
            Ok(target)
        }
        "file" => {
            let dir = LockDir::create().map_err(|e| format!("lock directory: {e}"))?;
            let url = format!("file://{}", dir.0.display());
            let floor = FloorSpec::File(dir.0.clone());
            Ok(Target {
                servers: vec![Box::new(dir)],
                ..cross_process("file", url, Some(floor))
            })
        }
        "dual" => {
            let [old, new] = DUAL_SIDES;
            let old = Box::pin(start(old)).await?;
            let new = Box::pin(start(new)).await?;
            let floors = [&old, &new].map(|side| side.floor.clone());
            let counters = [old.requests, new.requests];
            let url = format!("{DUAL_PREFIX}{}|{}", old.url, new.url);
            let floor = match floors {
                [Some(old), Some(new)] => Some(FloorSpec::Dual(Box::new([old, new]))),
                _ => None,
            };
            Ok(Target {
                requests: Some(Box::new(SumCounter(
                    counters.into_iter().flatten().collect(),
                ))),
                servers: old.servers.into_iter().chain(new.servers).collect(),
                ..cross_process("dual", url, floor)
            })
        }
        other => Err(format!(
            "unknown backend `{other}` (known: {})",
            BACKENDS.join(", ")
        )),
    }
}
