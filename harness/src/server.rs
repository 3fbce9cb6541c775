//! One server process of any kind ([`Server`]), with what differs between
//! redis-server, ZooKeeper and etcd behind [`ServerKind`], and its fault controls
//! ([`ServerControl`]). A group of them is a [`Cluster`](super::Cluster).
//!
//! A kind says how to find its program, how to lay out one member (config, data dir,
//! launch spec, readiness probe) and, for consensus clusters, how to find the leader.
//! Everything else (ports, temp dirs, start-up with port retries, signals, restarts,
//! leader waits, drop) is written once, here and in `cluster`.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tempfile::TempDir;
use tokio::sync::SemaphorePermit;

use super::clock::{ClockHook, ClockJump, FakeClock, WallClock};
use super::node::Node;
use super::process::log_tail;
use super::{free_ports, temp_dir, with_port_retries, HarnessError, STOP_GRACE};
use crate::proxy::FaultProxy;

/// Where a member sits: alone, or member `index` of a cluster whose members use `ports`
/// (what [`ServerKind`] implementations are given; not for tests).
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// 0-based index in the cluster; `None` for a server started alone.
    pub(crate) index: Option<usize>,
    /// The ports of every member, [`ServerKind::PORTS`] each, client port first (one
    /// member when alone).
    pub(crate) ports: &'a [Vec<u16>],
    /// The cluster's peer-link proxies (`links[i][k]`: member `i` to its `k`-th peer);
    /// empty unless the kind starts them.
    pub(crate) links: &'a [Arc<Vec<FaultProxy>>],
}

impl Member<'_> {
    /// This member's ports.
    pub(crate) fn own_ports(&self) -> &[u16] {
        &self.ports[self.index.unwrap_or(0)]
    }
}

/// What one member of a kind is made of before it is spawned (what [`ServerKind`]
/// implementations return; not for tests).
#[derive(Debug)]
pub struct Prepared<K> {
    pub(crate) node: Node,
    pub(crate) data_dir: PathBuf,
    pub(crate) kind: K,
}

/// A server kind: redis-server ([`Redis`](super::Redis)), ZooKeeper
/// ([`ZooKeeper`](super::ZooKeeper)) or etcd ([`Etcd`](super::Etcd)). The value is what
/// a member of that kind keeps beyond its process (ids, extra ports, snapshot paths).
#[async_trait]
pub trait ServerKind: fmt::Debug + Send + Sync + Sized + 'static {
    /// Start options of servers and clusters of this kind.
    type Options: fmt::Debug + Clone + Default + Send + Sync;
    /// What a start looks up first (a binary, a class path).
    #[doc(hidden)]
    type Program: Send + Sync;

    /// Name in labels, logs and temp dirs (`redis-server`, `zookeeper`, `etcd`).
    const NAME: &'static str;
    /// Name of a group of them (`redis nodes`, `zookeeper ensemble`, `etcd cluster`).
    const CLUSTER: &'static str;
    /// URL scheme of one server.
    const SCHEME: &'static str;
    /// URL scheme of a group.
    const CLUSTER_SCHEME: &'static str;
    /// Ports one member listens on (the client port first).
    const PORTS: usize;
    /// Whether a group elects a leader (and a start waits for one). Default: it does not.
    const ELECTS_LEADER: bool = false;
    /// How a preloaded library reaches this kind's wall clock (see
    /// the `clock` module). Default: it does not.
    const CLOCK_HOOK: ClockHook =
        ClockHook::Unreachable("the harness starts this kind on the machine's clock only");

    /// Whether `options` ask for a wall clock the harness moves
    /// ([`Server::jump_clock`]). Default: no.
    #[doc(hidden)]
    fn movable_clock(_options: &Self::Options) -> bool {
        false
    }

    /// The URL of one server at `addr`. Default: `SCHEME://ADDR`.
    #[doc(hidden)]
    fn url(addr: SocketAddr) -> String {
        format!("{}://{addr}", Self::SCHEME)
    }

    /// Finds the program; [`HarnessError::MissingBinary`] when it is not installed.
    #[doc(hidden)]
    fn find() -> Result<Self::Program, HarnessError>;

    /// Number of members a cluster started with `options` has.
    #[doc(hidden)]
    fn members(options: &Self::Options) -> usize;

    /// Bound on the readiness wait in `options`.
    #[doc(hidden)]
    fn ready_timeout(options: &Self::Options) -> Duration;

    /// Writes config and data dir of `member` under `dir` (which exists); does not spawn.
    #[doc(hidden)]
    fn prepare(
        program: &Self::Program,
        options: &Self::Options,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Prepared<Self>, HarnessError>;

    /// Fills a prepared member's data dir before its first launch (`initdb`, say); not
    /// run again on restarts. Default: nothing to do.
    #[doc(hidden)]
    async fn initialize(_server: &Server<Self>) -> Result<(), HarnessError> {
        Ok(())
    }

    /// Starts the peer-link proxies of a cluster on `ports`, if `options` ask for them.
    #[doc(hidden)]
    async fn peer_links(
        _options: &Self::Options,
        _ports: &[Vec<u16>],
    ) -> Result<Vec<Arc<Vec<FaultProxy>>>, HarnessError> {
        Ok(Vec::new())
    }

    /// Waits for the right to start `n` processes at once (starts are CPU-heavy for
    /// some kinds); `None` when there is no limit.
    #[doc(hidden)]
    async fn start_slots(_n: usize) -> Result<Option<SemaphorePermit<'static>>, HarnessError> {
        Ok(None)
    }

    /// The current leader's index among `members`, when the kind elects one.
    #[doc(hidden)]
    async fn leader(members: &[Server<Self>], cluster: &str) -> Result<usize, HarnessError> {
        let _ = members;
        Err(HarnessError::Cluster {
            cluster: cluster.to_owned(),
            detail: "independent servers elect no leader".to_owned(),
        })
    }

    /// [`ServerControl::restart_wiped`] for this kind. Default: a plain restart.
    #[doc(hidden)]
    async fn restart_wiped(server: &Server<Self>) -> Result<(), HarnessError> {
        server.restart().await
    }

    /// [`ServerControl::save_snapshot`] for this kind. Default: unsupported.
    #[doc(hidden)]
    async fn save_snapshot(server: &Server<Self>) -> Result<(), HarnessError> {
        Err(unsupported(server, "save a snapshot"))
    }

    /// [`ServerControl::restart_from_snapshot`] for this kind. Default: unsupported.
    #[doc(hidden)]
    async fn restart_from_snapshot(server: &Server<Self>) -> Result<(), HarnessError> {
        Err(unsupported(server, "restart from a snapshot"))
    }
}

fn unsupported<K: ServerKind>(server: &Server<K>, what: &str) -> HarnessError {
    HarnessError::io(
        server.node.label(),
        what,
        std::io::ErrorKind::Unsupported.into(),
    )
}

/// One server of kind `K` on free loopback ports, in a temp dir (its own, or its
/// cluster's). Killed on drop.
#[derive(Debug)]
pub struct Server<K: ServerKind> {
    pub(crate) node: Node,
    port: u16,
    data_dir: PathBuf,
    pub(crate) kind: K,
    clock: Option<FakeClock>,
    _dir: Option<TempDir>,
}

impl<K: ServerKind> Server<K> {
    /// Starts a server alone with default options.
    ///
    /// # Errors
    /// [`HarnessError::MissingBinary`] if the server is not installed (see the
    /// [module docs](super) for the environment variables); other variants if it does
    /// not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(K::Options::default()).await
    }

    /// Starts a server alone with `options`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: K::Options) -> Result<Self, HarnessError> {
        let program = K::find()?;
        with_port_retries(K::NAME, || async {
            Self::start_on(&program, &options, free_ports(K::PORTS)?).await
        })
        .await
    }

    /// Starts a server alone on `ports` (no retry when one is taken).
    pub(crate) async fn start_on(
        program: &K::Program,
        options: &K::Options,
        ports: Vec<u16>,
    ) -> Result<Self, HarnessError> {
        let dir = temp_dir(K::NAME)?;
        let ports = [ports];
        let member = Member {
            index: None,
            ports: &ports,
            links: &[],
        };
        let server = Self::prepare(program, options, dir.path(), member)?;
        K::initialize(&server).await?;
        let _slot = K::start_slots(1).await?;
        server.node.launch().await?;
        Ok(Self {
            _dir: Some(dir),
            ..server
        })
    }

    pub(crate) fn prepare(
        program: &K::Program,
        options: &K::Options,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Self, HarnessError> {
        let port = member.own_ports()[0];
        let Prepared {
            mut node,
            data_dir,
            kind,
        } = K::prepare(program, options, dir, member)?;
        let clock = if K::movable_clock(options) {
            let clock = FakeClock::new(node.label(), dir, K::CLOCK_HOOK)?;
            node.add_env(clock.env());
            Some(clock)
        } else {
            None
        };
        Ok(Self {
            node,
            port,
            data_dir,
            kind,
            clock,
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

    /// `SCHEME://127.0.0.1:PORT` (`redis://`, `zk://`, `etcd://`;
    /// `postgres://postgres@127.0.0.1:PORT/postgres`).
    pub fn url(&self) -> String {
        K::url(self.addr())
    }

    /// Pid of the server process, `None` when it is not running (killed or stopped).
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// True when the process is alive and not paused.
    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// True when the server passes its readiness probe now.
    pub async fn is_ready(&self) -> bool {
        self.node.probe_once().await.is_ok()
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file (stdout and stderr of every run).
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(self.node.log_path(), lines)
    }

    /// SIGKILL the server and reap it. No-op if it is not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn kill9(&self) -> Result<(), HarnessError> {
        self.node.kill9().await
    }

    /// SIGSTOP the server: connections stay open, nothing is answered.
    ///
    /// # Errors
    /// [`HarnessError::NotRunning`] or a signal error.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.node.pause()
    }

    /// SIGCONT a paused server.
    ///
    /// # Errors
    /// [`HarnessError::NotRunning`] or a signal error.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.node.resume()
    }

    /// Kills the server if it runs and starts it again on the same ports and data dir;
    /// returns once it is ready again (a consensus member: once it has rejoined, which
    /// needs a quorum). What survives depends on the kind (Redis: only with
    /// persistence).
    ///
    /// # Errors
    /// If the server does not come back in time.
    pub async fn restart(&self) -> Result<(), HarnessError> {
        let _slot = K::start_slots(1).await?;
        self.node.restart(|| Ok(())).await
    }

    /// The wall clock the server runs on.
    pub fn wall_clock(&self) -> WallClock {
        match (&self.clock, K::CLOCK_HOOK) {
            (Some(_), _) => WallClock::Movable,
            (None, ClockHook::Unreachable(why)) => WallClock::Fixed(why),
            (None, _) => WallClock::Real,
        }
    }

    /// Moves the server's wall clock by `jump` (on top of earlier jumps), as an NTP step
    /// would; its monotonic clock goes on undisturbed. The server reads its clock moved
    /// within its kind's [`ClockHook::lag`]. Returns the offset from the machine's clock
    /// now, in ms. The clock stays moved across restarts.
    ///
    /// # Errors
    /// Unless the server was started on a movable clock (an option of its kind's start).
    pub fn jump_clock(&self, jump: ClockJump) -> Result<i64, HarnessError> {
        let clock = self.clock.as_ref().ok_or_else(|| {
            HarnessError::io(
                self.node.label(),
                "jump the clock",
                std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "started on the machine's clock",
                ),
            )
        })?;
        clock.jump(self.node.label(), jump)
    }

    /// Graceful stop: SIGTERM, then SIGKILL after a grace period. No-op if not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn stop(&self) -> Result<(), HarnessError> {
        self.node.stop(STOP_GRACE).await
    }
}

/// Fault control of one server process, as the fault scenarios use it (implemented by
/// every [`Server`]).
#[async_trait]
pub trait ServerControl: Send + Sync {
    /// For messages.
    fn label(&self) -> String;
    /// SIGKILL.
    async fn kill9(&self) -> Result<(), HarnessError>;
    /// Starts it again on the same ports and data.
    async fn restart(&self) -> Result<(), HarnessError>;
    /// Starts it again on the same ports with its data wiped (Redis without persistence
    /// behaves like this on every restart); a plain restart where the kind cannot wipe.
    async fn restart_wiped(&self) -> Result<(), HarnessError>;
    /// SIGSTOP.
    fn pause(&self) -> Result<(), HarnessError>;
    /// SIGCONT.
    fn resume(&self) -> Result<(), HarnessError>;
    /// Keeps a copy of its data (a backup, or what a lagging replica holds) for
    /// [`ServerControl::restart_from_snapshot`]; an error where the kind cannot.
    async fn save_snapshot(&self) -> Result<(), HarnessError>;
    /// Starts it again from the last snapshot: every write since is lost; an error
    /// where the kind cannot.
    async fn restart_from_snapshot(&self) -> Result<(), HarnessError>;
    /// The wall clock it runs on. Default: the machine's, which nothing here moves.
    fn wall_clock(&self) -> WallClock {
        WallClock::Fixed("the harness starts this server on the machine's clock only")
    }
    /// Moves its wall clock ([`Server::jump_clock`]); the offset from the machine's
    /// clock now, in ms. Default: an error.
    fn jump_clock(&self, _jump: ClockJump) -> Result<i64, HarnessError> {
        Err(HarnessError::io(
            &self.label(),
            "jump the clock",
            std::io::ErrorKind::Unsupported.into(),
        ))
    }
}

#[async_trait]
impl<K: ServerKind> ServerControl for Server<K> {
    fn label(&self) -> String {
        self.url()
    }
    async fn kill9(&self) -> Result<(), HarnessError> {
        Server::kill9(self).await
    }
    async fn restart(&self) -> Result<(), HarnessError> {
        Server::restart(self).await
    }
    async fn restart_wiped(&self) -> Result<(), HarnessError> {
        K::restart_wiped(self).await
    }
    fn pause(&self) -> Result<(), HarnessError> {
        Server::pause(self)
    }
    fn resume(&self) -> Result<(), HarnessError> {
        Server::resume(self)
    }
    async fn save_snapshot(&self) -> Result<(), HarnessError> {
        K::save_snapshot(self).await
    }
    async fn restart_from_snapshot(&self) -> Result<(), HarnessError> {
        K::restart_from_snapshot(self).await
    }
    fn wall_clock(&self) -> WallClock {
        Server::wall_clock(self)
    }
    fn jump_clock(&self, jump: ClockJump) -> Result<i64, HarnessError> {
        Server::jump_clock(self, jump)
    }
}

/// `127.0.0.1:port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}
