//! redis-server as a [`ServerKind`]: a single server ([`RedisServer`]), and N
//! independent servers for RedLock ([`RedisNodes`]); snapshots and wiped restarts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use super::clock::ClockHook;
use super::cluster::Cluster;
use super::node::Node;
use super::probe::{redis_command, Probe};
use super::process::{find_binary, LaunchSpec};
use super::server::{loopback, Member, Prepared, Server, ServerKind};
use super::{create_dir, write_file, HarnessError, DEFAULT_READY_TIMEOUT};

const HINT: &str = "apt-get install redis-server";

/// Bound on the `SAVE` of a snapshot.
const SAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The RDB file redis-server loads on start-up without persistence.
const RDB_FILE: &str = "dump.rdb";

/// Options for [`RedisServer`] and [`RedisNodes`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Keep data across restarts: `appendonly yes` with `appendfsync always`.
    /// Default: off (no AOF, no RDB snapshots: a restart starts empty).
    pub persistence: bool,
    /// Bound on the readiness wait. Default: [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Extra config lines appended to `redis.conf` (e.g. `"maxmemory 64mb"`). Default: none.
    pub extra_config: Vec<String>,
    /// Number of [`RedisNodes`]; ignored by [`RedisServer`]. Default: 5.
    pub members: usize,
    /// Serve TLS too, on a port of its own ([`RedisServer::tls_addr`]), with the
    /// certificates [`make_certificates`](super::tls::make_certificates) wrote into this
    /// directory (no client certificate asked for; replication over TLS). The plain port
    /// stays open for the harness. Default: none.
    pub tls: Option<PathBuf>,
    /// Start on a wall clock the harness moves ([`RedisServer::jump_clock`]): key expiry
    /// and `TIME` follow it. Default: off (the machine's clock).
    pub movable_clock: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            persistence: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            extra_config: Vec::new(),
            members: 5,
            tls: None,
            movable_clock: false,
        }
    }
}

impl RedisOptions {
    /// Sets [`tls`](Self::tls).
    pub fn tls(mut self, certificates: impl Into<PathBuf>) -> Self {
        self.tls = Some(certificates.into());
        self
    }

    /// Appends one line to [`extra_config`](Self::extra_config).
    pub fn config_line(mut self, line: impl Into<String>) -> Self {
        self.extra_config.push(line.into());
        self
    }
}

setters!(RedisOptions {
    persistence: bool,
    ready_timeout: Duration,
    members: usize,
    movable_clock: bool,
});

/// One redis-server on a free loopback port, in a temp dir. Killed on drop.
pub type RedisServer = Server<Redis>;

/// N independent redis-servers (no replication), e.g. for RedLock
/// ([`members`](RedisOptions::members), default 5). Killed on drop.
pub type RedisNodes = Cluster<Redis>;

/// The redis-server kind: what a server keeps beyond its process.
#[derive(Debug)]
pub struct Redis {
    persistence: bool,
    snapshot_dir: PathBuf,
    tls_port: Option<u16>,
}

#[async_trait]
impl ServerKind for Redis {
    type Options = RedisOptions;
    type Program = PathBuf;

    const NAME: &'static str = "redis-server";
    const CLUSTER: &'static str = "redis nodes";
    const SCHEME: &'static str = "redis";
    const CLUSTER_SCHEME: &'static str = "redlock";
    /// The client port and the TLS port (used with [`RedisOptions::tls`] only).
    const PORTS: usize = 2;
    /// libfaketime cannot run Debian's redis-server (jemalloc): the harness's own library.
    const CLOCK_HOOK: ClockHook = ClockHook::Own;

    fn find() -> Result<PathBuf, HarnessError> {
        find_binary("redis-server", "REDIS_SERVER_BIN", HINT)
    }

    fn movable_clock(options: &RedisOptions) -> bool {
        options.movable_clock
    }

    fn members(options: &RedisOptions) -> usize {
        options.members
    }

    fn ready_timeout(options: &RedisOptions) -> Duration {
        options.ready_timeout
    }

    fn prepare(
        program: &PathBuf,
        options: &RedisOptions,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Prepared<Self>, HarnessError> {
        let port = member.own_ports()[0];
        let tls_port = options.tls.as_ref().map(|_| member.own_ports()[1]);
        let label = format!("redis-server 127.0.0.1:{port}");
        let data_dir = dir.join("data");
        create_dir(&label, &data_dir)?;
        let conf = dir.join("redis.conf");
        let mut text = config(port, &data_dir, options);
        if let (Some(certificates), Some(tls_port)) = (&options.tls, tls_port) {
            text.push_str(&tls_config(tls_port, certificates));
        }
        write_file(&label, &conf, &text)?;
        let spec = LaunchSpec {
            program: program.clone(),
            args: vec![conf.into_os_string()],
            env: Vec::new(),
            cwd: dir.to_owned(),
            log: dir.join("server.log"),
            run_as: None,
            with_children: false,
        };
        let probe = Probe::RedisPing(loopback(port));
        Ok(Prepared {
            node: Node::new(label, spec, probe, options.ready_timeout),
            data_dir,
            kind: Redis {
                persistence: options.persistence,
                snapshot_dir: dir.join("snapshot"),
                tls_port,
            },
        })
    }

    async fn restart_wiped(server: &RedisServer) -> Result<(), HarnessError> {
        server.restart_wiped().await
    }

    async fn save_snapshot(server: &RedisServer) -> Result<(), HarnessError> {
        server.save_snapshot().await
    }

    async fn restart_from_snapshot(server: &RedisServer) -> Result<(), HarnessError> {
        server.restart_from_snapshot().await
    }
}

impl Server<Redis> {
    /// The TLS address, when started with [`RedisOptions::tls`].
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.kind.tls_port.map(loopback)
    }

    /// Where clients reach the server: the TLS address when it serves TLS, else
    /// [`addr`](Self::addr).
    pub fn client_addr(&self) -> SocketAddr {
        self.tls_addr().unwrap_or_else(|| self.addr())
    }

    /// Like [`restart`](Self::restart), but deletes the data dir's contents in between
    /// (a cluster node keeps its configuration, see `CLUSTER_CONFIG`).
    ///
    /// # Errors
    /// If the data cannot be deleted or the server does not come back.
    pub async fn restart_wiped(&self) -> Result<(), HarnessError> {
        let label = self.node.label().to_owned();
        let data_dir = self.data_dir().to_owned();
        self.node.restart(move || wipe(&label, &data_dir)).await
    }

    /// Writes the dataset to disk (`SAVE`) and keeps a copy of the data files (the RDB,
    /// and the AOF with persistence) beside the data dir, replacing any earlier snapshot:
    /// what a backup or a replica that fell behind holds.
    /// [`restart_from_snapshot`](Self::restart_from_snapshot) brings it back. Without
    /// persistence the data dir is left as it was (a plain restart still starts empty).
    ///
    /// # Errors
    /// If the server does not save, or the files cannot be copied.
    pub async fn save_snapshot(&self) -> Result<(), HarnessError> {
        let label = self.node.label();
        let reply = redis_command(self.addr(), &["SAVE"], SAVE_TIMEOUT)
            .await
            .map_err(|e| HarnessError::io(label, "SAVE", e))?;
        if !reply.starts_with("+OK") {
            return Err(HarnessError::io(
                label,
                "SAVE",
                std::io::Error::other(format!("answered {:?}", reply.trim_end())),
            ));
        }
        let snapshot_dir = &self.kind.snapshot_dir;
        if snapshot_dir.exists() {
            std::fs::remove_dir_all(snapshot_dir)
                .map_err(|e| HarnessError::io(label, "remove the old snapshot", e))?;
        }
        copy_dir(label, self.data_dir(), snapshot_dir)?;
        self.forget_rdb()
    }

    /// Kills the server and starts it again, on the same port, from the data of the last
    /// [`save_snapshot`](Self::save_snapshot): every write since is lost, also with
    /// persistence (the AOF goes back too). Returns once it answers `PING`.
    ///
    /// # Errors
    /// If there is no snapshot, the files cannot be copied or the server does not come
    /// back.
    pub async fn restart_from_snapshot(&self) -> Result<(), HarnessError> {
        let label = self.node.label().to_owned();
        if !self.kind.snapshot_dir.is_dir() {
            return Err(HarnessError::io(
                &label,
                "restore a snapshot",
                std::io::Error::new(std::io::ErrorKind::NotFound, "no snapshot was saved"),
            ));
        }
        let (data_dir, snapshot_dir) = (self.data_dir().to_owned(), self.kind.snapshot_dir.clone());
        self.node
            .restart(move || {
                wipe(&label, &data_dir)?;
                copy_dir(&label, &snapshot_dir, &data_dir)
            })
            .await?;
        self.forget_rdb()
    }

    /// Without persistence, removes the RDB file once written or loaded, so that a plain
    /// restart starts empty as documented.
    fn forget_rdb(&self) -> Result<(), HarnessError> {
        let rdb = self.data_dir().join(RDB_FILE);
        if self.kind.persistence || !rdb.exists() {
            return Ok(());
        }
        std::fs::remove_file(&rdb).map_err(|e| {
            HarnessError::io(self.node.label(), format!("remove {}", rdb.display()), e)
        })
    }
}

fn config(port: u16, data_dir: &Path, options: &RedisOptions) -> String {
    let mut conf = format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         protected-mode no\n\
         daemonize no\n\
         logfile \"\"\n\
         dir \"{}\"\n\
         save \"\"\n",
        data_dir.display()
    );
    if options.persistence {
        conf.push_str("appendonly yes\nappendfsync always\n");
    } else {
        conf.push_str("appendonly no\n");
    }
    for line in &options.extra_config {
        conf.push_str(line);
        conf.push('\n');
    }
    conf
}

/// The `redis.conf` lines (of a server or a Sentinel) serving TLS on `port` with the
/// certificates in `dir`, and speaking TLS to the servers it replicates from or watches.
pub(crate) fn tls_config(port: u16, dir: &Path) -> String {
    let path = |name: &str| dir.join(name).display().to_string();
    format!(
        "tls-port {port}\n\
         tls-cert-file \"{}\"\n\
         tls-key-file \"{}\"\n\
         tls-ca-cert-file \"{}\"\n\
         tls-auth-clients no\n\
         tls-replication yes\n",
        path("server.pem"),
        path("server.key"),
        path("ca.pem"),
    )
}

/// A cluster node's own configuration (its id, epoch, peers), kept beside its data: not
/// data, so neither wiped nor snapshotted. A node restarted without data rejoins its
/// cluster as itself, empty.
const CLUSTER_CONFIG: &str = "nodes.conf";

/// Whether `path` in a data dir is data (see [`CLUSTER_CONFIG`]).
fn is_data(path: &Path) -> bool {
    path.file_name() != Some(std::ffi::OsStr::new(CLUSTER_CONFIG))
}

/// Copies the data files and directories under `from` into `to` (created if missing).
fn copy_dir(label: &str, from: &Path, to: &Path) -> Result<(), HarnessError> {
    create_dir(label, to)?;
    let entries = std::fs::read_dir(from)
        .map_err(|e| HarnessError::io(label, format!("list {}", from.display()), e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| HarnessError::io(label, format!("list {}", from.display()), e))?
            .path();
        let Some(name) = path.file_name().filter(|_| is_data(&path)) else {
            continue;
        };
        let dest = to.join(name);
        if path.is_dir() {
            copy_dir(label, &path, &dest)?;
        } else {
            std::fs::copy(&path, &dest)
                .map_err(|e| HarnessError::io(label, format!("copy {}", path.display()), e))?;
        }
    }
    Ok(())
}

fn wipe(label: &str, data_dir: &Path) -> Result<(), HarnessError> {
    let entries = std::fs::read_dir(data_dir)
        .map_err(|e| HarnessError::io(label, format!("list {}", data_dir.display()), e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| HarnessError::io(label, "list data dir", e))?
            .path();
        if !is_data(&path) {
            continue;
        }
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| HarnessError::io(label, format!("remove {}", path.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_port_is_reported_as_addr_in_use() {
        let Some(program) = crate::or_skip(find_binary("redis-server", "REDIS_SERVER_BIN", HINT))
        else {
            return;
        };
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let err = RedisServer::start_on(&program, &RedisOptions::default(), vec![port])
            .await
            .expect_err("port is taken");
        assert!(err.is_addr_in_use(), "{err}");
    }

    #[tokio::test]
    async fn an_answer_from_another_server_on_the_port_is_not_readiness() {
        let Some(program) = crate::or_skip(find_binary("redis-server", "REDIS_SERVER_BIN", HINT))
        else {
            return;
        };
        let first = RedisServer::start().await.expect("first server");
        let err = RedisServer::start_on(&program, &RedisOptions::default(), vec![first.port()])
            .await
            .expect_err("port is taken by the first server");
        assert!(err.is_addr_in_use(), "{err}");
        assert!(first.is_ready().await);
    }

    /// `INCR counter` on `server`: the new value as the reply line (`:N`).
    async fn incr(server: &RedisServer) -> String {
        let reply = redis_command(server.addr(), &["INCR", "counter"], SAVE_TIMEOUT)
            .await
            .expect("INCR");
        reply.trim_end().to_owned()
    }

    #[tokio::test]
    async fn a_restart_from_a_snapshot_forgets_later_writes() {
        for persistence in [false, true] {
            let Some(server) = crate::or_skip(
                RedisServer::start_with(RedisOptions::default().persistence(persistence)).await,
            ) else {
                return;
            };
            assert_eq!(incr(&server).await, ":1");
            server.save_snapshot().await.expect("snapshot");
            assert_eq!(incr(&server).await, ":2");
            assert_eq!(incr(&server).await, ":3");
            server.restart_from_snapshot().await.expect("restore");
            assert_eq!(incr(&server).await, ":2", "persistence {persistence}");
            server.restart().await.expect("plain restart");
            let expected = if persistence { ":3" } else { ":1" };
            assert_eq!(incr(&server).await, expected, "persistence {persistence}");
        }
    }

    #[tokio::test]
    async fn a_restore_without_a_snapshot_is_an_error() {
        let Some(server) = crate::or_skip(RedisServer::start().await) else {
            return;
        };
        let err = server
            .restart_from_snapshot()
            .await
            .expect_err("no snapshot");
        assert!(err.to_string().contains("no snapshot"), "{err}");
        assert!(server.is_ready().await, "the server was left running");
    }

    #[test]
    fn config_switches_persistence() {
        let dir = Path::new("/tmp/x");
        let volatile = config(1, dir, &RedisOptions::default());
        assert!(volatile.contains("appendonly no\n") && volatile.contains("save \"\""));
        let durable = config(1, dir, &RedisOptions::default().persistence(true));
        assert!(durable.contains("appendonly yes\nappendfsync always\n"));
    }
}
