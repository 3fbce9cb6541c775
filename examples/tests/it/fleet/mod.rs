//! A fleet of `fleet_member` processes on one lock name against real servers (by default
//! a ZooKeeper server as the old backend and a Redis server as the new one; PostgreSQL can
//! be either), all writing one fenced resource served by the test process on loopback TCP;
//! and the checks of its history. The servers come from the harness and are killed (by
//! pid) when the fleet drops.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conformance::{FenceReport, FenceServer, FencedResource};
use harness::{or_skip, PostgresServer, RedisServer, ZkServer};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

/// Bound on a member's start (a Curator member starts a JVM).
const READY_WITHIN: Duration = Duration::from_secs(60);
/// Bound on a member's exit once asked to stop, or on its run of cycles.
const EXIT_WITHIN: Duration = Duration::from_secs(90);
/// The ZooKeeper path prefix of the fleet's locks.
const ZK_PREFIX: &str = "/migration";

/// A backend a fleet migrates from or to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    ZooKeeper,
    Redis,
    Postgres,
}

/// A running server of a [`Backend`].
pub(crate) enum BackendServer {
    ZooKeeper(ZkServer),
    Redis(RedisServer),
    Postgres(PostgresServer),
}

impl Backend {
    /// Starts a server; `None` (after a loud notice) when it is not installed and strict
    /// mode is off.
    async fn start(self) -> Option<BackendServer> {
        Some(match self {
            Backend::ZooKeeper => BackendServer::ZooKeeper(or_skip(ZkServer::start().await)?),
            Backend::Redis => BackendServer::Redis(or_skip(RedisServer::start().await)?),
            Backend::Postgres => BackendServer::Postgres(or_skip(PostgresServer::start().await)?),
        })
    }
}

impl BackendServer {
    /// The lock URL of the server, with `query` (`?key=value&…`).
    fn url(&self, query: &str) -> String {
        match self {
            BackendServer::ZooKeeper(zk) => format!("zk://{}{ZK_PREFIX}{query}", zk.addr()),
            BackendServer::Redis(redis) => format!("{}{query}", redis.url()),
            BackendServer::Postgres(postgres) => format!("{}{query}", postgres.url()),
        }
    }
}

/// Who a member is: its kind and lock URL.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// `distlock`, `curator` or `set-nx`.
    pub(crate) kind: &'static str,
    /// Its lock URL.
    pub(crate) url: String,
    /// Cycles to run at most.
    pub(crate) cycles: u64,
    /// Time inside each section.
    pub(crate) hold: Duration,
    /// Pause after each release.
    pub(crate) pause: Duration,
}

/// The servers, the fenced resource and the lock name of one fleet.
pub(crate) struct Fleet {
    pub(crate) resource: FencedResource,
    /// The old backend's server.
    pub(crate) old_server: BackendServer,
    /// The new backend's server.
    pub(crate) new_server: BackendServer,
    pub(crate) name: String,
    query: &'static str,
    fence: FenceServer,
    dir: tempfile::TempDir,
    go_file: PathBuf,
    classpath: Option<String>,
    spawned: AtomicUsize,
}

/// What a member printed last.
#[derive(Debug, Clone, Default)]
struct Progress {
    ready: bool,
    cycles: u64,
    summary: Option<String>,
    closed: bool,
}

/// What a member reports when it ends (`SUMMARY <json>`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Summary {
    pub(crate) url: String,
    pub(crate) cycles: u64,
    pub(crate) last_token: Option<u64>,
    pub(crate) tokens_backwards: u64,
    pub(crate) max_wait_ms: u64,
    pub(crate) error: Option<String>,
}

/// One running member; SIGKILLed if dropped before it ends.
pub(crate) struct Member {
    pub(crate) label: String,
    child: Child,
    stop_file: PathBuf,
    progress: watch::Receiver<Progress>,
}

impl Fleet {
    /// Starts the servers and the resource; `None` (after a loud notice) when a server is
    /// not installed and strict mode is off.
    pub(crate) async fn start(tag: &str) -> Option<Fleet> {
        Fleet::start_with(tag, "").await
    }

    /// [`Fleet::start`], with lock options `query` (`?key=value&…`) on every URL.
    pub(crate) async fn start_with(tag: &str, query: &'static str) -> Option<Fleet> {
        Fleet::start_between(tag, Backend::ZooKeeper, Backend::Redis, query).await
    }

    /// [`Fleet::start_with`], migrating from `old` to `new`.
    pub(crate) async fn start_between(
        tag: &str,
        old: Backend,
        new: Backend,
        query: &'static str,
    ) -> Option<Fleet> {
        let (old_server, new_server) = tokio::join!(old.start(), new.start());
        let (old_server, new_server) = (old_server?, new_server?);
        let resource = FencedResource::new();
        let fence = FenceServer::start(resource.clone())
            .await
            .expect("fence server");
        let dir = tempfile::tempdir().expect("temp dir");
        Some(Fleet {
            resource,
            old_server,
            new_server,
            name: format!("{tag}-{}", uuid::Uuid::new_v4().simple()),
            query,
            fence,
            go_file: dir.path().join("go"),
            dir,
            classpath: None,
            spawned: AtomicUsize::new(0),
        })
    }

    /// The old-only URL.
    pub(crate) fn old(&self) -> String {
        self.old_server.url(self.query)
    }

    /// The new-only URL.
    pub(crate) fn new_only(&self) -> String {
        self.new_server.url(self.query)
    }

    /// The ZooKeeper server of a fleet whose old backend is ZooKeeper.
    pub(crate) fn zk(&self) -> &ZkServer {
        match &self.old_server {
            BackendServer::ZooKeeper(zk) => zk,
            _ => panic!("the fleet's old backend is not ZooKeeper"),
        }
    }

    /// The dual URL.
    pub(crate) fn dual(&self) -> String {
        format!("dual:{}|{}", self.old(), self.new_only())
    }

    /// Compiles the Curator holder once; `None` (after a loud notice) without java.
    pub(crate) async fn with_curator(&mut self) -> bool {
        if self.classpath.is_none() {
            self.classpath = harness::curator::compile(self.dir.path()).await;
        }
        self.classpath.is_some()
    }

    /// Starts a member; it cycles once [`Fleet::go`] was called (at once after that).
    pub(crate) fn spawn(&self, label: &str, spec: &Spec) -> Member {
        let n = self.spawned.fetch_add(1, Ordering::Relaxed);
        let label = format!("{label}#{n}");
        let stop_file = self.dir.path().join(format!("stop-{n}"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_fleet_member"));
        command
            .args([
                "--kind", spec.kind, "--url", &spec.url, "--name", &self.name,
            ])
            .arg("--fence")
            .arg(self.fence.addr().to_string())
            .args(["--cycles", &spec.cycles.to_string()])
            .args(["--hold", &format!("{}ms", spec.hold.as_millis())])
            .args(["--pause", &format!("{}ms", spec.pause.as_millis())])
            .arg("--stop-file")
            .arg(&stop_file)
            .arg("--go-file")
            .arg(&self.go_file)
            .args(["--wait", "30s"]);
        if spec.kind == "curator" {
            let classpath = self.classpath.as_deref().expect("with_curator first");
            command.args(["--classpath", classpath]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("fleet_member starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tell, progress) = watch::channel(Progress::default());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tell.send_modify(|p| {
                    if line == "READY" {
                        p.ready = true;
                    } else if let Some(cycle) = line.strip_prefix("CYCLE ") {
                        let n = cycle.split(' ').next().and_then(|n| n.parse().ok());
                        p.cycles = n.unwrap_or(p.cycles);
                    } else if let Some(json) = line.strip_prefix("SUMMARY ") {
                        p.summary = Some(json.to_owned());
                    }
                });
            }
            tell.send_modify(|p| p.closed = true);
        });
        Member {
            label,
            child,
            stop_file,
            progress,
        }
    }

    /// Lets every member (also later ones) start cycling.
    pub(crate) fn go(&self) {
        std::fs::write(&self.go_file, b"").expect("go file");
    }

    /// Checks the resource's history and every member's summary: no overlapping sections,
    /// no token going back, no lost update, no stale token offered, no section left open,
    /// and one accepted write per cycle reported.
    pub(crate) fn assert_safe(&self, summaries: &[Summary]) -> FenceReport {
        let report = self.resource.check();
        let cycles: u64 = summaries.iter().map(|s| s.cycles).sum();
        assert!(report.is_safe(), "unsafe history: {report:?}");
        assert_eq!(report.rejected_begins, 0, "{report:?}");
        assert_eq!(report.rejected_writes, 0, "{report:?}");
        assert_eq!(report.open_sections, 0, "{report:?}");
        assert_eq!(report.accepted_writes, cycles, "{report:?}");
        assert_eq!(report.counter, cycles, "{report:?}");
        for summary in summaries {
            assert_eq!(summary.tokens_backwards, 0, "{summary:?}");
        }
        report
    }
}

impl Member {
    /// Waits until the member has connected.
    pub(crate) async fn ready(&mut self) {
        self.until(|p| p.ready, READY_WITHIN, "connect").await;
    }

    /// Waits until the member has run `n` cycles.
    pub(crate) async fn reach(&mut self, n: u64) {
        self.until(|p| p.cycles >= n, EXIT_WITHIN, &format!("run {n} cycles"))
            .await;
    }

    /// Cycles run so far.
    pub(crate) fn cycles(&self) -> u64 {
        self.progress.borrow().cycles
    }

    async fn until(
        &mut self,
        done: impl Fn(&Progress) -> bool + Send + Sync,
        within: Duration,
        what: &str,
    ) {
        let label = self.label.clone();
        let waited = timeout(within, self.progress.wait_for(|p| done(p) || p.closed)).await;
        let progress = match waited {
            Ok(Ok(progress)) => progress.clone(),
            _ => panic!("{label} did not {what} within {within:?}"),
        };
        assert!(
            done(&progress),
            "{label} ended before it could {what}: {progress:?}"
        );
    }

    /// Asks the member to stop after its current cycle and waits for its summary.
    pub(crate) async fn stop(self) -> Summary {
        std::fs::write(&self.stop_file, b"").expect("stop file");
        self.finish().await
    }

    /// Waits (bounded) for the member to end; it must end well.
    pub(crate) async fn finish(self) -> Summary {
        let label = self.label.clone();
        let summary = self.end().await;
        assert!(summary.error.is_none(), "{label} failed: {summary:?}");
        summary
    }

    /// Waits (bounded) for the member to end, well or not; its summary says which (a
    /// failure without an error in the summary is given one).
    pub(crate) async fn end(mut self) -> Summary {
        let started = Instant::now();
        let status = match timeout(EXIT_WITHIN, self.child.wait()).await {
            Ok(status) => status.expect("wait for member"),
            Err(_) => {
                let _ = self.child.kill().await;
                panic!(
                    "{} did not end within {EXIT_WITHIN:?} (at {} cycles): deadlock?",
                    self.label,
                    self.cycles()
                );
            }
        };
        let rest = EXIT_WITHIN.saturating_sub(started.elapsed());
        let progress = timeout(rest, self.progress.wait_for(|p| p.closed))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|p| p.clone())
            .unwrap_or_default();
        let json = progress
            .summary
            .unwrap_or_else(|| panic!("{} printed no summary ({status})", self.label));
        let mut summary: Summary = serde_json::from_str(&json).expect("summary json");
        if !status.success() && summary.error.is_none() {
            summary.error = Some(format!("ended with {status}"));
        }
        summary
    }
}
