//! The contended workload: C clients, each with its own connection, acquire and release
//! over L lock names. The throughput grid (8/64 clients × 1/1,024 names) and the
//! queue-length sweep (1 … 256 contenders on one name) are both rows of it.
//!
//! Hundreds of contenders on a slow backend must not stall or abort the run: opening the
//! clients, each acquire and each release are bounded, the end of the measurement cuts any
//! wait still pending (acquires are cancellation-safe), and failures are counted in the row
//! rather than ending it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLockExt, ReleaseOutcome};
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
    pub(crate) clients: usize,
    /// Clients that connected; the others count as errors.
    pub(crate) connected: usize,
    pub(crate) locks: usize,
    /// Cycles that started after the warm-up and finished within the measurement.
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
const ACQUIRE_LIMIT: Duration = Duration::from_secs(10);
/// Clients opened at once: hundreds of them connect in a few round trips of setup.
const CONNECT_CONCURRENCY: usize = 16;
/// Pause after a failed call, so a failing server is not hammered in a loop.
const ERROR_PAUSE: Duration = Duration::from_millis(20);

/// What one client saw.
#[derive(Debug)]
struct Tally {
    latencies: Latencies,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            latencies: Latencies::new(),
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, err: impl std::fmt::Display) {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| err.to_string());
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
    let mut total = Tally::new();
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
    for client in connected {
        let (names, cycles) = (Arc::clone(&names), Arc::clone(&cycles));
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            while Instant::now() < end && cycles.load(Ordering::Relaxed) < MAX_ITERATIONS {
                let pick = rand::rng().random_range(0..names.len());
                let started = Instant::now();
                let Ok(acquired) =
                    timeout_at(end, client.lock_timeout(&names[pick], ACQUIRE_LIMIT)).await
                else {
                    break; // the measurement is over; the pending wait is cancelled
                };
                let outcome = match acquired {
                    Ok(guard) => match timeout(WAIT_LIMIT, guard.release()).await {
                        Ok(Ok(ReleaseOutcome::Released)) => Ok(()),
                        Ok(Ok(ReleaseOutcome::AlreadyLost(why))) => {
                            Err(format!("release: the lock was already lost ({why})"))
                        }
                        Ok(Err(err)) => Err(format!("release: {err}")),
                        Err(_) => Err(format!("release: no answer within {WAIT_LIMIT:?}")),
                    },
                    Err(err) => Err(format!("acquire: {err}")),
                };
                let finished = Instant::now();
                match outcome {
                    Ok(()) if started >= warm_until && finished <= end => {
                        tally.latencies.record(finished - started);
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(()) => {}
                    Err(err) => {
                        tally.error(err);
                        sleep(ERROR_PAUSE).await;
                    }
                }
            }
            tally
        }));
    }
    for task in futures::future::join_all(tasks).await {
        let tally = task?;
        total.latencies.merge(&tally.latencies);
        total.errors += tally.errors;
        if let Some(err) = tally.first_error {
            total.first_error.get_or_insert(err);
        }
    }
    let cycles = cycles.load(Ordering::Relaxed);
    Ok(ContentionRow {
        clients,
        connected: count,
        locks,
        cycles,
        cycles_per_sec: cycles as f64 / plan.duration.as_secs_f64(),
        cycle: total.latencies.summary(),
        errors: total.errors,
        first_error: total.first_error,
    })
}
