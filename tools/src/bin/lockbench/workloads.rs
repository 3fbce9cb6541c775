//! The uncontended, hand-off, takeover and renewal workloads, each run the same way on
//! every backend (the contended ones are in `contention.rs`).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{DistributedLock, DistributedLockExt};
use futures::future::join_all;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;
use tokio::time::{sleep, timeout, timeout_at, Instant};

use crate::error::BoxError;
use crate::floors::RawFloor;
use crate::stats::{Latencies, Summary};
use crate::targets::Target;

/// How long each workload warms up and measures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
}

/// Upper bound on measured iterations of one loop, whatever the duration.
pub(crate) const MAX_ITERATIONS: u64 = 5_000_000;
/// Bound on a single wait or call inside a workload.
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// A fresh lock name for one measurement.
pub(crate) fn bench_name(workload: &str) -> String {
    format!("lockbench/{workload}/{}", uuid::Uuid::new_v4().simple())
}

/// Opens a library client, within [`WAIT_LIMIT`].
pub(crate) async fn connect(
    target: &Target,
    query: &str,
) -> Result<Arc<dyn DistributedLock>, BoxError> {
    Ok(timeout(WAIT_LIMIT, distlock::connect(&target.url_with(query))).await??)
}

/// Workload 1, library and raw floor measured in the same run on the same runtime.
#[derive(Debug)]
pub(crate) struct Uncontended {
    pub(crate) library: Latencies,
    /// `None` for a backend without a floor.
    pub(crate) floor: Option<FloorLatencies>,
}

/// The raw floor of workload 1, also split into its acquire and release halves.
#[derive(Debug)]
pub(crate) struct FloorLatencies {
    pub(crate) cycle: Latencies,
    pub(crate) acquire: Latencies,
    pub(crate) release: Latencies,
}

/// Slices of workload 1: library and floor take turns, so that a noisy moment on a shared
/// machine falls on both alike.
pub(crate) const SLICES: u32 = 4;

/// Workload 1: acquire + release by one client on a free lock, and the same on the raw
/// protocol. Both clients are opened here, on the runtime this runs on. Each side warms
/// up for `plan.warmup`, then they alternate in [`SLICES`] slices of `plan.duration`.
pub(crate) async fn uncontended(target: &Target, plan: Plan) -> Result<Uncontended, BoxError> {
    let client = connect(target, "").await?;
    let floor = match &target.floor {
        Some(spec) => Some(spec.connect().await?),
        None => None,
    };
    let (name, floor_name) = (bench_name("uncontended"), bench_name("floor"));
    let mut library = Latencies::new();
    let mut floor_latencies = FloorLatencies {
        cycle: Latencies::new(),
        acquire: Latencies::new(),
        release: Latencies::new(),
    };
    library_cycles(client.as_ref(), &name, plan.warmup, None).await?;
    if let Some(floor) = &floor {
        floor_cycles(floor.as_ref(), &floor_name, plan.warmup, None).await?;
    }
    let slice = plan.duration / SLICES;
    for _ in 0..SLICES {
        library_cycles(client.as_ref(), &name, slice, Some(&mut library)).await?;
        if let Some(floor) = &floor {
            floor_cycles(
                floor.as_ref(),
                &floor_name,
                slice,
                Some(&mut floor_latencies),
            )
            .await?;
        }
    }
    Ok(Uncontended {
        library,
        floor: floor.map(|_| floor_latencies),
    })
}

/// Library cycles for `span`, recorded into `into` unless warming up.
async fn library_cycles(
    client: &dyn DistributedLock,
    name: &str,
    span: Duration,
    into: Option<&mut Latencies>,
) -> Result<(), BoxError> {
    timed(span, into, || lock_cycle(client, name)).await
}

/// One uncontended acquire (a try) + release of `name`, each within [`WAIT_LIMIT`].
pub(crate) async fn lock_cycle(client: &dyn DistributedLock, name: &str) -> Result<(), BoxError> {
    let guard = timeout(WAIT_LIMIT, client.try_lock(name))
        .await??
        .ok_or("an uncontended lock was held by someone else")?;
    timeout(WAIT_LIMIT, guard.release()).await??;
    Ok(())
}

/// Runs `cycle` back to back for `span` (at most [`MAX_ITERATIONS`] times), recording
/// each into `into` unless warming up (`None`).
pub(crate) async fn timed<F, Fut>(
    span: Duration,
    mut into: Option<&mut Latencies>,
    mut cycle: F,
) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    let end = Instant::now() + span;
    let mut iterations = 0;
    while Instant::now() < end && iterations < MAX_ITERATIONS {
        let started = Instant::now();
        cycle().await?;
        if let Some(latencies) = into.as_deref_mut() {
            latencies.record(started.elapsed());
        }
        iterations += 1;
    }
    Ok(())
}

/// Raw floor cycles for `span`, recorded into `into` unless warming up.
async fn floor_cycles(
    floor: &dyn RawFloor,
    name: &str,
    span: Duration,
    mut into: Option<&mut FloorLatencies>,
) -> Result<(), BoxError> {
    let end = Instant::now() + span;
    let mut iterations = 0;
    while Instant::now() < end && iterations < MAX_ITERATIONS {
        let started = Instant::now();
        let hold = timeout(WAIT_LIMIT, floor.acquire(name)).await??;
        let acquired = Instant::now();
        timeout(WAIT_LIMIT, floor.release(hold)).await??;
        if let Some(result) = into.as_deref_mut() {
            result.cycle.record(started.elapsed());
            result.acquire.record(acquired - started);
            result.release.record(acquired.elapsed());
        }
        iterations += 1;
    }
    Ok(())
}

/// Workload 2: time from "release sent" to "next waiter holds the lock", with `waiters`
/// clients queued behind the holder.
pub(crate) async fn handoff(
    target: &Target,
    waiters: usize,
    plan: Plan,
) -> Result<Latencies, BoxError> {
    let name = bench_name("handoff");
    let mut clients = Vec::new();
    for _ in 0..=waiters {
        clients.push(connect(target, "").await?);
    }
    let warm_until = Instant::now() + plan.warmup;
    let end = warm_until + plan.duration;
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handed_over = Arc::new(Notify::new());
    let latencies = Arc::new(Mutex::new(Latencies::new()));
    let mut tasks = Vec::new();
    for client in clients {
        let (name, released_at, handed_over, latencies) = (
            name.clone(),
            Arc::clone(&released_at),
            Arc::clone(&handed_over),
            Arc::clone(&latencies),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let guard = client.lock_timeout(&name, WAIT_LIMIT).await?;
                let now = Instant::now();
                if let Some(sent) = released_at.lock().expect("lock").take() {
                    if sent >= warm_until {
                        latencies.lock().expect("lock").record(now - sent);
                    }
                    handed_over.notify_waiters();
                }
                let notified = handed_over.notified();
                *released_at.lock().expect("lock") = Some(Instant::now());
                timeout(WAIT_LIMIT, guard.release()).await??;
                // Sit out until a waiter has the lock, so every grant is a real hand-off
                // (unfair backends would otherwise let the releaser barge back in).
                let _ = timeout_at(end.min(Instant::now() + WAIT_LIMIT), notified).await;
            }
            Ok::<_, BoxError>(())
        }));
    }
    let results = join_all(tasks).await;
    handed_over.notify_waiters();
    for result in results {
        result??;
    }
    let latencies = latencies.lock().expect("lock").clone();
    Ok(latencies)
}

/// The floor of workload 2: raw hand-offs on the target's floor, each a raw waiter woken by
/// the server's push ([`RawFloor::handoff`]), for `plan.duration` after `plan.warmup`.
/// `None` for a backend whose floor has no push of its own (or no floor).
pub(crate) async fn handoff_floor(
    target: &Target,
    plan: Plan,
) -> Result<Option<Latencies>, BoxError> {
    let Some(spec) = &target.floor else {
        return Ok(None);
    };
    let floor = spec.connect().await?;
    let name = bench_name("handoff-floor");
    let warm_until = Instant::now() + plan.warmup;
    let end = warm_until + plan.duration;
    let mut latencies = Latencies::new();
    let mut iterations = 0;
    while Instant::now() < end && iterations < MAX_ITERATIONS {
        let measuring = Instant::now() >= warm_until;
        let Some(took) = timeout(WAIT_LIMIT, floor.handoff(&name)).await?? else {
            return Ok(None);
        };
        if measuring {
            latencies.record(took);
            iterations += 1;
        }
    }
    Ok(Some(latencies))
}

/// Workload 4 results.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Takeover {
    pub(crate) ttl_ms: f64,
    /// Kill of the holder process → next holder has the lock, per round.
    pub(crate) takeover_ms: Vec<f64>,
}

/// Workload 4: a holder *process* is killed with SIGKILL; how long until a waiter holds
/// the lock, against the TTL.
pub(crate) async fn takeover(target: &Target, rounds: usize) -> Result<Takeover, BoxError> {
    let ttl = target.takeover_ttl;
    let query = takeover_query(ttl);
    let url = target.url_with(&query);
    let waiter_client = connect(target, &query).await?;
    let mut takeover_ms = Vec::new();
    for _ in 0..rounds {
        let name = bench_name("takeover");
        let holder = HolderProcess::spawn(&url, &name, None).await?;
        let waiter = {
            let (client, name) = (Arc::clone(&waiter_client), name.clone());
            tokio::spawn(async move {
                let guard = client.lock_timeout(&name, ttl * 4 + WAIT_LIMIT).await?;
                let acquired = Instant::now();
                guard.release().await?;
                Ok::<_, BoxError>(acquired)
            })
        };
        sleep(QUEUE_UP).await;
        let killed = holder.kill().await?;
        let acquired = waiter.await??;
        takeover_ms.push((acquired - killed).as_secs_f64() * 1000.0);
    }
    Ok(Takeover {
        ttl_ms: ttl.as_secs_f64() * 1000.0,
        takeover_ms,
    })
}

/// The query of the clients of a takeover: the target's takeover TTL.
pub(crate) fn takeover_query(ttl: Duration) -> String {
    format!("ttl={}", distlock::raw::durations::format_duration(ttl))
}

/// How long a waiter gets to queue up behind a holder before the holder is killed.
pub(crate) const QUEUE_UP: Duration = Duration::from_millis(200);

/// A `lockbench hold` child process that holds a lock, or leads an election, until it is
/// killed (the crashed holder of the takeover workloads).
#[derive(Debug)]
pub(crate) struct HolderProcess {
    child: tokio::process::Child,
    pid: nix::unistd::Pid,
}

impl HolderProcess {
    /// Starts a holder of `name` on `url` (with `campaign`: a candidate with that value
    /// in the election `name`) and returns once it holds (leads).
    pub(crate) async fn spawn(
        url: &str,
        name: &str,
        campaign: Option<&str>,
    ) -> Result<Self, BoxError> {
        let mut command = tokio::process::Command::new(std::env::current_exe()?);
        command.args(["hold", "--url", url, "--name", name]);
        if let Some(value) = campaign {
            command.args(["--campaign", value]);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("holder exited at once")?;
        let stdout = child.stdout.take().ok_or("holder has no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = timeout(WAIT_LIMIT, lines.next_line()).await??;
        if line.as_deref() != Some("HELD") {
            return Err(format!("holder process said {line:?} instead of HELD").into());
        }
        Ok(HolderProcess {
            child,
            pid: nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        })
    }

    /// Kills the holder with SIGKILL; returns when the signal was sent, once it is gone.
    pub(crate) async fn kill(mut self) -> Result<Instant, BoxError> {
        nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL)?;
        let killed = Instant::now();
        let _ = self.child.wait().await;
        Ok(killed)
    }
}

/// The child side of workload 4 and of the election failover: take the lock (or, with
/// `campaign`, lead the election `name` with that value), say `HELD`, and wait to be
/// killed.
pub(crate) async fn hold_until_killed(
    url: &str,
    name: &str,
    campaign: Option<&str>,
) -> Result<(), BoxError> {
    let client = distlock::connect(url).await?;
    let held: Box<dyn std::any::Any + Send> = match campaign {
        None => Box::new(client.lock_timeout(name, WAIT_LIMIT).await?),
        Some(value) => {
            let election = distlock::Election::new(Arc::clone(&client), name)?;
            let options = distlock::AcquireOptions::timeout(WAIT_LIMIT);
            Box::new(
                election
                    .campaign_with(value, &options)
                    .await?
                    .ok_or("another candidate led")?,
            )
        }
    };
    println!("HELD");
    // Bounded: a holder nobody kills gives up after ten minutes.
    sleep(Duration::from_secs(600)).await;
    drop(held);
    Ok(())
}

/// One row of workload 5.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RenewalRow {
    pub(crate) held_locks: usize,
    pub(crate) ttl_ms: f64,
    /// Client memory per held lock (resident set growth / locks).
    pub(crate) bytes_per_lock: Option<f64>,
    /// Requests the client sent per renewal interval while holding them.
    pub(crate) requests_per_interval: Option<f64>,
    /// Renewal round trips seen on a sample of the holds: from the moment a renewal was
    /// sent (its new validity deadline minus the lease) until the guard showed it, ±1 ms.
    pub(crate) round_trip: Option<Summary>,
    /// Holds still Held at the end (all of them, if renewal keeps up).
    pub(crate) still_held: usize,
}

/// Workload 5: one client holds `locks` locks through several renewal intervals.
pub(crate) async fn renewal(
    target: &Target,
    locks: usize,
    ttl: Duration,
) -> Result<RenewalRow, BoxError> {
    let query = format!("ttl={}", distlock::raw::durations::format_duration(ttl));
    let url = target.url_with(&query);
    let client = distlock::connect(&url).await?;
    let base = bench_name("renewal");
    let rss_before = resident_bytes();
    let mut guards = Vec::with_capacity(locks);
    // Every `stride`-th hold is sampled for round trips, with its lease (less the drift
    // margin) as granted, read before any renewal.
    let stride = (locks / RENEWAL_SAMPLES).max(1);
    let mut samples = Vec::new();
    let names: Vec<String> = (0..locks).map(|i| format!("{base}/{i}")).collect();
    for chunk in names.chunks(200) {
        for guard in join_all(chunk.iter().map(|n| client.try_lock(n))).await {
            let guard = guard?.ok_or("a fresh lock name was held")?;
            if guards.len() % stride == 0 {
                samples.push((guards.len(), guard.valid_until() - guard.acquired_at()));
            }
            guards.push(guard);
        }
    }
    let rss_after = resident_bytes();
    let interval = ttl / 3;
    // Let the acquisitions' traffic settle, then count over whole renewal intervals.
    sleep(interval).await;
    let intervals = 3u32;
    let before = match &target.requests {
        Some(counter) => Some(counter.requests().await?),
        None => None,
    };
    let round_trip = watch_renewals(&guards, &samples, interval * intervals).await;
    let requests_per_interval = match (&target.requests, before) {
        (Some(counter), Some(before)) => {
            let after = counter.requests().await?;
            Some(after.saturating_sub(before) as f64 / f64::from(intervals))
        }
        _ => None,
    };
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    // Released in bounded bursts, as they were acquired: a server may refuse a burst of
    // thousands of concurrent requests (etcd: "too many requests").
    let mut guards = guards.into_iter();
    loop {
        let burst: Vec<_> = guards.by_ref().take(200).collect();
        if burst.is_empty() {
            break;
        }
        for outcome in join_all(burst.into_iter().map(|g| g.release())).await {
            outcome?;
        }
    }
    Ok(RenewalRow {
        held_locks: locks,
        ttl_ms: ttl.as_secs_f64() * 1000.0,
        bytes_per_lock: rss_before
            .zip(rss_after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / locks as f64),
        requests_per_interval,
        round_trip: round_trip.summary(),
        still_held,
    })
}

/// Holds whose renewals are timed in workload 5.
const RENEWAL_SAMPLES: usize = 32;

/// Polls the validity deadline of the sampled holds (index, lease) every millisecond
/// for `window`; each move is a renewal, sent at the new deadline minus the lease.
async fn watch_renewals(
    guards: &[distlock::LockGuard],
    samples: &[(usize, Duration)],
    window: Duration,
) -> Latencies {
    let mut latencies = Latencies::new();
    let mut seen: Vec<Instant> = samples
        .iter()
        .map(|(i, _)| guards[*i].valid_until())
        .collect();
    let end = Instant::now() + window;
    while Instant::now() < end {
        sleep(Duration::from_millis(1)).await;
        let now = Instant::now();
        for ((index, lease), last) in samples.iter().zip(seen.iter_mut()) {
            let valid_until = guards[*index].valid_until();
            if valid_until != *last {
                *last = valid_until;
                if let Some(sent) = valid_until.checked_sub(*lease) {
                    latencies.record(now.saturating_duration_since(sent));
                }
            }
        }
    }
    latencies
}

/// Resident set size of this process, from /proc.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}
