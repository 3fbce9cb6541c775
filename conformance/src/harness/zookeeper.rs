//! ZooKeeper (Debian package `zookeeper`, run with `java`): standalone and ensemble.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::probe::{four_letter, zk_mode_line, Probe};
use super::process::{find_binary, log_tail, LaunchSpec, Node};
use super::{
    create_dir, first_error, free_port, free_ports, majority, temp_dir, wait_for_leader,
    with_port_retries, write_file, HarnessError, DEFAULT_READY_TIMEOUT, STOP_GRACE,
};
use crate::proxy::{FaultProxy, ProxyMode};

const HINT: &str = "apt-get install zookeeper";
const JAVA_HINT: &str = "apt-get install default-jre-headless";
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// Where the Debian packages put the jars.
const JAR_DIRS: [&str; 3] = [
    "/usr/share/java",
    "/usr/share/zookeeper",
    "/usr/share/zookeeper/lib",
];
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

/// Java and the class path to run ZooKeeper with.
#[derive(Debug, Clone)]
struct Runtime {
    java: PathBuf,
    classpath: String,
}

impl Runtime {
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
        let classpath = std::env::join_paths(classpath)
            .map_err(|e| {
                HarnessError::io("zookeeper", "build class path", std::io::Error::other(e))
            })?
            .to_string_lossy()
            .into_owned();
        Ok(Self { java, classpath })
    }
}

/// Ports of one ensemble member.
#[derive(Debug, Clone, Copy)]
struct MemberPorts {
    client: u16,
    quorum: u16,
    election: u16,
}

/// One ZooKeeper server (standalone, or a member of a [`ZkEnsemble`]). Killed on drop.
///
/// Runs with `tickTime` 500 ms, session timeouts 1-60 s, four-letter words enabled, no
/// admin server, a 256 MiB heap, log4j to the console (the log file), and
/// `forceSync=no`: a killed process loses nothing (its writes are in the page cache);
/// only a machine crash would.
#[derive(Debug)]
pub struct ZkServer {
    node: Node,
    port: u16,
    /// `myid` for ensemble members.
    id: Option<usize>,
    data_dir: PathBuf,
    _dir: Option<TempDir>,
}

impl ZkServer {
    /// Starts a standalone server with default options.
    ///
    /// # Errors
    /// [`HarnessError::MissingBinary`] if java or the ZooKeeper jar is missing; other
    /// variants if it does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(ZkOptions::default()).await
    }

    /// Starts a standalone server with `options`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: ZkOptions) -> Result<Self, HarnessError> {
        let runtime = Runtime::find()?;
        with_port_retries("zookeeper", || async {
            let dir = temp_dir("zk")?;
            let port = free_port()?;
            let server = Self::prepare(&runtime, &options, dir.path(), None, port, &[])?;
            let _slot = start_slots(1).await?;
            server.node.launch().await?;
            Ok(Self {
                _dir: Some(dir),
                ..server
            })
        })
        .await
    }

    /// Writes config, log config and data dir under `dir`; does not spawn.
    fn prepare(
        runtime: &Runtime,
        options: &ZkOptions,
        dir: &Path,
        id: Option<usize>,
        client_port: u16,
        peers: &[MemberPorts],
    ) -> Result<Self, HarnessError> {
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
        if let Some(id) = id {
            write_file(&label, &data_dir.join("myid"), &format!("{id}\n"))?;
            for (i, p) in peers.iter().enumerate() {
                cfg.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    i + 1,
                    p.quorum,
                    p.election
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
        Ok(Self {
            node: Node::new(label, spec, probe, options.ready_timeout),
            port: client_port,
            id,
            data_dir,
            _dir: None,
        })
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `zk://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The member's `myid` (1-based) in an ensemble; `None` when standalone.
    pub fn id(&self) -> Option<usize> {
        self.id
    }

    /// Pid of the JVM, `None` when it is not running.
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// True when the process is alive and not paused.
    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// True when the server serves clients now (`srvr` shows the expected mode).
    pub async fn is_ready(&self) -> bool {
        self.node.probe_once().await.is_ok()
    }

    /// The data directory (snapshots, transaction logs, `myid`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The log file (stdout/stderr of the JVM, log4j to the console).
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(self.node.log_path(), lines)
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

    /// SIGKILL the JVM and reap it. No-op if it is not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn kill9(&self) -> Result<(), HarnessError> {
        self.node.kill9().await
    }

    /// SIGSTOP the JVM: connections stay open, nothing is answered, sessions expire.
    ///
    /// # Errors
    /// [`HarnessError::NotRunning`] or a signal error.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.node.pause()
    }

    /// SIGCONT a paused JVM.
    ///
    /// # Errors
    /// [`HarnessError::NotRunning`] or a signal error.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.node.resume()
    }

    /// Kills the server if it runs and starts it again on the same ports and data dir;
    /// returns once it serves (an ensemble member: once it has rejoined as leader or
    /// follower, which needs a quorum).
    ///
    /// # Errors
    /// If the server does not come back in time.
    pub async fn restart(&self) -> Result<(), HarnessError> {
        let _slot = start_slots(1).await?;
        self.node.restart(|| Ok(())).await
    }

    /// Graceful stop: SIGTERM, then SIGKILL after a grace period. No-op if not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn stop(&self) -> Result<(), HarnessError> {
        self.node.stop(STOP_GRACE).await
    }
}

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
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<ZkServer>,
    /// `links[i][k]`: the proxy member `i` reaches the quorum port of its `k`-th peer
    /// through (peers in member order, `i` left out). Empty without peer links.
    links: Vec<Arc<Vec<FaultProxy>>>,
    label: String,
    _dir: TempDir,
}

impl ZkEnsemble {
    /// Starts a 3-member ensemble with default options; returns once every member serves
    /// and exactly one is leader.
    ///
    /// # Errors
    /// As [`ZkServer::start`], or [`HarnessError::Cluster`] if no leader is elected in time.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(ZkOptions::default()).await
    }

    /// Starts an ensemble of `options.members` members.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: ZkOptions) -> Result<Self, HarnessError> {
        let runtime = Runtime::find()?;
        let n = options.members.max(1);
        with_port_retries("zookeeper ensemble", || {
            Self::try_start(&runtime, &options, n)
        })
        .await
    }

    async fn try_start(
        runtime: &Runtime,
        options: &ZkOptions,
        n: usize,
    ) -> Result<Self, HarnessError> {
        let dir = temp_dir("zk-ensemble")?;
        let flat = free_ports(3 * n)?;
        let peers: Vec<MemberPorts> = flat
            .chunks_exact(3)
            .map(|c| MemberPorts {
                client: c[0],
                quorum: c[1],
                election: c[2],
            })
            .collect();
        let mut links = Vec::new();
        if options.peer_links {
            for from in 0..n {
                let mut outgoing = Vec::with_capacity(n - 1);
                for to in (0..n).filter(|to| *to != from) {
                    let proxy = FaultProxy::start(loopback(peers[to].quorum))
                        .await
                        .map_err(|e| {
                            HarnessError::io("zookeeper ensemble", "start a peer link proxy", e)
                        })?;
                    outgoing.push(proxy);
                }
                links.push(Arc::new(outgoing));
            }
        }
        let mut members = Vec::with_capacity(n);
        for (i, p) in peers.iter().enumerate() {
            let member_dir = dir.path().join(format!("zk{}", i + 1));
            create_dir("zookeeper ensemble", &member_dir)?;
            // How member i sees its peers: their quorum ports through its own proxies.
            let view: Vec<MemberPorts> = peers
                .iter()
                .enumerate()
                .map(|(j, peer)| match peer_link(&links, i, j) {
                    Some(proxy) => MemberPorts {
                        quorum: proxy.port(),
                        ..*peer
                    },
                    None => *peer,
                })
                .collect();
            members.push(ZkServer::prepare(
                runtime,
                options,
                &member_dir,
                Some(i + 1),
                p.client,
                &view,
            )?);
        }
        let label = format!(
            "zookeeper ensemble {}",
            members
                .iter()
                .map(ZkServer::connect_string)
                .collect::<Vec<_>>()
                .join(",")
        );
        let ensemble = Self {
            members,
            links,
            label,
            _dir: dir,
        };
        let _slots = start_slots(n).await?;
        let started = Instant::now();
        let mut offsets = Vec::with_capacity(n);
        for m in &ensemble.members {
            offsets.push(m.node.spawn()?);
        }
        let waits = ensemble
            .members
            .iter()
            .zip(offsets)
            .map(|(m, offset)| m.node.wait_ready(offset));
        let results = futures::future::join_all(waits).await;
        first_error(results)?;
        let remaining = options.ready_timeout.saturating_sub(started.elapsed());
        ensemble
            .wait_for_leader(remaining.max(Duration::from_secs(5)))
            .await?;
        Ok(ensemble)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the ensemble has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i` (0-based; its `myid` is `i + 1`).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn member(&self, i: usize) -> &ZkServer {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[ZkServer] {
        &self.members
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,...` (every member, also stopped ones).
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`, a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(ZkServer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
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
        for i in 0..self.members.len() {
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

    /// Kills every member that runs and starts all of them again concurrently, on the
    /// same ports and data dirs (one member alone cannot serve without a quorum); returns
    /// once every member serves and there is one leader.
    ///
    /// # Errors
    /// If a member does not come back or no leader is elected in time.
    pub async fn restart_all(&self) -> Result<(), HarnessError> {
        let started = Instant::now();
        let timeout = self
            .members
            .iter()
            .map(|m| m.node.ready_timeout())
            .max()
            .unwrap_or(DEFAULT_READY_TIMEOUT);
        {
            let _slots = start_slots(self.members.len()).await?;
            futures::future::try_join_all(self.members.iter().map(|m| m.node.restart(|| Ok(()))))
                .await?;
        }
        let remaining = timeout.saturating_sub(started.elapsed());
        self.wait_for_leader(remaining.max(Duration::from_secs(5)))
            .await
            .map(|_| ())
    }

    /// The current leader's index, asking every running member: a majority of all
    /// members must serve and exactly one of them must be leader.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] when that is not the case right now.
    pub async fn leader(&self) -> Result<usize, HarnessError> {
        let modes = futures::future::join_all(self.members.iter().map(|m| async move {
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
            [leader] if serving >= majority(self.members.len()) => Ok(*leader),
            _ => Err(HarnessError::Cluster {
                cluster: self.label.clone(),
                detail: format!("no single leader; modes by member: {modes:?}"),
            }),
        }
    }

    /// Polls [`leader`](Self::leader) until it succeeds, for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if no leader shows up in time.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, HarnessError> {
        self.wait_for_leader_other_than(None, timeout).await
    }

    /// Polls until a leader other than member `old` is elected, for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if none shows up in time.
    pub async fn wait_for_new_leader(
        &self,
        old: usize,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        self.wait_for_leader_other_than(Some(old), timeout).await
    }

    async fn wait_for_leader_other_than(
        &self,
        old: Option<usize>,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        wait_for_leader(&self.label, old, timeout, || self.leader()).await
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        // Kill all first; each member's own drop then only reaps.
        for m in &self.members {
            m.node.kill_now();
        }
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

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}
