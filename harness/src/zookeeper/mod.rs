//! ZooKeeper (the jar of Debian package `libzookeeper-java`, run with `java`) as a
//! [`ServerKind`]: a standalone server ([`ZkServer`]) and an ensemble ([`ZkEnsemble`])
//! whose quorum links can pass fault proxies, to cut a member off from its peers.
//!
//! Layout: this file holds the kind, its roles and its server and ensemble methods;
//! `options` what a start takes; `jvm` java, the class path and the JVM start slots.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::SemaphorePermit;

use super::clock::ClockHook;
use super::cluster::Cluster;
use super::majority;
use super::node::Node;
use super::probe::{four_letter, zk_mode_line, Probe};
use super::process::LaunchSpec;
use super::server::{loopback, Member, Prepared, Server, ServerKind};
use super::{create_dir, write_file, HarnessError};
use crate::proxy::{FaultProxy, ProxyMode};

mod jvm;
mod options;

use jvm::start_slots;
pub use jvm::ZkRuntime;
pub use options::{ZkOptions, ZkTls};

const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// Bound on one four-letter-word exchange.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// The certificates it serves TLS with (which its clients need).
    tls: Option<ZkTls>,
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

    /// A JVM under a preloaded clock library reads the clock through it on every call and
    /// starts several times slower: on a loaded 2-core machine a movable-clock server has
    /// taken over 30 s, so it gets three times the bound.
    fn ready_timeout(options: &ZkOptions) -> Duration {
        if options.movable_clock {
            options.ready_timeout * 3
        } else {
            options.ready_timeout
        }
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
            run_as: None,
            with_children: false,
        };
        let probe = Probe::ZkMode {
            addr: loopback(client_port),
            standalone: id.is_none(),
        };
        Ok(Prepared {
            node: Node::new(label, spec, probe, Self::ready_timeout(options)),
            data_dir,
            kind: ZooKeeper {
                id,
                secure_port,
                tls: options.tls.clone(),
            },
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

    /// The certificates the server serves TLS with, when started with [`ZkOptions::tls`].
    pub fn tls(&self) -> Option<&ZkTls> {
        self.kind.tls.as_ref()
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
    /// a chaos `Link`) cuts a follower off: a follower's one quorum
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

/// The proxy member `from` reaches member `to` through, if any.
fn peer_link(links: &[Arc<Vec<FaultProxy>>], from: usize, to: usize) -> Option<&FaultProxy> {
    let k = match to.cmp(&from) {
        std::cmp::Ordering::Less => to,
        std::cmp::Ordering::Equal => return None,
        std::cmp::Ordering::Greater => to - 1,
    };
    links.get(from)?.get(k)
}
