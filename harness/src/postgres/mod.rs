//! PostgreSQL as a [`ServerKind`]: one server ([`PostgresServer`]), and a primary with a
//! streaming replica ([`PostgresReplicated`], in `replicated`).
//!
//! Debian's server (`/usr/lib/postgresql/<version>/bin`, the newest) refuses to run as
//! root: as root the harness runs `initdb`, `pg_basebackup` and the postmaster as the OS
//! user `postgres` (setgid/setuid in the child before exec, so the pid it holds is the
//! postmaster's). Signals reach the postmaster's workers too (each leads a process group
//! of its own, so the postmaster's group would not do). Data and socket dir are owned by
//! that user.

mod replicated;
pub(crate) mod sql;

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_postgres::NoTls;

use super::clock::ClockHook;
use super::node::Node;
use super::probe::Probe;
use super::process::{find_binary, is_executable, log_tail, LaunchSpec, RunAs, LOG_TAIL_LINES};
use super::server::{loopback, Member, Prepared, Server, ServerKind};
use super::{create_dir, HarnessError, DEFAULT_READY_TIMEOUT};

pub use replicated::PostgresReplicated;
use sql::{conninfo, simple_query, OS_USER};

const HINT: &str = "apt-get install postgresql";
/// Path of the `postgres` binary to use instead of the newest Debian one; `initdb` and
/// `pg_basebackup` are taken from its directory.
const BIN_ENV: &str = "POSTGRES_BIN";
/// Where Debian installs each major version's programs (`<version>/bin`).
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// Bound on one query of [`PostgresServer::query`] (connect included).
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for [`PostgresServer`] and [`PostgresReplicated`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// Bound on the readiness wait (and on `initdb` / `pg_basebackup`). Default:
    /// [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Extra command-line arguments of `postgres` (e.g. `-c`, `log_min_messages=debug1`).
    /// Default: none.
    pub extra_args: Vec<String>,
    /// Serve TLS too (`ssl=on`), with the certificates
    /// [`make_certificates`](crate::tls::make_certificates) wrote into this directory
    /// (`server.pem`, `server.key`, and `ca.pem` for client certificates, asked for by no
    /// `pg_hba.conf` line). The server gets copies its user owns (the key mode 0600).
    /// Default: none.
    pub tls: Option<PathBuf>,
    /// With [`tls`](Self::tls): take TCP sessions over TLS only (`pg_hba.conf`:
    /// `hostssl … trust`, `hostnossl … reject`); the harness's own sessions
    /// ([`PostgresServer::query`], [`PostgresServer::connect`], the readiness probe) go
    /// through the Unix socket. Default: `false`.
    pub tls_only: bool,
    /// With [`tls_only`](Self::tls_only): also ask every TCP session for a client
    /// certificate the CA signed (`clientcert=verify-ca`). Default: `false`.
    pub client_certificates: bool,
    /// Start on a wall clock the harness moves ([`PostgresServer::jump_clock`]): `now()`,
    /// and so every lease's expiry, follows it. Default: off (the machine's clock).
    pub movable_clock: bool,
    /// Start as a streaming replica of the server on this port (`pg_basebackup -R`)
    /// rather than `initdb`.
    pub(crate) replica_of: Option<u16>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            ready_timeout: DEFAULT_READY_TIMEOUT,
            extra_args: Vec::new(),
            tls: None,
            tls_only: false,
            client_certificates: false,
            movable_clock: false,
            replica_of: None,
        }
    }
}

impl PostgresOptions {
    /// Appends one command-line argument to [`extra_args`](Self::extra_args).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn tls(mut self, certificates: impl Into<PathBuf>) -> Self {
        self.tls = Some(certificates.into());
        self
    }

    /// Sets [`tls_only`](Self::tls_only).
    pub fn tls_only(mut self, tls_only: bool) -> Self {
        self.tls_only = tls_only;
        self
    }

    /// Sets [`client_certificates`](Self::client_certificates).
    pub fn client_certificates(mut self, asked: bool) -> Self {
        self.client_certificates = asked;
        self
    }

    /// Appends `-c name=value` to [`extra_args`](Self::extra_args).
    pub fn setting(self, name: &str, value: impl std::fmt::Display) -> Self {
        self.arg("-c").arg(format!("{name}={value}"))
    }
}

setters!(PostgresOptions {
    ready_timeout: Duration,
    movable_clock: bool,
});

/// One PostgreSQL server (postmaster) on a free loopback port, in a temp dir; user
/// `postgres` (trust auth), database `postgres`. Killed on drop.
pub type PostgresServer = Server<Postgres>;

/// Where the PostgreSQL programs are and whom they run as.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct PgInstall {
    bin_dir: PathBuf,
    run_as: Option<RunAs>,
}

impl PgInstall {
    fn program(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// The PostgreSQL kind: what a server keeps beyond its process.
#[derive(Debug)]
pub struct Postgres {
    socket_dir: PathBuf,
    /// The harness's own sessions go through the socket ([`PostgresOptions::tls_only`]).
    via_socket: bool,
    init: InitStep,
}

/// How the data dir is made: `initdb`, or `pg_basebackup` from a primary.
#[derive(Debug)]
struct InitStep {
    tool: &'static str,
    program: PathBuf,
    args: Vec<String>,
    run_as: Option<RunAs>,
    dir: PathBuf,
    timeout: Duration,
}

#[async_trait]
impl ServerKind for Postgres {
    type Options = PostgresOptions;
    type Program = PgInstall;

    const NAME: &'static str = "postgres";
    const CLUSTER: &'static str = "postgres servers";
    const SCHEME: &'static str = "postgres";
    const CLUSTER_SCHEME: &'static str = "postgres";
    const PORTS: usize = 1;
    /// The harness's own library (see the `clock` module): the postmaster and every
    /// backend it forks inherit it; a backend reads the wall clock through the C library.
    const CLOCK_HOOK: ClockHook = ClockHook::Own;

    fn movable_clock(options: &PostgresOptions) -> bool {
        options.movable_clock
    }

    fn url(addr: SocketAddr) -> String {
        format!("postgres://{OS_USER}@{addr}/postgres")
    }

    fn find() -> Result<PgInstall, HarnessError> {
        let env_set = std::env::var_os(BIN_ENV).is_some_and(|v| !v.is_empty());
        let postgres = match newest_debian_bin_dir().filter(|_| !env_set) {
            Some(dir) => dir.join("postgres"),
            None => find_binary("postgres", BIN_ENV, HINT)?,
        };
        let bin_dir = postgres.parent().map(Path::to_owned).unwrap_or_default();
        for tool in ["initdb", "pg_basebackup"] {
            let path = bin_dir.join(tool);
            if !is_executable(&path) {
                return Err(HarnessError::MissingBinary {
                    binary: path.display().to_string(),
                    hint: HINT,
                });
            }
        }
        Ok(PgInstall {
            bin_dir,
            run_as: run_as()?,
        })
    }

    fn members(_options: &PostgresOptions) -> usize {
        1
    }

    fn ready_timeout(options: &PostgresOptions) -> Duration {
        options.ready_timeout
    }

    fn prepare(
        install: &PgInstall,
        options: &PostgresOptions,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Prepared<Self>, HarnessError> {
        let port = member.own_ports()[0];
        let label = format!("postgres 127.0.0.1:{port}");
        let data_dir = dir.join("data");
        let socket_dir = dir.join("sock");
        open_up(&label, dir)?;
        owned_dir(&label, &data_dir, 0o700, install.run_as)?;
        owned_dir(&label, &socket_dir, 0o755, install.run_as)?;
        let data = data_dir.display().to_string();
        let words = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let (tool, mut tool_args) = match options.replica_of {
            None => (
                "initdb",
                words("-U postgres --auth=trust -E UTF8 --locale=C --no-sync"),
            ),
            Some(primary) => (
                "pg_basebackup",
                words(&format!(
                    "-h 127.0.0.1 -p {primary} -U postgres -R -X stream -c fast --no-sync"
                )),
            ),
        };
        tool_args.extend(["-D".to_owned(), data.clone()]);
        let init = InitStep {
            tool,
            program: install.program(tool),
            args: tool_args,
            run_as: install.run_as,
            dir: dir.to_owned(),
            timeout: options.ready_timeout,
        };
        let mut args: Vec<String> = vec![
            "-D".into(),
            data,
            "-p".into(),
            port.to_string(),
            "-k".into(),
            socket_dir.display().to_string(),
        ];
        for setting in [
            "listen_addresses=127.0.0.1",
            "fsync=off",
            "max_connections=200",
            "wal_level=replica",
            "max_wal_senders=5",
            "hot_standby=on",
        ] {
            args.extend(["-c".to_owned(), setting.to_owned()]);
        }
        if let Some(certificates) = &options.tls {
            args.extend(tls_args(&label, dir, certificates, install.run_as)?);
            if options.tls_only {
                let hba = hba_only_tls(&label, dir, options.client_certificates)?;
                args.extend(["-c".to_owned(), hba]);
            }
        }
        let via_socket = options.tls.is_some() && options.tls_only;
        args.extend(options.extra_args.iter().cloned());
        let spec = LaunchSpec {
            program: install.program("postgres"),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: dir.to_owned(),
            log: dir.join("server.log"),
            run_as: install.run_as,
            with_children: true,
        };
        Ok(Prepared {
            node: Node::new(
                label,
                spec,
                Probe::Postgres {
                    addr: loopback(port),
                    socket: via_socket.then(|| socket_dir.clone()),
                },
                options.ready_timeout,
            ),
            data_dir,
            kind: Postgres {
                socket_dir,
                via_socket,
                init,
            },
        })
    }

    /// Runs `initdb`, or `pg_basebackup` from the primary for a replica.
    async fn initialize(server: &PostgresServer) -> Result<(), HarnessError> {
        server.kind.init.run(server.node.label()).await
    }
}

impl Server<Postgres> {
    /// libpq key/value connection string:
    /// `host=127.0.0.1 port=PORT user=postgres dbname=postgres` (with
    /// [`PostgresOptions::tls_only`], `host=` the socket directory).
    pub fn conninfo(&self) -> String {
        conninfo(self.port(), self.socket())
    }

    /// The socket directory when the harness's sessions go through it.
    fn socket(&self) -> Option<&Path> {
        self.kind
            .via_socket
            .then_some(self.kind.socket_dir.as_path())
    }

    /// The directory of the server's Unix socket (`-k`).
    pub fn socket_dir(&self) -> &Path {
        &self.kind.socket_dir
    }

    /// A client connected over TCP, its connection driven by a task spawned on the
    /// current tokio runtime (it ends when the client is dropped).
    ///
    /// # Errors
    /// If no session is established within 5 s.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, HarnessError> {
        let conninfo = self.conninfo();
        let connect = tokio_postgres::connect(&conninfo, NoTls);
        let (client, connection) = tokio::time::timeout(QUERY_TIMEOUT, connect)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))
            .and_then(|r| r.map_err(std::io::Error::other))
            .map_err(|e| HarnessError::io(self.node.label(), "connect", e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Runs `sql` (simple query protocol, one or more statements) on a fresh connection;
    /// the rows of every statement, each column as text (`None`: NULL).
    ///
    /// # Errors
    /// If the server does not answer within 5 s, or answers an error.
    pub async fn query(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, HarnessError> {
        simple_query(self.addr(), self.socket(), sql, QUERY_TIMEOUT)
            .await
            .map_err(|e| HarnessError::io(self.node.label(), format!("query {sql:?}"), e))
    }

    /// The first column of the first row `sql` returns (`None`: no row, or NULL).
    ///
    /// # Errors
    /// As [`query`](Self::query).
    pub async fn query_value(&self, sql: &str) -> Result<Option<String>, HarnessError> {
        let rows = self.query(sql).await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next()?))
    }

    /// Whether the server is a standby (`pg_is_in_recovery()`).
    ///
    /// # Errors
    /// As [`query`](Self::query).
    pub async fn is_in_recovery(&self) -> Result<bool, HarnessError> {
        let value = self.query_value("SELECT pg_is_in_recovery()").await?;
        Ok(value.as_deref() == Some("t"))
    }
}

/// The `-c` arguments of a server serving TLS with the certificates in `certificates`
/// (see [`PostgresOptions::tls`]): copies in `dir/tls`, owned by `user` (the key mode
/// 0600, as the server demands).
fn tls_args(
    label: &str,
    dir: &Path,
    certificates: &Path,
    user: Option<RunAs>,
) -> Result<Vec<String>, HarnessError> {
    let tls_dir = dir.join("tls");
    owned_dir(label, &tls_dir, 0o755, user)?;
    let mut args = vec!["-c".to_owned(), "ssl=on".to_owned()];
    for (setting, file, mode) in [
        ("ssl_cert_file", "server.pem", 0o644),
        ("ssl_key_file", "server.key", 0o600),
        ("ssl_ca_file", "ca.pem", 0o644),
    ] {
        let (from, to) = (certificates.join(file), tls_dir.join(file));
        let io = |action: &str, e| HarnessError::io(label, format!("{action} {}", to.display()), e);
        std::fs::copy(&from, &to).map_err(|e| io("copy to", e))?;
        if let Some(user) = user {
            std::os::unix::fs::chown(&to, Some(user.uid), Some(user.gid))
                .map_err(|e| io("chown", e))?;
        }
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io("chmod", e))?;
        args.extend(["-c".to_owned(), format!("{setting}={}", to.display())]);
    }
    Ok(args)
}

/// Writes `dir/pg_hba.conf` taking TCP sessions over TLS only (the socket's as ever),
/// with a client certificate if `client_certificates`; the `hba_file=` setting that
/// points the server at it.
fn hba_only_tls(
    label: &str,
    dir: &Path,
    client_certificates: bool,
) -> Result<String, HarnessError> {
    let path = dir.join("pg_hba.conf");
    let trust = if client_certificates {
        "trust clientcert=verify-ca"
    } else {
        "trust"
    };
    std::fs::write(
        &path,
        format!(
            "local all all trust\n\
             local replication all trust\n\
             hostssl all all 127.0.0.1/32 {trust}\n\
             hostssl replication all 127.0.0.1/32 {trust}\n\
             hostnossl all all 127.0.0.1/32 reject\n\
             hostnossl replication all 127.0.0.1/32 reject\n"
        ),
    )
    .map_err(|e| HarnessError::io(label, format!("write {}", path.display()), e))?;
    Ok(format!("hba_file={}", path.display()))
}

/// `bin` of the newest `/usr/lib/postgresql/<version>` holding `postgres` and `initdb`.
fn newest_debian_bin_dir() -> Option<PathBuf> {
    let version = |name: &str| -> Option<Vec<u32>> {
        name.split('.').map(|part| part.parse().ok()).collect()
    };
    std::fs::read_dir(DEBIAN_ROOT)
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let v = version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            let complete = ["postgres", "initdb"]
                .iter()
                .all(|p| is_executable(&bin.join(p)));
            complete.then_some((v, bin))
        })
        .max()
        .map(|(_, bin)| bin)
}

/// As root: the OS user `postgres` (missing: [`HarnessError::MissingBinary`]); else
/// `None` (the server runs as the current user).
fn run_as() -> Result<Option<RunAs>, HarnessError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name(OS_USER) {
        Ok(Some(user)) => Ok(Some(RunAs {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        })),
        Ok(None) => Err(HarnessError::MissingBinary {
            binary: format!("OS user `{OS_USER}` (the server refuses to run as root)"),
            hint: HINT,
        }),
        Err(e) => Err(HarnessError::io(
            "postgres",
            format!("look up OS user {OS_USER}"),
            e.into(),
        )),
    }
}

/// Lets other users into `dir` (a private temp dir) and through its parent.
fn open_up(label: &str, dir: &Path) -> Result<(), HarnessError> {
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| HarnessError::io(label, format!("chmod {}", path.display()), e))
    };
    chmod(dir, 0o755)?;
    if let Some(parent) = dir.parent() {
        let meta = parent
            .metadata()
            .map_err(|e| HarnessError::io(label, format!("stat {}", parent.display()), e))?;
        let mode = meta.permissions().mode() & 0o7777;
        let ours = std::os::unix::fs::MetadataExt::uid(&meta) == nix::unistd::geteuid().as_raw();
        if mode & 0o001 == 0 && ours {
            chmod(parent, mode | 0o711)?;
        }
    }
    Ok(())
}

/// Creates `dir` with `mode`, owned by `user` if given.
fn owned_dir(label: &str, dir: &Path, mode: u32, user: Option<RunAs>) -> Result<(), HarnessError> {
    create_dir(label, dir)?;
    if let Some(user) = user {
        std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
            .map_err(|e| HarnessError::io(label, format!("chown {}", dir.display()), e))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| HarnessError::io(label, format!("chmod {}", dir.display()), e))
}

impl InitStep {
    /// Runs the tool as the server's user, output to `<dir>/<tool>.log`, for at most
    /// `timeout` (then kills it).
    async fn run(&self, label: &str) -> Result<(), HarnessError> {
        let log = self.dir.join(format!("{}.log", self.tool));
        let action = format!("{} (log {})", self.tool, log.display());
        let io = |e| HarnessError::io(label, action.clone(), e);
        let out = File::create(&log).map_err(io)?;
        let err = out.try_clone().map_err(io)?;
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        if let Some(user) = self.run_as {
            cmd.gid(user.gid).uid(user.uid);
        }
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(io)?;
        let Ok(status) = tokio::time::timeout(self.timeout, child.wait()).await else {
            let _ = child.kill().await;
            let tail = log_tail(&log, LOG_TAIL_LINES);
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("not done after {:?}\n{tail}", self.timeout),
            )));
        };
        let status = status.map_err(io)?;
        tracing::debug!(server = label, tool = self.tool, elapsed = ?started.elapsed(), "ran");
        if status.success() {
            Ok(())
        } else {
            let tail = log_tail(&log, LOG_TAIL_LINES);
            Err(io(std::io::Error::other(format!("{status}\n{tail}"))))
        }
    }
}
