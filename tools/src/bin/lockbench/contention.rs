//! The contended workload: C clients, each with its own connection, acquire and release
//! over L lock names. The throughput grid (8/64 clients × 1/1,024 names) and the
//! queue-length sweep (1 … 256 contenders on one name) are both rows of it.
//!
//! Hundreds of contenders on a slow backend must not stall or abort the run: opening the
//! clients, each acquire and each release are bounded, the end of the measurement cuts any
//! wait still pending (acquires are cancellation-safe), and failures are counted in the row
//! rather than ending it.
//!
//! The loop itself ([`contend`]) also drives the contended semaphore, read-write and
//! multi-lock workloads (`primitives.rs`): only what one iteration does differs.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, DistributedLockExt, ReleaseOutcome};
use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use rand::Rng;
use serde::Serialize;
use tokio::time::{sleep, timeout, timeout_at, Instant};

use crate::stats::{Latencies, Summary};
use crate::targets::{BoxError, Target};
use crate::workloads::{bench_name, connect, Plan, MAX_ITERATIONS, WAIT_LIMIT};

/// One run of C clients over L names.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ContentionRow {
    #[serde(flatten)]
    pub(crate) run: LoopRun,
    pub(crate) locks: usize,
}

/// What a contended loop ([`contend`]) measured, in every contended row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LoopRun {
    pub(crate) clients: usize,
    /// Clients that connected; the others count as errors.
    pub(crate) connected: usize,
    /// Cycles that finished within the measurement (after the warm-up), wherever they
    /// started: with N contenders on one name, counting only cycles that also started
    /// after the warm-up would leave out the N already queued then, a bias of N cycles
    /// that grows with the queue (N = 256 at 200 hand-offs/s: a third of a 2 s run).
    pub(crate) cycles: u64,
    pub(crate) cycles_per_sec: f64,
    /// Acquire + release latency of those cycles. Waits cut by the end of the measurement
    /// are not cycles and do not appear here.
    pub(crate) cycle: Option<Summary>,
    /// Failed connects, acquires (including [`ACQUIRE_LIMIT`] timeouts) and releases.
    pub(crate) errors: u64,
    /// The first of them, for the report's notes.
    pub(crate) first_error: Option<String>,
}

/// Bound on one acquire (the end of the measurement usually cuts a wait sooner).
pub(crate) const ACQUIRE_LIMIT: Duration = Duration::from_secs(10);
/// Clients opened at once: hundreds of them connect in a few round trips of setup.
const CONNECT_CONCURRENCY: usize = 16;
/// Pause after a failed call, so a failing server is not hammered in a loop.
const ERROR_PAUSE: Duration = Duration::from_millis(20);

/// What one client saw.
#[derive(Debug)]
struct Tally {
    /// Acquire + release latency of the counted cycles.
    latencies: Latencies,
    /// Acquire latency of the counted cycles, by [`Cycle::kind`].
    acquire: Vec<Latencies>,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new(kinds: usize) -> Self {
        Tally {
            latencies: Latencies::new(),
            acquire: (0..kinds).map(|_| Latencies::new()).collect(),
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, err: impl std::fmt::Display) {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| err.to_string());
    }

    fn merge(&mut self, other: Tally) {
        self.latencies.merge(&other.latencies);
        for (mine, theirs) in self.acquire.iter_mut().zip(&other.acquire) {
            mine.merge(theirs);
        }
        self.errors += other.errors;
        if let Some(err) = other.first_error {
            self.first_error.get_or_insert(err);
        }
    }
}

/// One finished iteration of a contended loop.
#[derive(Debug)]
pub(crate) struct Cycle {
    /// Which acquire histogram it counts in (reads and writes apart, say).
    pub(crate) kind: usize,
    /// When its acquire returned.
    pub(crate) acquired: Instant,
}

/// What one iteration of a contended loop came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// The measurement ended during a wait, which was cut (not counted).
    Over,
    /// A cycle, or the failure of a call in it.
    Done(Result<Cycle, String>),
}

/// One iteration of a client's loop, given the end of the measurement.
pub(crate) type StepFn = Box<dyn FnMut(Instant) -> BoxFuture<'static, Step> + Send>;

/// What every client of a contended loop saw.
#[derive(Debug)]
pub(crate) struct Contended {
    pub(crate) run: LoopRun,
    /// Acquire latency of the counted cycles, by [`Cycle::kind`].
    pub(crate) acquire: Vec<Latencies>,
}

/// `clients` concurrent clients, each on its own connection, run the loop `worker` makes
/// for each (from its index and client) for `plan`: every iteration one [`Step`], whose
/// acquire latencies fall into `kinds` histograms.
pub(crate) async fn contend(
    target: &Target,
    clients: usize,
    kinds: usize,
    plan: Plan,
    mut worker: impl FnMut(usize, Arc<dyn DistributedLock>) -> Result<StepFn, BoxError>,
) -> Result<Contended, BoxError> {
    let mut total = Tally::new(kinds);
    let opened: Vec<_> = stream::iter(0..clients)
        .map(|_| connect(target, ""))
        .buffer_unordered(CONNECT_CONCURRENCY)
        .collect()
        .await;
    let mut connected = Vec::new();
    for client in opened {
        match client {
            Ok(client) => connected.push(client),
            Err(err) => total.error(format!("connect: {err}")),
        }
    }
    if connected.is_empty() {
        return Err(total.first_error.unwrap_or_default().into());
    }
    let warm_until = Instant::now() + plan.warmup;
    let end = warm_until + plan.duration;
    let cycles = Arc::new(AtomicU64::new(0));
    let count = connected.len();
    let mut tasks = Vec::new();
    for (index, client) in connected.into_iter().enumerate() {
        let mut step = worker(index, client)?;
        let cycles = Arc::clone(&cycles);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new(kinds);
            while Instant::now() < end && cycles.load(Ordering::Relaxed) < MAX_ITERATIONS {
                let started = Instant::now();
                let cycle = match step(end).await {
                    Step::Over => break, // the pending wait was cancelled
                    Step::Done(Ok(cycle)) => cycle,
                    Step::Done(Err(err)) => {
                        tally.error(err);
                        sleep(ERROR_PAUSE).await;
                        continue;
                    }
                };
                let finished = Instant::now();
                if finished >= warm_until && finished <= end {
                    tally.latencies.record(finished - started);
                    if let Some(acquire) = tally.acquire.get_mut(cycle.kind) {
                        acquire.record(cycle.acquired.saturating_duration_since(started));
                    }
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            }
            tally
        }));
    }
    for task in futures::future::join_all(tasks).await {
        total.merge(task?);
    }
    let cycles = cycles.load(Ordering::Relaxed);
    let run = LoopRun {
        clients,
        connected: count,
        cycles,
        cycles_per_sec: cycles as f64 / plan.duration.as_secs_f64(),
        cycle: total.latencies.summary(),
        errors: total.errors,
        first_error: total.first_error,
    };
    Ok(Contended {
        run,
        acquire: total.acquire,
    })
}

/// One cycle of a contended loop: `acquire`, cut at `end` (then [`Step::Over`]), then
/// `release` of what it granted (a refusal is an error). Counts as `kind`.
pub(crate) async fn cycle<G, F, Fut>(
    end: Instant,
    kind: usize,
    acquire: impl Future<Output = distlock::Result<Option<G>>>,
    release: F,
) -> Step
where
    F: FnOnce(G) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let Ok(acquired) = timeout_at(end, acquire).await else {
        return Step::Over;
    };
    let guard = match acquired {
        Ok(Some(guard)) => guard,
        Ok(None) => return Step::Done(Err("acquire: not granted".into())),
        Err(err) => return Step::Done(Err(format!("acquire: {err}"))),
    };
    let acquired = Instant::now();
    Step::Done(release(guard).await.map(|()| Cycle { kind, acquired }))
}

/// Awaits a guard's `release`, within [`WAIT_LIMIT`]; a hold already lost is an error.
pub(crate) async fn released(
    release: impl Future<Output = distlock::Result<ReleaseOutcome>>,
) -> Result<(), String> {
    match timeout(WAIT_LIMIT, release).await {
        Ok(Ok(ReleaseOutcome::Released)) => Ok(()),
        Ok(Ok(ReleaseOutcome::AlreadyLost(why))) => {
            Err(format!("release: the lock was already lost ({why})"))
        }
        Ok(Err(err)) => Err(format!("release: {err}")),
        Err(_) => Err(format!("release: no answer within {WAIT_LIMIT:?}")),
    }
}

/// `clients` concurrent clients, each on its own connection, acquire + release a name picked
/// at random among `locks`, for `plan`.
pub(crate) async fn contention(
    target: &Target,
    clients: usize,
    locks: usize,
    plan: Plan,
) -> Result<ContentionRow, BoxError> {
    let base = bench_name("contention");
    let names: Arc<Vec<String>> = Arc::new((0..locks).map(|i| format!("{base}/{i}")).collect());
    let run = contend(target, clients, 1, plan, |_, client| {
        let names = Arc::clone(&names);
        Ok(Box::new(move |end| {
            let (client, names) = (Arc::clone(&client), Arc::clone(&names));
            let pick = rand::rng().random_range(0..names.len());
            Box::pin(async move {
                let acquire = async {
                    client
                        .lock_timeout(&names[pick], ACQUIRE_LIMIT)
                        .await
                        .map(Some)
                };
                cycle(end, 0, acquire, |guard| released(guard.release())).await
            })
        }))
    })
    .await?;
    Ok(ContentionRow {
        run: run.run,
        locks,
    })
}
