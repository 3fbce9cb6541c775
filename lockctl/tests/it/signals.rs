//! `lockctl run` never lets its command outlive the lock, with real processes and a real
//! Redis.
//!
//! Each command appends its events to one shared log file, so the file's line order is
//! the order in which the events happened. A first `lockctl run` is signalled (or
//! SIGKILLed) while its command runs; a second `lockctl run` of the same name then waits
//! for the lock. The second command may start only after the first one ended.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use harness::proxy::{FaultProxy, ProxyMode};
use harness::{or_skip, RedisServer};
use lab::chaos::ReportRow;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::{sleep, timeout, Instant};

/// The lock's TTL: a command that outlived lockctl would outlive its lease too.
const TTL: Duration = Duration::from_secs(3);
/// Bound on every wait for a process or a log line.
const WAIT: Duration = Duration::from_secs(30);

/// A log file shared by the commands of one test; removed on drop.
struct EventLog(PathBuf);

impl EventLog {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!(
            "lockctl-signals-{}.log",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, "").expect("create the event log");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.0)
            .expect("read the event log")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits (bounded) for a line starting with `prefix` and returns it.
    async fn wait_for(&self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| l.starts_with(prefix)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no `{prefix}` in the event log: {:?}",
                self.lines()
            );
            sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Starts `lockctl run [extra...] NAME -- sh -c SCRIPT` with `$LOG` set to the event log.
fn lockctl(url: &str, name: &str, extra: &[&str], script: &str, log: &EventLog) -> Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", url, "run", "--timeout", "30s"])
        .args(extra)
        .args([name, "--", "sh", "-c"])
        .arg(format!("log() {{ echo \"$1\" >> \"$LOG\"; }}\n{script}"))
        .env("LOG", log.path())
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl starts")
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid fits"))
}

async fn wait_exit(child: &mut Child) -> ExitStatus {
    timeout(WAIT, child.wait())
        .await
        .expect("lockctl ends")
        .expect("wait for lockctl")
}

/// The second command, which takes the lock after the first.
const SECOND: &str = r#"log "B start"; sleep 0.2; log "B end""#;

/// The log with runs of equal lines collapsed (`A beat x30`).
fn summary(lines: &[String]) -> Vec<String> {
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for line in lines {
        match runs.last_mut() {
            Some((last, n)) if last == line => *n += 1,
            _ => runs.push((line, 1)),
        }
    }
    runs.into_iter()
        .map(|(line, n)| {
            if n == 1 {
                line.to_owned()
            } else {
                format!("{line} x{n}")
            }
        })
        .collect()
}

/// Asserts that no line of the first command comes after the second command's start.
fn assert_no_overlap(lines: &[String]) {
    assert!(
        no_overlap(lines),
        "the second command did not start after the first had ended: {:?}",
        summary(lines)
    );
}

/// What followed the signal to the first lockctl.
struct Outcome {
    /// How the first lockctl ended, and how long after the signal.
    holder: ExitStatus,
    holder_exited: Duration,
    /// How long after the signal the first command was gone (`None`: not within `WAIT`).
    command_died: Option<Duration>,
    /// How the second lockctl ended.
    second: ExitStatus,
    lines: Vec<String>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("holder", &self.holder)
            .field("holder_exited", &self.holder_exited)
            .field("command_died", &self.command_died)
            .field("second", &self.second)
            .field("log", &summary(&self.lines))
            .finish()
    }
}

/// Sends `signal` to the first lockctl (whose command logs `A pid PID` first), starts a
/// second `lockctl run NAME` at once, and waits (bounded) for both and for the first
/// command's end.
async fn stop_first(
    scenario: &str,
    holder: Child,
    signal: Signal,
    url: &str,
    name: &str,
    log: &EventLog,
) -> Outcome {
    let pid = pid_of(&holder);
    let stop = move || kill(pid, signal).expect("signal lockctl");
    let outcome = after_fault(holder, stop, url, name, log).await;
    eprintln!("{signal}: {outcome:?}");
    record(scenario, &outcome, url);
    outcome
}

/// Once the first lockctl's command runs (it logs `A pid PID` first), applies `fault`,
/// starts a second `lockctl run NAME` at once, and waits (bounded) for both and for the
/// first command's end. The command's end is timed on its own: lockctl itself may take
/// longer to exit (it closes its client, over a cut link within the request timeout).
async fn after_fault(
    mut holder: Child,
    fault: impl FnOnce(),
    url: &str,
    name: &str,
    log: &EventLog,
) -> Outcome {
    let command = log.wait_for("A pid ").await;
    let command = Pid::from_raw(command["A pid ".len()..].parse().expect("a pid"));
    fault();
    let sent = Instant::now();
    let mut second = lockctl(url, name, &[], SECOND, log);
    let (holder_status, command_died) = tokio::join!(wait_exit(&mut holder), async {
        dies(command).await.then(|| sent.elapsed())
    });
    let holder_exited = sent.elapsed();
    if command_died.is_none() {
        let _ = kill(command, Signal::SIGKILL);
    }
    let second = wait_exit(&mut second).await;
    Outcome {
        holder: holder_status,
        holder_exited,
        command_died,
        second,
        lines: log.lines(),
    }
}

/// Adds the outcome to the reliability report (under `make chaos`): a row per signal,
/// graded as the scenarios are (an overlap of the two commands is a violation).
fn record(scenario: &str, outcome: &Outcome, url: &str) {
    let overlapped = !no_overlap(&outcome.lines);
    lab::chaos::record_row(&ReportRow {
        scenario: scenario.to_owned(),
        target: format!("redis {}", url.trim_start_matches("redis://")),
        topology: "Single { durable: false }".to_owned(),
        expectation: "Safe".to_owned(),
        ran: true,
        violations: usize::from(overlapped),
        stale_rejected: 0,
        lost_updates: 0,
        writes: 2,
        lost_signal_lead_ms: None,
        takeover_ms: Some(outcome.holder_exited.as_secs_f64() * 1000.0),
        longest_gap_ms: None,
        recovery_ms: outcome.command_died.map(|d| d.as_secs_f64() * 1000.0),
        promotion_ms: None,
        lost_after_ms: None,
        seed: 0,
        notes: vec![format!("{:?}", summary(&outcome.lines))],
    });
}

/// Whether the second command ran and no line of the first comes after its start.
fn no_overlap(lines: &[String]) -> bool {
    let b_start = lines.iter().position(|l| l == "B start");
    let last_a = lines.iter().rposition(|l| l.starts_with("A "));
    b_start.is_some() && last_a < b_start
}

async fn redis_url() -> Option<(RedisServer, String)> {
    let server = or_skip(RedisServer::start().await)?;
    let url = format!(
        "{}?ttl={}",
        server.url(),
        distlock::raw::durations::format_duration(TTL)
    );
    Some((server, url))
}

/// A Redis server, its URL, a fault proxy in front of it and the URL through the proxy.
async fn redis_url_through_proxy() -> Option<(RedisServer, String, FaultProxy, String)> {
    let (server, url) = redis_url().await?;
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let through = url.replacen(&server.addr().to_string(), &proxy.addr().to_string(), 1);
    Some((server, url, proxy, through))
}

fn lock_name() -> String {
    format!("lockctl-signals/{}", uuid::Uuid::new_v4().simple())
}

/// `signal` sent to lockctl reaches the command; lockctl waits for it, releases only
/// then, and exits as the command did (128 + N for a command that died of signal N).
async fn signal_is_forwarded(signal: Signal) {
    let Some((_server, url)) = redis_url().await else {
        return;
    };
    let log = EventLog::new();
    let name = lock_name();
    let sig = signal.as_str().trim_start_matches("SIG");
    // The command takes half a second to clean up, then dies of the signal it got.
    let first = format!(
        r#"trap 'log "A got {sig}"; kill $pid 2>/dev/null; sleep 0.5; log "A end"; trap - {sig}; kill -{sig} $$' {sig}
log "A pid $$"
sleep 6 & pid=$!
wait $pid
log "A end""#
    );
    let holder = lockctl(&url, &name, &[], &first, &log);
    let scenario = format!("lockctl_run_{}", signal.as_str().to_lowercase());
    let outcome = stop_first(&scenario, holder, signal, &url, &name, &log).await;
    let Outcome { holder, lines, .. } = &outcome;

    assert_no_overlap(lines);
    assert!(
        lines.contains(&format!("A got {sig}")),
        "the command got the signal: {lines:?}"
    );
    assert_eq!(
        holder.code(),
        Some(128 + signal as i32),
        "lockctl exits as its command did: {outcome:?}"
    );
    assert!(outcome.second.success(), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_forwarded_and_the_lock_outlives_the_command() {
    signal_is_forwarded(Signal::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_is_forwarded_and_the_lock_outlives_the_command() {
    signal_is_forwarded(Signal::SIGINT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_is_forwarded_and_the_lock_outlives_the_command() {
    signal_is_forwarded(Signal::SIGHUP).await;
}

/// A command that beats into the log every 100 ms for ten seconds, then ends.
const BEATING: &str = r#"log "A pid $$"
i=0
while [ $i -lt 100 ]; do log "A beat"; sleep 0.1; i=$((i + 1)); done
log "A end""#;

/// Whether the process `pid` still runs (neither gone nor a zombie).
fn alive(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with(['Z', 'X'])
    })
}

/// Waits (bounded by `WAIT`) for `pid` to die; false if it did not.
async fn dies(pid: Pid) -> bool {
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if !alive(pid) {
            return true;
        }
        sleep(Duration::from_millis(10)).await;
    }
    false
}

/// lockctl SIGKILLed: its command dies at once, well before the lease ends, so the next
/// holder cannot overlap it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_lockctl_kills_the_command() {
    let Some((_server, url)) = redis_url().await else {
        return;
    };
    let log = EventLog::new();
    let name = lock_name();
    let holder = lockctl(&url, &name, &[], BEATING, &log);
    let outcome = stop_first("lockctl_killed", holder, Signal::SIGKILL, &url, &name, &log).await;

    assert_no_overlap(&outcome.lines);
    assert!(
        outcome.command_died.is_some_and(|d| d < TTL),
        "the command must die with lockctl, before the lease ends: {outcome:?}"
    );
    assert!(outcome.second.success(), "{outcome:?}");
}

/// A command that ignores the forwarded SIGTERM is SIGKILLed after the grace period, and
/// the lock is released only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_ignoring_the_signal_is_killed_after_the_grace_period() {
    let Some((_server, url)) = redis_url().await else {
        return;
    };
    let log = EventLog::new();
    let name = lock_name();
    let stubborn = format!("trap '' TERM\n{BEATING}");
    let holder = lockctl(&url, &name, &["--grace", "1s"], &stubborn, &log);
    let outcome = stop_first(
        "lockctl_run_command_ignores_sigterm",
        holder,
        Signal::SIGTERM,
        &url,
        &name,
        &log,
    )
    .await;

    assert_no_overlap(&outcome.lines);
    assert_eq!(
        outcome.holder.code(),
        Some(128 + Signal::SIGKILL as i32),
        "the command was SIGKILLed: {outcome:?}"
    );
    assert!(outcome.second.success(), "{outcome:?}");
}

/// The holder's link to Redis is cut while its command, which ignores SIGTERM, runs: the
/// command is SIGKILLed before the guard's validity deadline, so a second `lockctl run`
/// (with a link of its own) starts its command only after the first one's last line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_stops_a_stubborn_command_before_another_can_hold() {
    let Some((_server, url, proxy, cut_url)) = redis_url_through_proxy().await else {
        return;
    };
    let log = EventLog::new();
    let name = lock_name();
    let stubborn = format!("trap '' TERM\n{BEATING}");
    let holder = lockctl(&cut_url, &name, &["--grace", "1s"], &stubborn, &log);
    let cut = || proxy.set_mode(ProxyMode::Blackhole);
    let outcome = after_fault(holder, cut, &url, &name, &log).await;
    eprintln!("cut link: {outcome:?}");
    record("lockctl_run_link_cut", &outcome, &url);

    assert_no_overlap(&outcome.lines);
    assert!(
        outcome.command_died.is_some_and(|d| d < TTL),
        "the command must be gone before the lease can end: {outcome:?}"
    );
    assert_eq!(
        outcome.holder.code(),
        Some(75),
        "lockctl reports the lost lock: {outcome:?}"
    );
    assert!(outcome.second.success(), "{outcome:?}");
}

/// A release that fails after the command exited 0 (the link was cut once the command
/// ended, within the lease) leaves lockctl's exit status the command's own: the job
/// completed under the lock, and a re-run must not be invited. lockctl warns on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_after_the_command_keeps_its_exit_status() {
    let Some((_server, _url, proxy, cut_url)) = redis_url_through_proxy().await else {
        return;
    };
    let cut_url = format!("{cut_url}&request_timeout=300ms");
    let log = EventLog::new();
    let name = lock_name();
    // The command waits for the link to be cut, then ends at once with status 0.
    let quick = r#"log "A pid $$"
while [ ! -e "$LOG.cut" ]; do sleep 0.02; done
log "A end""#;
    let holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--url", &cut_url, "run", "--grace", "1s", &name, "--", "sh", "-c",
        ])
        .arg(format!("log() {{ echo \"$1\" >> \"$LOG\"; }}\n{quick}"))
        .env("LOG", log.path())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl starts");
    log.wait_for("A pid ").await;
    proxy.set_mode(ProxyMode::Blackhole);
    let cut_marker = format!("{}.cut", log.path().display());
    std::fs::write(&cut_marker, "").expect("mark the cut");
    let output = timeout(WAIT, holder.wait_with_output())
        .await
        .expect("lockctl ends")
        .expect("lockctl's output");
    let _ = std::fs::remove_file(&cut_marker);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{:?}; stderr: {stderr}", output.status);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the command exited 0 under the lock; lockctl must too: stderr {stderr}"
    );
    assert!(
        stderr.contains("release"),
        "lockctl warns that the release failed: {stderr}"
    );
}

/// A `--grace` that cannot fit in the lease is refused as a usage error (exit 2) before
/// anything is acquired.
#[tokio::test]
async fn a_grace_longer_than_the_lease_allows_is_a_usage_error() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", "memory://", "run", "--ttl", "3s", "--grace", "5s"])
        .args(["grace-check", "--", "true"])
        .output()
        .await
        .expect("lockctl runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains("--grace 5s does not fit"), "{stderr}");
}
