//! The conformance factory for `zk://`: real ZooKeeper servers from the harness
//! (standalone or a 3-member ensemble), started for one factory and killed when it drops,
//! or shared by the factories of a test binary ([`ZkFactory::shared`]), each under a base
//! path of its own, and killed when the last of them drops.
//!
//! Helpers that read ZooKeeper nodes are in `nodes.rs`, those that end a session from
//! outside in `session.rs`, the setup of a test with Curator in `curator.rs`.

mod curator;
mod nodes;
mod session;

pub use curator::CuratorSetup;
pub use nodes::{
    children, children_reach, create_persistent, queue, queue_len_reaches, queue_under,
    semaphore_nodes,
};
pub use session::{expire_session, holder_session, session_password};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{connect_patiently, Crash, Factory, ServerLease};
use harness::proxy::FaultProxy;
use harness::shared::{namespace, Shared};
use harness::{or_skip, Deployment, ZkEnsemble, ZkOptions, ZkServer, ZkTls, ZooKeeper};
use lab::chaos::{ChaosTarget, Link, ServerControl, Topology};
use lock_core::{
    DistributedLock, DistributedLockExt, LockGuard, LockName, LockOptions, LockState, OwnerToken,
    ReleaseOutcome,
};
use lock_zookeeper::{lock_dir, ZkConfig, ZkLock};
use tokio::time::Instant;
use zookeeper_client as zk;

/// The base path the suite's locks live under (a factory over a shared deployment uses
/// a path of its own below it).
pub const BASE: &str = "/conformance";

/// The deployments shared by the factories of a test binary.
static STANDALONE: Shared<Servers> = Shared::new();
static ENSEMBLE: Shared<Servers> = Shared::new();
static TLS_STANDALONE: Shared<Servers> = Shared::new();

/// The servers behind a factory: a standalone server or an ensemble.
pub type Servers = Deployment<ZooKeeper>;

/// Clients of one ZooKeeper deployment.
pub struct ZkFactory {
    /// The servers, this factory's own or shared with other factories.
    pub servers: Arc<Servers>,
    /// The base path of this factory's locks: [`BASE`], or a path of its own below it
    /// over a shared deployment.
    base: String,
    /// With TLS, lock clients talk `zks://` to the secure ports with these certificates
    /// (the admin client stays on the plain ports).
    pub tls: Option<ZkTls>,
    admin: zk::Client,
    proxies: Mutex<Vec<Arc<Vec<FaultProxy>>>>,
}

/// Starts a standalone server; `None` (after a loud notice) when ZooKeeper is not
/// installed and strict mode is off.
pub async fn standalone() -> Option<ZkServer> {
    or_skip(ZkServer::start().await)
}

/// Starts a 3-member ensemble with `options`; `None` as for [`standalone`].
pub async fn ensemble(options: ZkOptions) -> Option<ZkEnsemble> {
    or_skip(ZkEnsemble::start_with(options).await)
}

/// A raw client of `hosts`, for checks behind the library's back.
pub async fn raw_client(hosts: &[String]) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&hosts.join(","))
        .await
        .expect("raw ZooKeeper client connects")
}

/// A lock name under `tag` no other test uses.
pub use conformance::rules::unique_name;

/// Every state a guard goes through, recorded by a background task.
pub fn record_states(guard: &LockGuard) -> Arc<Mutex<Vec<(Instant, LockState)>>> {
    let states = Arc::new(Mutex::new(vec![(Instant::now(), guard.state())]));
    let mut watch = guard.watch();
    let log = Arc::clone(&states);
    tokio::spawn(async move {
        loop {
            let state = watch.changed().await;
            log.lock().expect("log").push((Instant::now(), state));
            if state.is_lost() {
                return;
            }
        }
    });
    states
}

/// The states recorded by [`record_states`].
pub fn seen(states: &Mutex<Vec<(Instant, LockState)>>) -> Vec<LockState> {
    states
        .lock()
        .expect("log")
        .iter()
        .map(|(_, s)| *s)
        .collect()
}

/// Hands lock `name` from `guard` to `waiter`: starts `waiter`'s wait in a task, checks
/// that it is still waiting 300 ms later, releases `guard` and returns the waiter's guard.
pub async fn hand_over(guard: LockGuard, waiter: &Arc<ZkLock>, name: &LockName) -> LockGuard {
    let waiting = tokio::spawn({
        let (waiter, name) = (Arc::clone(waiter), name.clone());
        async move {
            waiter
                .lock_timeout(name.as_str(), Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter waits for the holder");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    waiting
        .await
        .expect("the waiting task")
        .expect("the waiter gets the lock after the release")
}

/// Options with `ttl`.
pub use conformance::with_ttl;

/// A config for `hosts` under [`BASE`] with `options`.
pub fn config(hosts: Vec<String>, options: LockOptions) -> ZkConfig {
    let mut config = ZkConfig::new(hosts);
    config.prefix = BASE.to_owned();
    config.options = options;
    config
}

impl ZkFactory {
    /// A factory over a fresh standalone server.
    pub async fn start() -> Option<Self> {
        Self::start_with(ZkOptions::default()).await
    }

    /// A factory over a fresh standalone server started with `options`.
    pub async fn start_with(options: ZkOptions) -> Option<Self> {
        let server = or_skip(ZkServer::start_with(options).await)?;
        Some(Self::over(Deployment::Single(Box::new(server))).await)
    }

    /// A factory over the standalone server the factories of this test binary share,
    /// started now if none runs; its locks live under a base path of its own.
    pub async fn shared() -> Option<Self> {
        let servers = STANDALONE
            .get_or_start(|| async { Some(Deployment::Single(Box::new(standalone().await?))) })
            .await?;
        Some(Self::over_shared(servers, None).await)
    }

    /// A factory over the 3-member ensemble the factories of this test binary share, as
    /// [`ZkFactory::shared`].
    pub async fn shared_ensemble() -> Option<Self> {
        let servers = ENSEMBLE
            .get_or_start(|| async {
                Some(Deployment::Cluster(ensemble(ZkOptions::default()).await?))
            })
            .await?;
        Some(Self::over_shared(servers, None).await)
    }

    /// A factory over the standalone TLS server the factories of this test binary share
    /// (mutual TLS: it requires a client certificate), as [`ZkFactory::shared`]; its lock
    /// clients talk `zks://`.
    pub async fn shared_tls() -> Option<Self> {
        let servers = TLS_STANDALONE
            .get_or_start(|| async {
                let tls = ZkTls::make().await.expect("certificates").client_auth(true);
                let server = or_skip(ZkServer::start_with(ZkOptions::default().tls(tls)).await)?;
                Some(Deployment::Single(Box::new(server)))
            })
            .await?;
        let tls = servers.members()[0].tls().cloned();
        Some(Self::over_shared(servers, tls).await)
    }

    async fn over_shared(servers: Arc<Servers>, tls: Option<ZkTls>) -> Self {
        let mut factory = Self::over_arc(servers).await;
        factory.base = format!("{BASE}/{}", namespace());
        factory.tls = tls;
        factory
    }

    /// A factory over a fresh 3-member ensemble.
    pub async fn start_ensemble() -> Option<Self> {
        Self::start_ensemble_with(ZkOptions::default()).await
    }

    /// A factory over a fresh 3-member ensemble whose quorum links pass fault proxies
    /// ([`ZkOptions::peer_links`]), so that a follower can be cut off from its peers.
    pub async fn start_partitionable_ensemble() -> Option<Self> {
        Self::start_ensemble_with(ZkOptions::default().peer_links(true)).await
    }

    async fn start_ensemble_with(options: ZkOptions) -> Option<Self> {
        let ensemble = ensemble(options).await?;
        Some(Self::over(Deployment::Cluster(ensemble)).await)
    }

    /// A factory over a fresh standalone server whose lock clients talk TLS (`zks://`),
    /// with a client certificate when the server requires one.
    pub async fn start_tls(tls: ZkTls) -> Option<Self> {
        let options = ZkOptions::default().tls(tls.clone());
        let server = or_skip(ZkServer::start_with(options).await)?;
        let mut factory = Self::over(Deployment::Single(Box::new(server))).await;
        factory.tls = Some(tls);
        Some(factory)
    }

    /// A factory over a fresh 3-member ensemble serving TLS on each member's secure port,
    /// whose lock clients talk TLS (`zks://` to the three secure ports).
    pub async fn start_tls_ensemble(tls: ZkTls) -> Option<Self> {
        let mut factory = Self::start_ensemble_with(ZkOptions::default().tls(tls.clone())).await?;
        factory.tls = Some(tls);
        Some(factory)
    }

    async fn over(servers: Servers) -> Self {
        Self::over_arc(Arc::new(servers)).await
    }

    async fn over_arc(servers: Arc<Servers>) -> Self {
        lock_core::raw::driver::register::<lock_zookeeper::ZkBackend>();
        let admin = raw_client(&servers.hosts()).await;
        ZkFactory {
            servers,
            base: BASE.to_owned(),
            tls: None,
            admin,
            proxies: Mutex::new(Vec::new()),
        }
    }

    /// The addresses lock clients connect to: the secure ports with TLS.
    pub fn client_addrs(&self) -> Vec<std::net::SocketAddr> {
        let secure = |m: &ZkServer| m.secure_port().map(|p| ([127, 0, 0, 1], p).into());
        self.servers
            .members()
            .into_iter()
            .map(|m| match &self.tls {
                Some(_) => secure(m).expect("a TLS server has a secure port"),
                None => m.addr(),
            })
            .collect()
    }

    /// A lock client config for `hosts` with `options`, and TLS when the factory has it.
    pub fn config_for(&self, hosts: Vec<String>, options: LockOptions) -> ZkConfig {
        let mut config = config(hosts, options);
        config.prefix.clone_from(&self.base);
        if let Some(tls) = &self.tls {
            config.tls = true;
            config.ca_file = Some(tls.ca_file());
            config.cert_file = Some(tls.cert_file());
            config.key_file = Some(tls.key_file());
        }
        config
    }

    /// The admin client (a separate session).
    pub fn admin(&self) -> &zk::Client {
        &self.admin
    }

    /// The base path of this factory's locks.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The lock nodes in `name`'s directory under this factory's base path, in queue order.
    pub async fn queue(&self, name: &LockName) -> Vec<String> {
        queue_under(&self.admin, &self.base, name).await
    }

    /// A concrete client with `options`.
    pub async fn zk_client(&self, options: LockOptions) -> Arc<ZkLock> {
        let hosts = self
            .client_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        let config = self.config_for(hosts, options);
        let client = connect_patiently("zk client connects", || ZkLock::connect(config.clone()));
        Arc::new(client.await)
    }

    /// A concrete client that reaches every server through its own fault proxy.
    pub async fn proxied_client(
        &self,
        options: LockOptions,
    ) -> (Arc<ZkLock>, Arc<Vec<FaultProxy>>) {
        let (link, addrs) = Link::proxied(&self.client_addrs()).await;
        let Link::Proxies(proxies) = link else {
            unreachable!("a proxied link is made of proxies")
        };
        self.proxies
            .lock()
            .expect("proxies")
            .push(Arc::clone(&proxies));
        let hosts = addrs.iter().map(ToString::to_string).collect();
        let config = self.config_for(hosts, options);
        let client = connect_patiently("proxied zk client connects", || {
            ZkLock::connect(config.clone())
        });
        (Arc::new(client.await), proxies)
    }
}

#[async_trait]
impl Factory for ZkFactory {
    fn label(&self) -> String {
        let kind = if self.tls.is_some() {
            "zookeeper-tls"
        } else {
            "zookeeper"
        };
        format!("{kind} {}", self.servers.hosts().join(","))
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .client_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        let scheme = if self.tls.is_some() { "zks" } else { "zk" };
        format!("{scheme}://{}{}", hosts.join(","), self.base)
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        self.zk_client(options).await
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, proxies) = self.proxied_client(options).await;
        (client, Box::new(Link::Proxies(proxies)))
    }

    async fn steal(&self, name: &LockName) {
        let dir = lock_dir(&self.base, name);
        if let Some(holder) = self.queue(name).await.first() {
            match self.admin.delete(&format!("{dir}/{holder}"), None).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(err) => panic!("steal {dir}/{holder}: {err}"),
            }
        }
    }

    /// The session timeout a server negotiated for the session that owns the node of
    /// `owner` under `name` (in the lock directory or one level below it): the longest
    /// the server keeps that node once it stops hearing from the client. `Unknown` where
    /// no node carries the owner token or no server lists the session.
    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        let dir = lock_dir(&self.base, name);
        let mut dirs = vec![dir.clone()];
        let mut found = None;
        while let Some(dir) = dirs.pop() {
            for child in nodes::children(&self.admin, &dir).await {
                let path = format!("{dir}/{child}");
                if child.contains(owner.as_str()) {
                    found = Some(path);
                    break;
                }
                if dir == lock_dir(&self.base, name) {
                    dirs.push(path);
                }
            }
        }
        let Some(path) = found else {
            return ServerLease::Unknown;
        };
        let session = match self.admin.check_stat(&path).await {
            Ok(Some(stat)) => stat.ephemeral_owner,
            Ok(None) => return ServerLease::Absent,
            Err(err) => panic!("stat {path}: {err}"),
        };
        let sid = format!("sid=0x{session:x},");
        for server in self.servers.members() {
            let Ok(connections) = server.four_letter("cons").await else {
                continue;
            };
            let timeout = connections
                .lines()
                .filter(|line| line.contains(&sid))
                .find_map(|line| {
                    line.split("to=")
                        .nth(1)?
                        .split([',', ')'])
                        .next()?
                        .parse()
                        .ok()
                });
            if let Some(ms) = timeout {
                return ServerLease::Left(Duration::from_millis(ms));
            }
        }
        ServerLease::Unknown
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let mut left = Vec::new();
        for name in names {
            let nodes = self.queue(name).await;
            if !nodes.is_empty() {
                left.push(format!("{name:?} has lock nodes {nodes:?}"));
            }
            let permits = semaphore_nodes(&self.admin, &self.base, name).await;
            if !permits.is_empty() {
                left.push(format!("{name:?} has semaphore nodes {permits:?}"));
            }
        }
        left
    }
}

#[async_trait]
impl ChaosTarget for ZkFactory {
    fn topology(&self) -> Topology {
        match &*self.servers {
            Deployment::Single(_) => Topology::Single { durable: true },
            Deployment::Cluster(e) => Topology::Quorum {
                members: e.len(),
                reported_activity: true,
            },
        }
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (client, proxies) = self.proxied_client(options).await;
        (client, Link::Proxies(proxies))
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.servers.controls()
    }

    async fn leader(&self) -> Option<usize> {
        self.servers.leader().await
    }

    async fn follower_link(
        &self,
        options: LockOptions,
    ) -> Option<(Arc<dyn DistributedLock>, Link)> {
        let Deployment::Cluster(ensemble) = &*self.servers else {
            return None;
        };
        let leader = ensemble.leader().await.ok()?;
        let follower = (leader + 1) % ensemble.len();
        let links = ensemble.peer_links(follower).ok()?;
        let hosts = vec![ensemble.member(follower).connect_string()];
        let mut config = config(hosts, options);
        config.prefix.clone_from(&self.base);
        let client = ZkLock::connect(config)
            .await
            .expect("a client of one follower connects");
        Some((Arc::new(client), Link::Proxies(links)))
    }
}

impl std::fmt::Debug for ZkFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkFactory")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}
