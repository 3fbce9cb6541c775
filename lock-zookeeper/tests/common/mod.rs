//! The conformance factory for `zk://`: real ZooKeeper servers from the harness
//! (standalone or a 3-member ensemble), started for one factory and killed when it drops,
//! or shared by the factories of a test binary ([`ZkFactory::shared`]), each under a base
//! path of its own, and killed when the last of them drops.

// Not every test file uses every helper or re-export.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{connect_patiently, Crash, Factory};
use lab::chaos::{ChaosTarget, Link, ServerControl, Topology};
use lab::harness::{or_skip, Deployment, ZkEnsemble, ZkOptions, ZkServer, ZkTls, ZooKeeper};
use lab::proxy::FaultProxy;
use lab::shared::{namespace, Shared};
use lock_core::{
    DistributedLock, DistributedLockExt, LockGuard, LockName, LockOptions, LockState,
    ReleaseOutcome,
};
use lock_zookeeper::{lock_dir, queue_order, ZkConfig, ZkLock};
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

/// Creates each of `paths` as a persistent node open to anyone, unless it exists.
pub async fn create_persistent(admin: &zk::Client, paths: impl IntoIterator<Item = String>) {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for path in paths {
        match admin.create(&path, &[], &persistent).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(err) => panic!("create {path}: {err}"),
        }
    }
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

/// The lock nodes in `name`'s directory under [`BASE`], in queue order.
pub async fn queue(admin: &zk::Client, name: &LockName) -> Vec<String> {
    queue_under(admin, BASE, name).await
}

/// The lock nodes in `name`'s directory under `base`, in queue order.
pub async fn queue_under(admin: &zk::Client, base: &str, name: &LockName) -> Vec<String> {
    let dir = lock_dir(base, name);
    let children = match admin.list_children(&dir).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(err) => panic!("list {dir}: {err}"),
    };
    queue_order(&children)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The children of `dir`, sorted (none for a missing `dir`).
pub async fn children(admin: &zk::Client, dir: &str) -> Vec<String> {
    match admin.list_children(dir).await {
        Ok(mut children) => {
            children.sort_unstable();
            children
        }
        Err(zk::Error::NoNode) => Vec::new(),
        Err(err) => panic!("list {dir}: {err}"),
    }
}

/// Waits (at most 20 s) until `dir` has `n` children.
pub async fn children_reach(admin: &zk::Client, dir: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while children(admin, dir).await.len() != n {
        assert!(Instant::now() < deadline, "{dir} never had {n} children");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 20 s) until `name`'s queue has `n` lock nodes.
pub async fn queue_len_reaches(factory: &ZkFactory, name: &LockName, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while factory.queue(name).await.len() < n {
        assert!(
            Instant::now() < deadline,
            "queue of {name} never reached {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ends ZooKeeper session `session_id` on the server at `addr` the way its own client
/// would close it: a second connection resumes the session with its id and password
/// (ZooKeeper derives the password from the id, see [`session_password`]) and sends
/// `closeSession` right behind the connect request (the session's own client, whose
/// connection the server closes when another resumes the session, would otherwise take it
/// back at once). The server deletes the session's ephemeral nodes at once; the session's
/// client is told it expired when it reconnects.
///
/// # Panics
/// When the session still resumes after a few tries, or the server does not answer
/// within 10 s.
pub async fn expire_session(addr: std::net::SocketAddr, session_id: i64) {
    use tokio::io::AsyncReadExt;
    /// The `closeSession` request type.
    const CLOSE_SESSION: i32 = -11;
    let close = async {
        for _ in 0..5 {
            let mut stream = resume_session(addr, session_id).await;
            // RequestHeader: xid, type.
            let mut request = 1i32.to_be_bytes().to_vec();
            request.extend_from_slice(&CLOSE_SESSION.to_be_bytes());
            send_frame(&mut stream, &request).await;
            // Whatever comes back, until the server closes the connection.
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
            let mut check = resume_session(addr, session_id).await;
            if read_frame(&mut check)
                .await
                .is_some_and(|reply| resumed(&reply) == 0)
            {
                return;
            }
        }
        panic!("ZooKeeper session {session_id:#x} still resumes after closing it 5 times");
    };
    tokio::time::timeout(Duration::from_secs(10), close)
        .await
        .expect("ZooKeeper answers within 10 s");
}

/// A connection to `addr` that has sent the request resuming session `session_id`
/// (ConnectRequest: protocol version, last zxid seen, timeout in ms, session id, password,
/// read-only flag); its reply is left unread.
async fn resume_session(addr: std::net::SocketAddr, session_id: i64) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut connect = Vec::new();
    connect.extend_from_slice(&0i32.to_be_bytes());
    connect.extend_from_slice(&0i64.to_be_bytes());
    connect.extend_from_slice(&10_000i32.to_be_bytes());
    connect.extend_from_slice(&session_id.to_be_bytes());
    connect.extend_from_slice(&16i32.to_be_bytes());
    connect.extend_from_slice(&session_password(session_id));
    connect.push(0);
    send_frame(&mut stream, &connect).await;
    stream
}

/// The session id of a ConnectResponse (protocol version, timeout, session id, ...): 0
/// when the session could not be resumed.
fn resumed(reply: &[u8]) -> i64 {
    reply
        .get(8..16)
        .and_then(|id| id.try_into().ok())
        .map_or(0, i64::from_be_bytes)
}

/// Sends one length-prefixed frame.
async fn send_frame(stream: &mut tokio::net::TcpStream, body: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let len = i32::try_from(body.len()).expect("short frame");
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    stream.write_all(&frame).await.expect("send");
}

/// Reads one length-prefixed frame; `None` when the connection ends first.
async fn read_frame(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let len = stream.read_i32().await.ok()?;
    let mut body = vec![0; usize::try_from(len).ok()?];
    stream.read_exact(&mut body).await.ok()?;
    Some(body)
}

/// The password of ZooKeeper session `session_id`, as the server generates it:
/// `new java.util.Random(session_id ^ 0xB3415C00).nextBytes(new byte[16])`.
pub fn session_password(session_id: i64) -> [u8; 16] {
    const SUPER_SECRET: i64 = 0xB341_5C00;
    const MULTIPLIER: i64 = 0x5_DEEC_E66D;
    const MASK: i64 = (1 << 48) - 1;
    let mut seed = (session_id ^ SUPER_SECRET ^ MULTIPLIER) & MASK;
    let mut password = [0u8; 16];
    for chunk in password.chunks_mut(4) {
        seed = seed.wrapping_mul(MULTIPLIER).wrapping_add(0xB) & MASK;
        // `next(32)`: the top 32 of the 48 bits, least significant byte first.
        let word = (seed >> 16).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    password
}

/// The session that owns the first lock node of `name` (its holder's), if any.
pub async fn holder_session(admin: &zk::Client, name: &LockName) -> Option<i64> {
    let first = queue(admin, name).await.into_iter().next()?;
    let path = format!("{}/{first}", lock_dir(BASE, name));
    let stat = admin.check_stat(&path).await.expect("stat");
    stat.map(|stat| stat.ephemeral_owner)
}

/// What a test with Curator processes needs: the compiled program, a standalone server,
/// and one lock name without `/` with its directory `<base>/<name>`, the path Curator is
/// given.
pub struct CuratorSetup {
    /// Holds the compiled program.
    _classes: tempfile::TempDir,
    classpath: String,
    /// The server.
    pub factory: ZkFactory,
    /// The lock name.
    pub name: LockName,
    /// Its directory.
    pub path: String,
}

impl CuratorSetup {
    /// Compiles the program and starts the server; `None` (after a loud notice) when
    /// java, the Curator jars or ZooKeeper are missing and strict mode is off.
    pub async fn start(tag: &str) -> Option<Self> {
        let classes = tempfile::tempdir().expect("temp dir");
        let classpath = lab::curator::compile(classes.path()).await?;
        let factory = ZkFactory::start().await?;
        let name = LockName::new(format!("curator-{tag}-{}", uuid::Uuid::new_v4().simple()))
            .expect("valid");
        let path = lock_dir(BASE, &name);
        Some(CuratorSetup {
            _classes: classes,
            classpath,
            factory,
            name,
            path,
        })
    }

    /// A Curator process on the lock's path, ready.
    pub async fn curator(&self) -> lab::curator::Curator {
        let connect = self.factory.servers.hosts().join(",");
        lab::curator::Curator::start(&self.classpath, &connect, &self.path)
            .await
            .expect("curator starts")
    }
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
        lock_core::raw::register::<lock_zookeeper::ZkBackend>();
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

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let mut left = Vec::new();
        for name in names {
            let nodes = self.queue(name).await;
            if !nodes.is_empty() {
                left.push(format!("{name:?} has lock nodes {nodes:?}"));
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
