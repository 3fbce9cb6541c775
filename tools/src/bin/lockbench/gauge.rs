//! Counting inside holds: what the contended primitive workloads' clients hold at each
//! moment ([`Gauge`]), so that a workload fails when its primitive let in more than it may.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use distlock::ReleaseOutcome;

use crate::contention::released;
use crate::error::BoxError;

/// Contenders of the semaphore workloads, each a client of its own.
pub(crate) const SEMAPHORE_CLIENTS: usize = 64;

/// What a contended workload's clients hold right now, counted inside their holds: a
/// weight per hold, [`EXCLUSIVE`] for a writer.
#[derive(Debug)]
pub(crate) struct Gauge {
    /// The most the shared holds may weigh together.
    limit: u64,
    held: AtomicU64,
    /// The most shared weight seen at once.
    max: AtomicU64,
    /// Entries that found more held than allowed.
    violations: AtomicU64,
}

/// The weight of an exclusive hold: allowed only alone.
pub(crate) const EXCLUSIVE: u64 = 1 << 32;

impl Gauge {
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(Gauge {
            limit,
            held: AtomicU64::new(0),
            max: AtomicU64::new(0),
            violations: AtomicU64::new(0),
        })
    }

    /// Counts a hold of `weight`.
    fn enter(&self, weight: u64) {
        let now = self.held.fetch_add(weight, Ordering::SeqCst) + weight;
        if now > self.limit && now != EXCLUSIVE {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.max.fetch_max(now % EXCLUSIVE, Ordering::Relaxed);
    }

    /// Uncounts a hold of `weight`.
    fn leave(&self, weight: u64) {
        self.held.fetch_sub(weight, Ordering::SeqCst);
    }

    /// An error if any hold found more held than allowed (`what`: what that means).
    pub(crate) fn check(&self, what: &str) -> Result<u64, BoxError> {
        let max = self.max.load(Ordering::Relaxed);
        match self.violations.load(Ordering::SeqCst) {
            0 => Ok(max),
            n => Err(format!("{what} {n} times (most shared holds at once: {max})").into()),
        }
    }
}

/// Counts a hold of each (gauge, weight) for a moment, then `release`s it: uncounted
/// before the release is sent, so that the next holder never overlaps it in the count.
pub(crate) async fn hold(
    counted: &[(&Gauge, u64)],
    release: impl std::future::Future<Output = distlock::Result<ReleaseOutcome>>,
) -> Result<(), String> {
    for (gauge, weight) in counted {
        gauge.enter(*weight);
    }
    // A short hold: long enough for the other clients to run.
    tokio::task::yield_now().await;
    for (gauge, weight) in counted {
        gauge.leave(*weight);
    }
    released(release).await
}
