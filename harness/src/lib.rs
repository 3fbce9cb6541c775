//! Real servers for tests: redis-server, ZooKeeper, etcd and PostgreSQL, single or clustered.
//!
//! One server of any kind is a [`Server<K>`](Server), a group of them a
//! [`Cluster<K>`](Cluster); the kinds ([`Redis`], [`ZooKeeper`], [`Etcd`]) say what
//! differs ([`ServerKind`]). [`RedisServer`], [`ZkEnsemble`], [`EtcdCluster`]... name
//! the usual combinations; [`RedisSentinel`] is a primary with replicas behind Sentinels,
//! [`RedisCluster`] a Redis Cluster of three primaries with a replica each,
//! [`PostgresReplicated`] a PostgreSQL primary with a streaming replica.
//!
//! Every server runs as a child process on free 127.0.0.1 ports, in its own temporary
//! directory that holds its data, its config and its log (stdout and stderr). `start`
//! returns once the server answers a readiness probe (over raw TCP: Redis `PING`,
//! ZooKeeper `srvr`, etcd `GET /health`; PostgreSQL `SELECT 1`); every wait is bounded
//! and a failure quotes the end of the server's log. Start-up is retried on fresh ports when a port turns out to
//! be taken by another process.
//!
//! Fault injection: [`kill9`](RedisServer::kill9) (SIGKILL and reap),
//! [`pause`](RedisServer::pause) / [`resume`](RedisServer::resume) (SIGSTOP / SIGCONT),
//! [`restart`](RedisServer::restart) on the same ports and data dir, and
//! [`jump_clock`](RedisServer::jump_clock) for a server started on a wall clock the
//! harness moves (`RedisOptions::movable_clock`, `ZkOptions::movable_clock`; see
//! [`ClockHook`] for how). All of them take `&self`, so a server can be shared (e.g. in an `Arc`) with the tasks under test.
//!
//! # Drop
//! Dropping a server SIGKILLs its process (also when paused) and reaps it with a short,
//! bounded, non-sleeping wait; if that does not finish, the tokio runtime reaps it later.
//! Then the temporary directory is removed. A server kept in a `static` is never dropped:
//! its process outlives the test binary.
//!
//! # Binaries
//! Looked up on the `PATH` (and `/usr/bin`, `/usr/sbin`, `/usr/local/bin`), or taken from
//! `$REDIS_SERVER_BIN`, `$ETCD_BIN`, `$JAVA_BIN`. PostgreSQL: `$POSTGRES_BIN`, else the
//! newest `/usr/lib/postgresql/<version>/bin`, else the `PATH`, with `initdb` and
//! `pg_basebackup` beside it; as root it runs as the OS user `postgres`. ZooKeeper runs as
//! `java -cp zookeeper.jar:<log4j binding> QuorumPeerMain` with the jars of the Debian
//! package (`/usr/share/java`), or with `$ZOOKEEPER_CLASSPATH`; at most three ZooKeeper
//! JVMs start at once per process (an ensemble takes its three slots together).
//!
//! # Missing servers
//! A missing binary is [`HarnessError::MissingBinary`]. Tests pass the start result
//! through [`or_skip`] (or the [`require_server!`](crate::require_server) macro): the
//! test is skipped with a loud banner, or fails when [`strict`] mode
//! (`LOCK_TEST_STRICT=1`) is on. Any other start failure always fails the test.
//!
//! ```no_run
//! use harness::RedisServer;
//! use harness::require_server;
//!
//! # async fn example() {
//! let redis = require_server!(RedisServer::start().await);
//! let url = redis.url(); // redis://127.0.0.1:PORT
//! # let _ = url;
//! # }
//! ```

/// Builder setters of an options struct, one per field named: `fn field(self, value) ->
/// Self`, documented as setting that field.
macro_rules! setters {
    ($options:ty { $($field:ident: $ty:ty),* $(,)? }) => {
        impl $options {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                pub fn $field(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

mod clock;
mod cluster;
pub mod curator;
mod error;
mod etcd;
mod node;
mod ports;
mod postgres;
mod probe;
mod process;
pub mod proxy;
mod redis;
mod redis_cluster;
mod sentinel;
mod server;
pub mod shared;
pub mod tls;
mod zookeeper;

use std::future::Future;
use std::io::Write;
use std::time::Duration;

pub use clock::{ClockHook, ClockJump, WallClock};
pub use cluster::{Cluster, Deployment};
pub use error::HarnessError;
pub use etcd::{Etcd, EtcdCluster, EtcdOptions, EtcdServer, EtcdStatus};
pub use ports::{free_port, free_ports};
#[doc(hidden)]
pub use postgres::PgInstall;
pub use postgres::{Postgres, PostgresOptions, PostgresReplicated, PostgresServer};
pub(crate) use process::find_binary;
pub use process::output_text;
pub use redis::{Redis, RedisNodes, RedisOptions, RedisServer};
pub use redis_cluster::{RedisCluster, SlotMove};
pub use sentinel::{Front, RedisSentinel, Sentinel, SentinelOptions};
#[doc(hidden)]
pub use server::{Member, Prepared};
pub use server::{Server, ServerControl, ServerKind};
#[doc(hidden)]
pub use zookeeper::ZkRuntime;
pub use zookeeper::{ZkEnsemble, ZkMode, ZkOptions, ZkServer, ZkTls, ZooKeeper};

/// Default bound on a server's readiness wait.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Grace period of [`stop`](RedisServer::stop) before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Start attempts on fresh ports when a port is found taken.
const START_ATTEMPTS: usize = 5;

/// Environment variable that turns a missing server binary into a test failure.
pub const STRICT_ENV: &str = "LOCK_TEST_STRICT";

/// True when `LOCK_TEST_STRICT` is `1` (or `true`/`yes`): missing servers fail tests.
pub fn strict() -> bool {
    std::env::var(STRICT_ENV).is_ok_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
    })
}

/// Turns a server start result into "run the test" or "skip it".
///
/// Returns the server on success. On [`HarnessError::MissingBinary`] prints a loud
/// banner to stderr and returns `None` (the caller returns early), unless [`strict`]
/// mode is on.
///
/// # Panics
/// On a missing binary in strict mode, and on every other start failure.
#[track_caller]
pub fn or_skip<T>(result: Result<T, HarnessError>) -> Option<T> {
    match result {
        Ok(server) => Some(server),
        Err(e) if e.is_missing_binary() && !strict() => {
            let test = std::thread::current()
                .name()
                .unwrap_or("<unnamed>")
                .to_owned();
            let rule = "=".repeat(78);
            // Straight to the stderr handle: `eprintln!` would be captured (hidden) by the
            // test harness for a test that then passes.
            let _ = writeln!(
                std::io::stderr().lock(),
                "\n{rule}\nSKIPPED {test}: {e}\n\
                 (set {STRICT_ENV}=1 to make a missing server a test failure)\n{rule}\n"
            );
            None
        }
        Err(e) if e.is_missing_binary() => panic!("{STRICT_ENV} is set and {e}"),
        Err(e) => panic!("test server failed to start: {e}"),
    }
}

/// Starts a server for a test or skips the test: `let s = require_server!(start);`.
///
/// Expands to [`crate::or_skip`] and a `return` from the enclosing
/// test function (which must return `()`) when the server binary is missing and strict
/// mode is off. Panics like `or_skip` otherwise.
#[macro_export]
macro_rules! require_server {
    ($start:expr) => {
        match $crate::or_skip($start) {
            ::core::option::Option::Some(server) => server,
            ::core::option::Option::None => return,
        }
    };
}

/// Runs `attempt` until it succeeds or fails for a reason other than a port clash.
async fn with_port_retries<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, HarnessError>>,
{
    let mut n = 0;
    loop {
        n += 1;
        match attempt().await {
            Err(e) if e.is_addr_in_use() && n < START_ATTEMPTS => {
                tracing::warn!(
                    server = what,
                    attempt = n,
                    "port taken, retrying on fresh ports"
                );
            }
            other => return other,
        }
    }
}

/// A fresh temporary directory named after the server kind.
fn temp_dir(kind: &str) -> Result<tempfile::TempDir, HarnessError> {
    tempfile::Builder::new()
        .prefix(&format!("distlock-{kind}-"))
        .tempdir()
        .map_err(|e| HarnessError::io(kind, "create temp dir", e))
}

/// Writes a file, mapping the error.
fn write_file(server: &str, path: &std::path::Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text)
        .map_err(|e| HarnessError::io(server, format!("write {}", path.display()), e))
}

/// Creates a directory (and parents), mapping the error.
fn create_dir(server: &str, path: &std::path::Path) -> Result<(), HarnessError> {
    std::fs::create_dir_all(path)
        .map_err(|e| HarnessError::io(server, format!("create {}", path.display()), e))
}

/// The outcome of a cluster's member start-ups: a port clash first (so that the start
/// is retried on fresh ports), else the first error.
fn first_error(results: Vec<Result<(), HarnessError>>) -> Result<(), HarnessError> {
    let mut errors: Vec<HarnessError> = results.into_iter().filter_map(Result::err).collect();
    match errors.iter().position(HarnessError::is_addr_in_use) {
        Some(i) => Err(errors.swap_remove(i)),
        None => errors.into_iter().next().map_or(Ok(()), Err),
    }
}

/// Polls `leader` until it names a member other than `old`, for at most `timeout`; the
/// error carries the last observation. Shared by the consensus clusters.
async fn wait_for_leader<F, Fut>(
    cluster: &str,
    old: Option<usize>,
    timeout: Duration,
    leader: F,
) -> Result<usize, HarnessError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<usize, HarnessError>>,
{
    let started = std::time::Instant::now();
    loop {
        let last = match leader().await {
            Ok(i) if Some(i) != old => return Ok(i),
            Ok(i) => HarnessError::Cluster {
                cluster: cluster.to_owned(),
                detail: format!("member {i} is still leader"),
            },
            Err(e) => e,
        };
        if started.elapsed() >= timeout {
            return Err(HarnessError::Cluster {
                cluster: cluster.to_owned(),
                detail: format!("no leader after {timeout:?}; last: {last}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Majority of `n` members.
fn majority(n: usize) -> usize {
    n / 2 + 1
}
