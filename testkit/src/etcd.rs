//! The conformance factory for `etcd://`: real etcd servers from the harness (a single
//! member or a 3-member cluster), started for one factory and killed when it drops, or,
//! for a side of a dual deployment, shared by the factories of a test binary
//! ([`EtcdFactory::shared_side`]), each under a key prefix of its own, and killed when the
//! last of them drops.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{connect_patiently, Crash, Factory, ServerLease};
use etcd_client::{Client, GetOptions, PutOptions};
use harness::shared::{namespace, Shared};
use harness::{or_skip, Deployment, Etcd, EtcdCluster, EtcdServer};
use lab::chaos::{ChaosTarget, Link, ServerControl, Topology};
use lock_core::{DistributedLock, LockName, LockOptions, OwnerToken};
use lock_etcd::{EtcdConfig, EtcdLock};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

/// The key prefix the suite's locks live under (a factory over a shared deployment uses
/// a prefix of its own below it).
pub const PREFIX: &str = "conformance";

/// The single member the factories of a test binary share.
static SINGLE: Shared<Servers> = Shared::new();

/// The servers behind a factory: a single member or a cluster.
pub type Servers = Deployment<Etcd>;

/// Debug logs of the backend and the core into the test's captured output (shown when a
/// test fails); `RUST_LOG` overrides the filter.
pub fn trace() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("lock_etcd=debug,lock_core=debug"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Starts a single member; `None` (after a loud notice) when etcd is not installed and
/// strict mode is off.
pub async fn single() -> Option<EtcdServer> {
    or_skip(EtcdServer::start().await)
}

/// Starts a 3-member cluster; `None` as for [`single`].
pub async fn cluster() -> Option<EtcdCluster> {
    or_skip(EtcdCluster::start().await)
}

/// A raw etcd client of `addrs`, for checks behind the library's back.
pub async fn raw_client(addrs: &[SocketAddr]) -> Client {
    let endpoints: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(5));
    Client::connect(endpoints, Some(options))
        .await
        .expect("raw etcd client connects")
}

/// Adds the user `root` with `password` and the `root` role (which auth needs before it
/// can be enabled), through `auth`.
pub async fn add_root(auth: &mut etcd_client::AuthClient, password: &str) {
    auth.user_add("root", password, None)
        .await
        .expect("add root");
    auth.user_grant_role("root", "root")
        .await
        .expect("grant root");
}

/// Adds `user` with `password` and a role of its own (named after it) that may read the
/// keys under `prefix` and nothing else, through `auth`.
pub async fn add_reader(
    auth: &mut etcd_client::AuthClient,
    user: &str,
    password: &str,
    prefix: &str,
) {
    auth.role_add(user).await.expect("add role");
    auth.role_grant_permission(user, etcd_client::Permission::read(prefix).with_prefix())
        .await
        .expect("grant a read");
    auth.user_add(user, password, None).await.expect("add user");
    auth.user_grant_role(user, user).await.expect("grant role");
}

/// Adds the user `root` with `password`, and each `(user, prefix)` of `readers` as
/// [`add_reader`] does (with `password` too), then enables authentication, through
/// `admin` (which needs credentials from then on).
pub async fn enable_auth(admin: &Client, password: &str, readers: &[(&str, &str)]) {
    let mut auth = admin.auth_client();
    add_root(&mut auth, password).await;
    for (user, prefix) in readers {
        add_reader(&mut auth, user, password, prefix).await;
    }
    auth.auth_enable().await.expect("enable auth");
}

/// Options with `ttl`.
pub use conformance::with_ttl;

/// A config for `addrs` under [`PREFIX`] with `options`.
pub fn config(addrs: &[SocketAddr], options: LockOptions) -> EtcdConfig {
    config_under(addrs, PREFIX, options)
}

/// A config for `addrs` under `prefix` with `options`.
pub fn config_under(addrs: &[SocketAddr], prefix: &str, options: LockOptions) -> EtcdConfig {
    EtcdConfig::new(addrs.iter().map(ToString::to_string))
        .with_prefix(prefix)
        .with_options(options)
}

/// A lock client of `addrs` under [`PREFIX`].
pub async fn client(addrs: &[SocketAddr], options: LockOptions) -> Arc<EtcdLock> {
    client_under(addrs, PREFIX, options).await
}

/// A lock client of `addrs` under `prefix`.
pub async fn client_under(
    addrs: &[SocketAddr],
    prefix: &str,
    options: LockOptions,
) -> Arc<EtcdLock> {
    let config = config_under(addrs, prefix, options);
    let client = connect_patiently("etcd lock client connects", || {
        EtcdLock::connect(config.clone())
    });
    Arc::new(client.await)
}

/// `etcdctl` (Debian's etcd-client, the Go client's recipes) as a child process, its
/// output read line by line; killed on drop.
#[derive(Debug)]
struct Etcdctl {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Etcdctl {
    /// Starts `etcdctl COMMAND ARGS...` against the member at `addr`.
    fn spawn(addr: SocketAddr, command: &str, args: &[&str]) -> Self {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://{addr}"))
            .arg(command)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl (Debian etcd-client) is needed for this test");
        let stdout = child.stdout.take().expect("piped stdout");
        Etcdctl {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next line etcdctl prints; `what` names the command when it exits instead.
    async fn next_line(&mut self, what: &str) -> String {
        match self.lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("etcdctl {what} exited early"),
            Err(err) => panic!("reading etcdctl output: {err}"),
        }
    }

    /// Interrupts etcdctl (SIGINT: it ends what it holds and closes its session) and
    /// reaps it.
    async fn interrupt(mut self) {
        let pid = self.child.id().expect("etcdctl runs");
        let pid = i32::try_from(pid).expect("pid fits");
        kill(Pid::from_raw(pid), Signal::SIGINT).expect("SIGINT etcdctl");
        timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("etcdctl exits after SIGINT")
            .expect("wait for etcdctl");
    }
}

/// `etcdctl lock NAME` as a child process; killed on drop.
#[derive(Debug)]
pub struct EtcdctlLock(Etcdctl);

impl EtcdctlLock {
    /// Starts `etcdctl lock NAME` against the member at `addr`.
    pub fn spawn(addr: SocketAddr, name: &str) -> Self {
        EtcdctlLock(Etcdctl::spawn(addr, "lock", &[name]))
    }

    /// The key etcdctl prints once it holds the lock, if it does within `limit`.
    pub async fn held_key(&mut self, limit: Duration) -> Option<String> {
        timeout(limit, self.0.next_line("lock")).await.ok()
    }

    /// Interrupts etcdctl (it releases its lock and closes its session) and reaps it.
    pub async fn interrupt(self) {
        self.0.interrupt().await;
    }
}

/// `etcdctl elect` as a child process (the Go client's `concurrency.Election` on a 60 s
/// session): a campaign, or with `-l` an observer; killed on drop.
#[derive(Debug)]
pub struct EtcdctlElect(Etcdctl);

impl EtcdctlElect {
    /// `etcdctl elect NAME PROPOSAL`: campaigns, prints its key and value once elected.
    pub fn campaign(addr: SocketAddr, name: &str, proposal: &str) -> Self {
        EtcdctlElect(Etcdctl::spawn(addr, "elect", &[name, proposal]))
    }

    /// `etcdctl elect -l NAME`: prints the key and value of each leader it observes.
    pub fn listen(addr: SocketAddr, name: &str) -> Self {
        EtcdctlElect(Etcdctl::spawn(addr, "elect", &["-l", name]))
    }

    /// The next (key, value) etcdctl prints, if it does within `limit`: for a campaign,
    /// its own key and proposal once elected; for an observer, the next leader or value.
    pub async fn next_leader(&mut self, limit: Duration) -> Option<(String, String)> {
        timeout(limit, async {
            let key = self.0.next_line("elect").await;
            (key, self.0.next_line("elect").await)
        })
        .await
        .ok()
    }

    /// Interrupts etcdctl (an elected one resigns, a campaigning one withdraws, and it
    /// closes its session) and reaps it.
    pub async fn interrupt(self) {
        self.0.interrupt().await;
    }
}

/// A lock client with no key prefix: lock `NAME` is exactly `etcdctl lock NAME`.
pub async fn plain_client(addr: SocketAddr) -> EtcdLock {
    let config = EtcdConfig::new([addr.to_string()]).with_options(with_ttl(Duration::from_secs(5)));
    EtcdLock::connect(config).await.expect("connect")
}

/// A fresh lease of `ttl_secs` that nobody keeps alive.
pub async fn go_lease(admin: &Client, ttl_secs: i64) -> i64 {
    let lease = admin.lease_client().grant(ttl_secs, None).await;
    lease.expect("lease").id()
}

/// A key as the Go client's `concurrency.Mutex` puts it.
#[derive(Debug, Clone)]
pub struct GoKey {
    /// `<range><lease hex>`.
    pub key: String,
    /// Its create revision.
    pub revision: i64,
    /// Its lease.
    pub lease: i64,
}

/// Puts a key in the lock range `range` as the Go client's `Mutex` does (empty value)
/// on a fresh lease of `ttl_secs` that nobody keeps alive.
pub async fn go_key(admin: &Client, range: &str, ttl_secs: i64) -> GoKey {
    let lease = go_lease(admin, ttl_secs).await;
    let key = format!("{range}{lease:x}");
    let put = admin
        .kv_client()
        .put(key.as_str(), "", Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("put a Go-client key");
    let revision = put.header().expect("header").revision();
    GoKey {
        key,
        revision,
        lease,
    }
}

/// Keys under `range`, with their create revisions.
pub async fn keys_under(admin: &Client, range: &str) -> Vec<(String, i64)> {
    let mut kv = admin.kv_client();
    let response = kv
        .get(range, Some(GetOptions::new().with_prefix()))
        .await
        .expect("range read");
    response
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        })
        .collect()
}

/// Clients of one etcd deployment.
pub struct EtcdFactory {
    /// The servers, this factory's own or shared with other factories.
    pub servers: Arc<Servers>,
    /// The key prefix of this factory's locks: [`PREFIX`], or a prefix of its own below
    /// it over a shared deployment ([`EtcdFactory::shared_side`]).
    prefix: String,
    admin: Client,
    proxies: Mutex<Vec<Link>>,
    /// Every client handed out, to tell their leases from leaked ones.
    clients: Mutex<Vec<Weak<EtcdLock>>>,
}

impl EtcdFactory {
    /// A factory over a fresh single member.
    pub async fn start() -> Option<Self> {
        let server = single().await?;
        Some(Self::over(Deployment::Single(Box::new(server))).await)
    }

    /// A factory over a fresh 3-member cluster; clients know every member.
    pub async fn start_cluster() -> Option<Self> {
        let cluster = cluster().await?;
        Some(Self::over(Deployment::Cluster(cluster)).await)
    }

    /// A factory over the single member the factories of this test binary share, started
    /// now if none runs, under a key prefix of its own: for a side of a dual deployment,
    /// whose leftovers are its keys only (`SideFactory::side_leftovers`). Its own
    /// [`leftovers`](Factory::leftovers) would count other factories' leases as leaked
    /// (leases have no prefix, and a client dropped at the end of a test leaves its lease
    /// until the TTL), so the etcd suite itself keeps a deployment per test.
    pub async fn shared_side() -> Option<Self> {
        let servers = SINGLE
            .get_or_start(|| async { Some(Deployment::Single(Box::new(single().await?))) })
            .await?;
        let mut factory = Self::over_arc(servers).await;
        factory.prefix = format!("{PREFIX}/{}", namespace());
        Some(factory)
    }

    async fn over(servers: Servers) -> Self {
        Self::over_arc(Arc::new(servers)).await
    }

    async fn over_arc(servers: Arc<Servers>) -> Self {
        lock_core::raw::driver::register::<lock_etcd::EtcdBackend>();
        let admin = raw_client(&servers.addrs()).await;
        EtcdFactory {
            servers,
            prefix: PREFIX.to_owned(),
            admin,
            proxies: Mutex::new(Vec::new()),
            clients: Mutex::new(Vec::new()),
        }
    }

    fn track(&self, client: &Arc<EtcdLock>) {
        self.clients
            .lock()
            .expect("clients")
            .push(Arc::downgrade(client));
    }

    /// Leases on the server that no live client of this factory uses: leaked by a
    /// closed client or a cancelled acquire.
    async fn leaked_leases(&self) -> Vec<String> {
        let live: Vec<i64> = self
            .clients
            .lock()
            .expect("clients")
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|client| client.backend().lease_id())
            .collect();
        let leases = self
            .admin
            .lease_client()
            .leases()
            .await
            .expect("lease list");
        leases
            .leases()
            .iter()
            .map(|lease| lease.id())
            .filter(|id| !live.contains(id))
            .map(|id| format!("lease {id:x} of no live client"))
            .collect()
    }

    /// The raw client used behind the library's back.
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// The key range of `name` under this factory's prefix.
    pub fn range(&self, name: &LockName) -> String {
        EtcdConfig::default()
            .with_prefix(&self.prefix)
            .lock_prefix(name)
    }
}

#[async_trait]
impl Factory for EtcdFactory {
    fn label(&self) -> String {
        match &*self.servers {
            Deployment::Single(server) => format!("etcd {}", server.addr()),
            Deployment::Cluster(cluster) => format!("etcd cluster {}", cluster.url()),
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self.servers.addrs().iter().map(|a| a.to_string()).collect();
        format!("etcd://{}/{}", hosts.join(","), self.prefix)
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        let client = client_under(&self.servers.addrs(), &self.prefix, options).await;
        self.track(&client);
        client
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, link) = self.linked_client(options).await;
        (client, Box::new(link))
    }

    async fn steal(&self, name: &LockName) {
        // Delete the holder's key (the lowest create revision): the next in line takes over.
        let range = self.range(name);
        let keys = keys_under(&self.admin, &range).await;
        if let Some((key, _)) = keys.iter().min_by_key(|(_, revision)| *revision) {
            let mut kv = self.admin.kv_client();
            kv.delete(key.as_str(), None).await.expect("steal: delete");
        }
    }

    /// The remaining TTL of the lease of the key under `name` whose value carries `owner`
    /// (a mutex, a permit, a reader or a writer); `Unknown` for a candidate, whose key
    /// holds its proposal.
    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        let mut kv = self.admin.kv_client();
        let range = self.range(name);
        let found = kv
            .get(range.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .expect("range read");
        let owner = owner.as_str().as_bytes();
        let Some(held) = found.kvs().iter().find(|kv| kv.value().ends_with(owner)) else {
            return ServerLease::Unknown;
        };
        let mut leases = self.admin.lease_client();
        let alive = leases
            .time_to_live(held.lease(), None)
            .await
            .expect("lease time to live");
        match u64::try_from(alive.ttl()) {
            Ok(seconds) => ServerLease::Left(Duration::from_secs(seconds)),
            Err(_) => ServerLease::Absent,
        }
    }

    /// etcd reports a lease's TTL in whole seconds, rounded down.
    fn lease_resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let mut left = Vec::new();
        for name in names {
            for (key, revision) in keys_under(&self.admin, &self.range(name)).await {
                left.push(format!("{name:?}: key {key} (create revision {revision})"));
            }
        }
        left.extend(self.leaked_leases().await);
        left
    }
}

#[async_trait]
impl ChaosTarget for EtcdFactory {
    fn topology(&self) -> Topology {
        match &*self.servers {
            Deployment::Single(_) => Topology::Single { durable: true },
            Deployment::Cluster(cluster) => Topology::Quorum {
                members: cluster.len(),
                reported_activity: false,
            },
        }
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (link, addrs) = Link::proxied(&self.servers.addrs()).await;
        let client = client_under(&addrs, &self.prefix, options).await;
        self.track(&client);
        self.proxies.lock().expect("proxies").push(link.clone());
        (client, link)
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.servers.controls()
    }

    async fn leader(&self) -> Option<usize> {
        self.servers.leader().await
    }
}

impl std::fmt::Debug for EtcdFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdFactory")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
