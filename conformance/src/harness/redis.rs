//! redis-server: a single server, and N independent servers for RedLock.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::probe::{redis_command, Probe};
use super::process::{find_binary, log_tail, LaunchSpec, Node};
use super::{
    create_dir, free_port, temp_dir, with_port_retries, write_file, HarnessError,
    DEFAULT_READY_TIMEOUT, STOP_GRACE,
};

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
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            persistence: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            extra_config: Vec::new(),
        }
    }
}

impl RedisOptions {
    /// Sets [`persistence`](Self::persistence).
    pub fn persistence(mut self, on: bool) -> Self {
        self.persistence = on;
        self
    }

    /// Sets [`ready_timeout`](Self::ready_timeout).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Appends one line to [`extra_config`](Self::extra_config).
    pub fn config_line(mut self, line: impl Into<String>) -> Self {
        self.extra_config.push(line.into());
        self
    }
}

/// One redis-server on a free loopback port, in a temp dir. Killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    node: Node,
    port: u16,
    persistence: bool,
    data_dir: PathBuf,
    snapshot_dir: PathBuf,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a server with default options (no persistence).
    ///
    /// # Errors
    /// [`HarnessError::MissingBinary`] if `redis-server` is not installed (or
    /// `$REDIS_SERVER_BIN` points nowhere); other variants if it does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(RedisOptions::default()).await
    }

    /// Starts a server with `options`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: RedisOptions) -> Result<Self, HarnessError> {
        let program = find_binary("redis-server", "REDIS_SERVER_BIN", HINT)?;
        with_port_retries("redis-server", || async {
            Self::try_start(&program, &options, free_port()?).await
        })
        .await
    }

    async fn try_start(
        program: &Path,
        options: &RedisOptions,
        port: u16,
    ) -> Result<Self, HarnessError> {
        let dir = temp_dir("redis")?;
        let label = format!("redis-server 127.0.0.1:{port}");
        let data_dir = dir.path().join("data");
        create_dir(&label, &data_dir)?;
        let conf = dir.path().join("redis.conf");
        write_file(&label, &conf, &config(port, &data_dir, options))?;
        let spec = LaunchSpec {
            program: program.to_owned(),
            args: vec![conf.into_os_string()],
            env: Vec::new(),
            cwd: dir.path().to_owned(),
            log: dir.path().join("server.log"),
        };
        let probe = Probe::RedisPing(loopback(port));
        let node = Node::new(label, spec, probe, options.ready_timeout);
        node.launch().await?;
        Ok(Self {
            node,
            port,
            persistence: options.persistence,
            data_dir,
            snapshot_dir: dir.path().join("snapshot"),
            _dir: dir,
        })
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Pid of the server process, `None` when it is not running (killed or stopped).
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// True when the process is alive and not paused.
    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// True when the server answers `PING` now.
    pub async fn is_ready(&self) -> bool {
        self.node.probe_once().await.is_ok()
    }

    /// The server's data directory (AOF and RDB files).
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

    /// Kills the server if it runs and starts it again on the same port and data dir;
    /// returns once it answers `PING`. Data survives only with
    /// [`persistence`](RedisOptions::persistence).
    ///
    /// # Errors
    /// If the server does not come back.
    pub async fn restart(&self) -> Result<(), HarnessError> {
        self.node.restart(|| Ok(())).await
    }

    /// Like [`restart`](Self::restart), but deletes the data dir's contents in between.
    ///
    /// # Errors
    /// If the data cannot be deleted or the server does not come back.
    pub async fn restart_wiped(&self) -> Result<(), HarnessError> {
        let label = self.node.label().to_owned();
        let data_dir = self.data_dir.clone();
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
        if self.snapshot_dir.exists() {
            std::fs::remove_dir_all(&self.snapshot_dir)
                .map_err(|e| HarnessError::io(label, "remove the old snapshot", e))?;
        }
        copy_dir(label, &self.data_dir, &self.snapshot_dir)?;
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
        if !self.snapshot_dir.is_dir() {
            return Err(HarnessError::io(
                &label,
                "restore a snapshot",
                std::io::Error::new(std::io::ErrorKind::NotFound, "no snapshot was saved"),
            ));
        }
        let (data_dir, snapshot_dir) = (self.data_dir.clone(), self.snapshot_dir.clone());
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
        let rdb = self.data_dir.join(RDB_FILE);
        if self.persistence || !rdb.exists() {
            return Ok(());
        }
        std::fs::remove_file(&rdb).map_err(|e| {
            HarnessError::io(self.node.label(), format!("remove {}", rdb.display()), e)
        })
    }

    /// Graceful stop: SIGTERM, then SIGKILL after a grace period. No-op if not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn stop(&self) -> Result<(), HarnessError> {
        self.node.stop(STOP_GRACE).await
    }
}

/// N independent redis-servers (no replication), e.g. for RedLock. Killed on drop.
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisServer>,
}

impl RedisNodes {
    /// Starts `n` servers concurrently with default options.
    ///
    /// # Errors
    /// As [`RedisServer::start`]; servers already started are killed.
    pub async fn start(n: usize) -> Result<Self, HarnessError> {
        Self::start_with(n, RedisOptions::default()).await
    }

    /// Starts `n` servers concurrently with `options`.
    ///
    /// # Errors
    /// As [`RedisServer::start`]; servers already started are killed.
    pub async fn start_with(n: usize, options: RedisOptions) -> Result<Self, HarnessError> {
        let nodes =
            futures::future::try_join_all((0..n).map(|_| RedisServer::start_with(options.clone())))
                .await?;
        Ok(Self { nodes })
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no servers.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Server `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn member(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// All servers.
    pub fn members(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// `redis://127.0.0.1:PORT` of each server.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `redlock://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }
}

impl Drop for RedisNodes {
    fn drop(&mut self) {
        // Kill all first; each server's own drop then only reaps.
        for n in &self.nodes {
            n.node.kill_now();
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
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

/// Copies the files and directories under `from` into `to` (created if missing).
fn copy_dir(label: &str, from: &Path, to: &Path) -> Result<(), HarnessError> {
    create_dir(label, to)?;
    let entries = std::fs::read_dir(from)
        .map_err(|e| HarnessError::io(label, format!("list {}", from.display()), e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| HarnessError::io(label, format!("list {}", from.display()), e))?
            .path();
        let Some(name) = path.file_name() else {
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
        let Some(program) =
            crate::harness::or_skip(find_binary("redis-server", "REDIS_SERVER_BIN", HINT))
        else {
            return;
        };
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let err = RedisServer::try_start(&program, &RedisOptions::default(), port)
            .await
            .expect_err("port is taken");
        assert!(err.is_addr_in_use(), "{err}");
    }

    #[tokio::test]
    async fn an_answer_from_another_server_on_the_port_is_not_readiness() {
        let Some(program) =
            crate::harness::or_skip(find_binary("redis-server", "REDIS_SERVER_BIN", HINT))
        else {
            return;
        };
        let first = RedisServer::start().await.expect("first server");
        let err = RedisServer::try_start(&program, &RedisOptions::default(), first.port())
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
            let Some(server) = crate::harness::or_skip(
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
        let Some(server) = crate::harness::or_skip(RedisServer::start().await) else {
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
