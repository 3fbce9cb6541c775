//! ZooKeeper (the jar of Debian package `libzookeeper-java`, run with `java`) as a
//! [`ServerKind`]: a standalone server ([`ZkServer`]) and an ensemble ([`ZkEnsemble`])
//! whose quorum links can pass fault proxies, to cut a member off from its peers.
//!
//! (Over 500 lines: ZooKeeper needs more than the other kinds, a JVM class path, start
//! slots, four-letter words and peer links; each is the ZooKeeper half of a harness
//! piece, kept beside the others.)

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::clock::ClockHook;
use super::cluster::Cluster;
use super::majority;
use super::node::Node;
use super::probe::{four_letter, zk_mode_line, Probe};
use super::process::{find_binary, LaunchSpec};
use super::server::{loopback, Member, Prepared, Server, ServerKind};
use super::tls::make_certificates;
use super::{create_dir, temp_dir, write_file, HarnessError, DEFAULT_READY_TIMEOUT};
use crate::proxy::{FaultProxy, ProxyMode};

const HINT: &str = "make deps (installs libzookeeper-java)";
const JAVA_HINT: &str = "apt-get install default-jre-headless";
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// Where the Debian packages put the jars.
const JAR_DIRS: [&str; 3] = [
    "/usr/share/java",
    "/usr/share/zookeeper",
    "/usr/share/zookeeper/lib",
];
/// Netty jars that the Netty connection factory needs beyond zookeeper.jar's manifest.
const NETTY_EXTRA_JARS: [&str; 2] = ["netty-codec.jar", "netty-resolver.jar"];
/// JVMs starting at once, process-wide (a start is CPU-heavy).
const JVM_STARTS: usize = 3;
/// Bound on one four-letter-word exchange.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on waiting for a JVM start slot.
const START_SLOT_TIMEOUT: Duration = Duration::from_secs(180);

static JVM_START_SLOTS: LazyLock<Semaphore> = LazyLock::new(|| Semaphore::new(JVM_STARTS));

/// Options for [`ZkServer`] and [`ZkEnsemble`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZkOptions {
    /// `tickTime`. Default: 500 ms.
    pub tick_time: Duration,
    /// `syncLimit` in ticks: how long a follower serves without hearing from its leader
    /// (and a leader without a quorum) before it gives up. Default: 5.
    pub sync_limit: u32,
    /// `minSessionTimeout`. Default: 1 s.
    pub min_session_timeout: Duration,
    /// `maxSessionTimeout`. Default: 60 s.
    pub max_session_timeout: Duration,
    /// JVM maximum heap in MiB (`-Xmx`). Default: 256.
    pub heap_mb: u32,
    /// Ensemble size (odd); ignored by [`ZkServer`]. Default: 3.
    pub members: usize,
    /// Bound on the readiness wait. Default: [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Ensemble only: every member reaches each peer's quorum port through a fault proxy
    /// of the ensemble, so that [`ZkEnsemble::partition`] can cut a member off from its
    /// peers while its clients still reach it. Default: off.
    pub peer_links: bool,
    /// Serve TLS on a secure client port too ([`ZkServer::secure_port`]), beside the
    /// plain one. Default: none.
    pub tls: Option<ZkTls>,
    /// Start on a wall clock the harness moves ([`ZkServer::jump_clock`]):
    /// `System.currentTimeMillis` follows it, `System.nanoTime` (which times sessions)
    /// does not. Default: off (the machine's clock).
    pub movable_clock: bool,
}

impl Default for ZkOptions {
    fn default() -> Self {
        Self {
            tick_time: Duration::from_millis(500),
            sync_limit: 5,
            min_session_timeout: Duration::from_secs(1),
            max_session_timeout: Duration::from_secs(60),
            heap_mb: 256,
            members: 3,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            peer_links: false,
            tls: None,
            movable_clock: false,
        }
    }
}

impl ZkOptions {
    /// Sets [`tick_time`](Self::tick_time).
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.tick_time = tick;
        self
    }

    /// Sets [`sync_limit`](Self::sync_limit).
    pub fn sync_limit(mut self, ticks: u32) -> Self {
        self.sync_limit = ticks;
        self
    }

    /// Sets [`peer_links`](Self::peer_links).
    pub fn peer_links(mut self, on: bool) -> Self {
        self.peer_links = on;
        self
    }

    /// Sets the session timeout bounds.
    pub fn session_timeouts(mut self, min: Duration, max: Duration) -> Self {
        self.min_session_timeout = min;
        self.max_session_timeout = max;
        self
    }

    /// Sets [`members`](Self::members).
    pub fn members(mut self, n: usize) -> Self {
        self.members = n;
        self
    }

    /// Sets [`ready_timeout`](Self::ready_timeout).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Sets [`movable_clock`](Self::movable_clock).
    pub fn movable_clock(mut self, on: bool) -> Self {
        self.movable_clock = on;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn tls(mut self, tls: ZkTls) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// Certificates for a ZooKeeper serving TLS ([`ZkOptions::tls`]): a throwaway CA, a
/// server certificate and a client certificate it signed (see
/// [`make_certificates`](super::tls::make_certificates)), in a temp dir that lives as
/// long as a clone of this. ZooKeeper serves them with Netty
/// (`serverCnxnFactory=NettyServerCnxnFactory`) from PEM key and trust stores.
#[derive(Debug, Clone)]
pub struct ZkTls {
    dir: Arc<tempfile::TempDir>,
    client_auth: bool,
}

impl ZkTls {
    /// Makes the certificates; the server asks for no client certificate.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the files cannot be written.
    ///
    /// # Panics
    /// When `openssl` is missing or fails (see
    /// [`make_certificates`](super::tls::make_certificates)).
    pub async fn make() -> Result<Self, HarnessError> {
        let dir = temp_dir("zookeeper-tls")?;
        make_certificates(dir.path()).await;
        // A PEM key store is the key followed by its certificate, in one file.
        let read = |name: &str| {
            let path = dir.path().join(name);
            std::fs::read_to_string(&path).map_err(|e| {
                HarnessError::io("zookeeper tls", format!("read {}", path.display()), e)
            })
        };
        let store = read("server.key")? + &read("server.pem")?;
        write_file(
            "zookeeper tls",
            &dir.path().join("server-store.pem"),
            &store,
        )?;
        Ok(Self {
            dir: Arc::new(dir),
            client_auth: false,
        })
    }

    /// Requires a client certificate signed by the CA (`ssl.clientAuth=need`), or not.
    pub fn client_auth(mut self, need: bool) -> Self {
        self.client_auth = need;
        self
    }

    /// The CA certificate (PEM): a client's `ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The client certificate (PEM): a client's `cert_file`.
    pub fn cert_file(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client certificate's key (PEM): a client's `key_file`.
    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The `zoo.cfg` lines serving TLS on `port`.
    fn config_lines(&self, port: u16) -> String {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        format!(
            "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
             ssl.clientAuth={}\n",
            path("server-store.pem"),
            path("ca.pem"),
            if self.client_auth { "need" } else { "none" },
        )
    }
}

/// The role a ZooKeeper server reports in `srvr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkMode {
    /// A server without peers.
    Standalone,
    /// The ensemble's leader.
    Leader,
    /// An ensemble follower.
    Follower,
    /// An ensemble observer.
    Observer,
}

impl ZkMode {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "standalone" => Some(Self::Standalone),
            "leader" => Some(Self::Leader),
            "follower" => Some(Self::Follower),
            "observer" => Some(Self::Observer),
            _ => None,
        }
    }
}

impl fmt::Display for ZkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Standalone => "standalone",
            Self::Leader => "leader",
            Self::Follower => "follower",
            Self::Observer => "observer",
        })
    }
}

/// Java and the class path to run ZooKeeper with (found before a start).
#[derive(Debug, Clone)]
pub struct ZkRuntime {
    java: PathBuf,
    classpath: String,
}

impl ZkRuntime {
    /// `$JAVA_BIN` or `java`; `$ZOOKEEPER_CLASSPATH` or `zookeeper.jar` plus a log4j binding.
    fn find() -> Result<Self, HarnessError> {
        let java = find_binary("java", "JAVA_BIN", JAVA_HINT)?;
        if let Some(cp) = std::env::var_os("ZOOKEEPER_CLASSPATH").filter(|v| !v.is_empty()) {
            return Ok(Self {
                java,
                classpath: cp.to_string_lossy().into_owned(),
            });
        }
        let jar = JAR_DIRS
            .iter()
            .map(|d| Path::new(d).join("zookeeper.jar"))
            .find(|p| p.is_file())
            .ok_or(HarnessError::MissingBinary {
                binary: "zookeeper.jar".to_owned(),
                hint: HINT,
            })?;
        let mut classpath = vec![jar.clone()];
        // The jar's manifest names its dependencies but no logging backend: add log4j 1.2
        // (configured per server below) or, failing that, slf4j-simple (to stderr).
        let dirs: Vec<PathBuf> = jar
            .parent()
            .map(Path::to_owned)
            .into_iter()
            .chain(JAR_DIRS.iter().map(PathBuf::from))
            .collect();
        let find = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        if let (Some(binding), Some(log4j)) = (find("slf4j-log4j12.jar"), find("log4j-1.2.jar")) {
            classpath.push(binding);
            classpath.push(log4j);
        } else if let Some(simple) = find("slf4j-simple.jar") {
            classpath.push(simple);
        }
        // The manifest names Netty's buffer, common, handler and transport jars but not
        // codec and resolver, which the Netty connection factory (TLS) loads too.
        classpath.extend(NETTY_EXTRA_JARS.iter().filter_map(|name| find(name)));
        let classpath = std::env::join_paths(classpath)
            .map_err(|e| {
                HarnessError::io("zookeeper", "build class path", std::io::Error::other(e))
            })?
            .to_string_lossy()
            .into_owned();
        Ok(Self { java, classpath })
    }
}

/// One ZooKeeper server (standalone, or a member of a [`ZkEnsemble`]). Killed on drop.
///
/// Runs with `tickTime` 500 ms, session timeouts 1-60 s, four-letter words enabled, no
/// admin server, a 256 MiB heap, log4j to the console (the log file), and
/// `forceSync=no`: a killed process loses nothing (its writes are in the page cache);
/// only a machine crash would.
pub type ZkServer = Server<ZooKeeper>;

/// A ZooKeeper ensemble (3 members by default) on loopback. Killed on drop.
///
/// With [`ZkOptions::peer_links`], each member's configuration names every peer's quorum
/// port through a fault proxy of its own (the connection a follower opens to its leader
/// goes through one), so [`partition`](Self::partition) cuts a member off from its peers
/// while its clients still reach it: the setting in which a follower keeps serving
/// reads for up to `syncLimit` ticks after it lost its leader. Leader election messages
/// still flow (ZooKeeper calls a peer back on the address that peer announces, so they
/// cannot all be routed through a proxy): a cut-off follower cannot follow or lead, but
/// a cut-off leader may be elected again and again by the others, so partition
/// followers only.
pub type ZkEnsemble = Cluster<ZooKeeper>;

/// The ZooKeeper kind: what a server keeps beyond its process.
#[derive(Debug)]
pub struct ZooKeeper {
    /// `myid` for ensemble members.
    id: Option<usize>,
    /// The TLS client port, when serving TLS.
    secure_port: Option<u16>,
}

#[async_trait]
impl ServerKind for ZooKeeper {
    type Options = ZkOptions;
    type Program = ZkRuntime;

    const NAME: &'static str = "zookeeper";
    const CLUSTER: &'static str = "zookeeper ensemble";
    const SCHEME: &'static str = "zk";
    const CLUSTER_SCHEME: &'static str = "zk";
    /// Client, quorum, election and TLS client ports.
    const PORTS: usize = 4;
    const ELECTS_LEADER: bool = true;
    const CLOCK_HOOK: ClockHook = ClockHook::Libfaketime;

    fn find() -> Result<ZkRuntime, HarnessError> {
        ZkRuntime::find()
    }

    fn movable_clock(options: &ZkOptions) -> bool {
        options.movable_clock
    }

    fn members(options: &ZkOptions) -> usize {
        options.members
    }

    fn ready_timeout(options: &ZkOptions) -> Duration {
        options.ready_timeout
    }

    fn prepare(
        runtime: &ZkRuntime,
        options: &ZkOptions,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Prepared<Self>, HarnessError> {
        let client_port = member.own_ports()[0];
        let id = member.index.map(|i| i + 1);
        let label = match id {
            Some(id) => format!("zookeeper member {id} 127.0.0.1:{client_port}"),
            None => format!("zookeeper 127.0.0.1:{client_port}"),
        };
        let data_dir = dir.join("data");
        create_dir(&label, &data_dir)?;
        let ms = |d: Duration| d.as_millis();
        let mut cfg = format!(
            "tickTime={}\ninitLimit=10\nsyncLimit={}\n\
             dataDir={}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout={}\nmaxSessionTimeout={}\n\
             maxClientCnxns=0\n4lw.commands.whitelist=*\nadmin.enableServer=false\n",
            ms(options.tick_time),
            options.sync_limit,
            data_dir.display(),
            ms(options.min_session_timeout),
            ms(options.max_session_timeout),
        );
        let secure_port = options.tls.as_ref().map(|tls| {
            let port = member.own_ports()[3];
            cfg.push_str(&tls.config_lines(port));
            port
        });
        if let Some(id) = id {
            write_file(&label, &data_dir.join("myid"), &format!("{id}\n"))?;
            for (j, peer) in member.ports.iter().enumerate() {
                // How this member sees its peers: their quorum ports through its own
                // proxies, when there are peer links.
                let quorum = peer_link(member.links, id - 1, j).map_or(peer[1], FaultProxy::port);
                cfg.push_str(&format!(
                    "server.{}=127.0.0.1:{quorum}:{}\n",
                    j + 1,
                    peer[2]
                ));
            }
        }
        let cfg_path = dir.join("zoo.cfg");
        write_file(&label, &cfg_path, &cfg)?;
        let log4j = dir.join("log4j.properties");
        write_file(
            &label,
            &log4j,
            "log4j.rootLogger=INFO, CONSOLE\n\
             log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
             log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
             log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] %m%n\n",
        )?;
        let mut args: Vec<String> = vec![
            format!("-Xmx{}m", options.heap_mb),
            "-Xms32m".into(),
            "-Xss512k".into(),
            "-XX:+UseSerialGC".into(),
            "-XX:TieredStopAtLevel=1".into(),
            "-XX:-UsePerfData".into(),
            "-XX:+ExitOnOutOfMemoryError".into(),
            "-Djava.awt.headless=true".into(),
            "-Djava.net.preferIPv4Stack=true".into(),
            format!("-Djava.io.tmpdir={}", dir.display()),
            format!("-Dlog4j.configuration=file:{}", log4j.display()),
            format!("-Dzookeeper.log.dir={}", dir.display()),
            "-Dzookeeper.root.logger=INFO,CONSOLE".into(),
            "-Dzookeeper.admin.enableServer=false".into(),
            "-Dzookeeper.jmx.log4j.disable=true".into(),
            // Peers are on loopback: a connect that takes longer means the peer is paused.
            "-Dzookeeper.cnxTimeout=1000".into(),
            // Tests kill processes, not machines: the page cache survives, fsync is waste.
            "-Dzookeeper.forceSync=no".into(),
            "-Dzookeeper.preAllocSize=1024".into(),
            "-cp".into(),
            runtime.classpath.clone(),
            MAIN_CLASS.into(),
        ];
        args.push(cfg_path.display().to_string());
        let spec = LaunchSpec {
            program: runtime.java.clone(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: dir.to_owned(),
            log: dir.join("server.log"),
        };
        let probe = Probe::ZkMode {
            addr: loopback(client_port),
            standalone: id.is_none(),
        };
        Ok(Prepared {
            node: Node::new(label, spec, probe, options.ready_timeout),
            data_dir,
            kind: ZooKeeper { id, secure_port },
        })
    }

    async fn peer_links(
        options: &ZkOptions,
        ports: &[Vec<u16>],
    ) -> Result<Vec<Arc<Vec<FaultProxy>>>, HarnessError> {
        let n = ports.len();
        let mut links = Vec::new();
        if options.peer_links {
            for from in 0..n {
                let mut outgoing = Vec::with_capacity(n - 1);
                for to in (0..n).filter(|to| *to != from) {
                    let proxy = FaultProxy::start(loopback(ports[to][1]))
                        .await
                        .map_err(|e| {
                            HarnessError::io("zookeeper ensemble", "start a peer link proxy", e)
                        })?;
                    outgoing.push(proxy);
                }
                links.push(Arc::new(outgoing));
            }
        }
        Ok(links)
    }

    async fn start_slots(n: usize) -> Result<Option<SemaphorePermit<'static>>, HarnessError> {
        start_slots(n).await.map(Some)
    }

    /// A majority of all members must serve and exactly one of them must be leader.
    async fn leader(members: &[ZkServer], cluster: &str) -> Result<usize, HarnessError> {
        let modes = futures::future::join_all(members.iter().map(|m| async move {
            if m.is_running() {
                m.mode().await.ok()
            } else {
                None
            }
        }))
        .await;
        let serving = modes.iter().flatten().count();
        let leaders: Vec<usize> = modes
            .iter()
            .enumerate()
            .filter(|(_, m)| **m == Some(ZkMode::Leader))
            .map(|(i, _)| i)
            .collect();
        match leaders.as_slice() {
            [leader] if serving >= majority(members.len()) => Ok(*leader),
            _ => Err(HarnessError::Cluster {
                cluster: cluster.to_owned(),
                detail: format!("no single leader; modes by member: {modes:?}"),
            }),
        }
    }
}

impl Server<ZooKeeper> {
    /// `127.0.0.1:PORT`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// The TLS client port, when started with [`ZkOptions::tls`].
    pub fn secure_port(&self) -> Option<u16> {
        self.kind.secure_port
    }

    /// The member's `myid` (1-based) in an ensemble; `None` when standalone.
    pub fn id(&self) -> Option<usize> {
        self.kind.id
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`, ...) and returns the answer.
    ///
    /// # Errors
    /// [`HarnessError::Io`] if the server does not answer within 2 s.
    pub async fn four_letter(&self, word: &str) -> Result<String, HarnessError> {
        four_letter(self.addr(), word, FOUR_LETTER_TIMEOUT)
            .await
            .map_err(|e| HarnessError::io(self.node.label(), format!("four-letter word {word}"), e))
    }

    /// The mode from `srvr`.
    ///
    /// # Errors
    /// If the server does not answer, or is not serving (e.g. during an election).
    pub async fn mode(&self) -> Result<ZkMode, HarnessError> {
        let out = self.four_letter("srvr").await?;
        zk_mode_line(&out)
            .and_then(ZkMode::parse)
            .ok_or_else(|| HarnessError::Cluster {
                cluster: self.node.label().to_owned(),
                detail: format!("not serving: {:?}", out.trim_end()),
            })
    }
}

impl Cluster<ZooKeeper> {
    /// `127.0.0.1:P1,127.0.0.1:P2,...`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.hosts().join(",")
    }

    /// Cuts follower `i` off from its peers (its quorum links turn into black holes, both
    /// ways); its clients still reach it. It keeps serving reads until `syncLimit` ticks
    /// pass without its leader, then stops serving until [`heal`](Self::heal). (A leader
    /// cut off this way may be re-elected: see the type's docs.)
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] unless the ensemble was started with
    /// [`ZkOptions::peer_links`].
    pub fn partition(&self, i: usize) -> Result<(), HarnessError> {
        self.set_peer_links(i, ProxyMode::Blackhole)
    }

    /// Ends every partition: the quorum links of every member are reset (so that the
    /// peers reconnect on clean streams) and pass traffic again.
    ///
    /// # Errors
    /// As [`partition`](Self::partition).
    pub fn heal(&self) -> Result<(), HarnessError> {
        for i in 0..self.len() {
            self.set_peer_links(i, ProxyMode::Reset)?;
            self.set_peer_links(i, ProxyMode::Pass)?;
        }
        Ok(())
    }

    /// Sets `mode` on every quorum link from or to member `i` (e.g. a delay, so that
    /// proposals and commits reach it late).
    ///
    /// # Errors
    /// As [`partition`](Self::partition).
    pub fn set_peer_links(&self, i: usize, mode: ProxyMode) -> Result<(), HarnessError> {
        self.peer_links(i)?;
        for from in 0..self.links.len() {
            for to in 0..self.links.len() {
                if from == i || to == i {
                    if let Some(proxy) = peer_link(&self.links, from, to) {
                        proxy.set_mode(mode);
                    }
                }
            }
        }
        Ok(())
    }

    /// The proxies member `i` reaches its peers' quorum ports through. Cutting them (as
    /// a [`Link`](crate::chaos::Link)) cuts a follower off: a follower's one quorum
    /// connection is the one it opens to its leader.
    ///
    /// # Errors
    /// As [`partition`](Self::partition).
    pub fn peer_links(&self, i: usize) -> Result<Arc<Vec<FaultProxy>>, HarnessError> {
        self.links
            .get(i)
            .cloned()
            .ok_or_else(|| HarnessError::Cluster {
                cluster: self.label.clone(),
                detail: "started without peer links (ZkOptions::peer_links)".to_owned(),
            })
    }
}

/// Waits for `n` (at most [`JVM_STARTS`]) JVM start slots, bounded.
async fn start_slots(n: usize) -> Result<SemaphorePermit<'static>, HarnessError> {
    let n = u32::try_from(n.clamp(1, JVM_STARTS)).unwrap_or(1);
    tokio::time::timeout(START_SLOT_TIMEOUT, JVM_START_SLOTS.acquire_many(n))
        .await
        .map_err(|_| {
            HarnessError::io(
                "zookeeper",
                "wait for a JVM start slot",
                std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
            )
        })?
        .map_err(|e| {
            HarnessError::io(
                "zookeeper",
                "wait for a JVM start slot",
                std::io::Error::other(e),
            )
        })
}

/// The proxy member `from` reaches member `to` through, if any.
fn peer_link(links: &[Arc<Vec<FaultProxy>>], from: usize, to: usize) -> Option<&FaultProxy> {
    let k = match to.cmp(&from) {
        std::cmp::Ordering::Less => to,
        std::cmp::Ordering::Equal => return None,
        std::cmp::Ordering::Greater => to - 1,
    };
    links.get(from)?.get(k)
}
