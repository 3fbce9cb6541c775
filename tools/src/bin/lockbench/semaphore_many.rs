//! The semaphore workload of several permits a hold: [`SEMAPHORE_CLIENTS`] contenders on
//! one semaphore of [`MANY_PERMITS`] permits, each iteration asking for k of them at once
//! (`Semaphore::acquire_many_with`), k drawn from 1 ..= [`MOST_AT_ONCE`]. Requests keep
//! their place in the queue, so a big one at the head holds back the small ones behind
//! it: the acquire histograms per k show whether big requests starve, or hold back small
//! ones. Compared with the single-permit semaphore of the same run (information, not a
//! target); runs where the backend grants it (`Capabilities::semaphore_many`).

use std::sync::Arc;

use distlock::{AcquireOptions, Semaphore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::contention::{contend, cycle, LoopRun, ACQUIRE_LIMIT};
use crate::error::BoxError;
use crate::gauge::{hold, Gauge, SEMAPHORE_CLIENTS};
use crate::stats::{Latencies, Summary};
use crate::targets::Target;
use crate::workloads::{bench_name, Plan};

/// Permits of the semaphore.
pub(crate) const MANY_PERMITS: u32 = 8;
/// The most permits one request asks for (k is drawn from 1 ..= this).
pub(crate) const MOST_AT_ONCE: u32 = 4;

/// The workload of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SemaphoreManyRun {
    pub(crate) permits: u32,
    pub(crate) most_at_once: u32,
    /// Seed of the clients' choices of k (client i: seed + i).
    pub(crate) seed: u64,
    #[serde(flatten)]
    pub(crate) run: LoopRun,
    /// Permits taken by the counted cycles, per second.
    pub(crate) permits_per_sec: f64,
    /// Request sent → permits granted, whatever k.
    pub(crate) acquire: Option<Summary>,
    /// The same by k: entry k - 1 for requests of k permits.
    pub(crate) acquire_by_count: Vec<Option<Summary>>,
    /// The most permits the clients held at once, as they counted them inside their
    /// holds (never above `permits`, or the workload fails).
    pub(crate) max_in_use: u64,
}

impl SemaphoreManyRun {
    /// Acquire latency of the requests for `k` permits.
    pub(crate) fn acquire_of(&self, k: u32) -> Option<Summary> {
        *self
            .acquire_by_count
            .get(usize::try_from(k).ok()?.checked_sub(1)?)?
    }
}

/// [`SEMAPHORE_CLIENTS`] clients on one semaphore of [`MANY_PERMITS`] permits, each
/// iteration taking k permits in one hold, k chosen by a generator seeded with `seed` plus
/// the client's index, and giving them back.
pub(crate) async fn semaphore_many(
    target: &Target,
    seed: u64,
    plan: Plan,
) -> Result<SemaphoreManyRun, BoxError> {
    let name = bench_name("semaphore-many");
    let gauge = Gauge::new(u64::from(MANY_PERMITS));
    let options = AcquireOptions::timeout(ACQUIRE_LIMIT);
    let kinds = MOST_AT_ONCE as usize;
    let run = contend(target, SEMAPHORE_CLIENTS, kinds, plan, |index, client| {
        let semaphore = Semaphore::new(client, &name, MANY_PERMITS)?;
        let (gauge, options) = (Arc::clone(&gauge), options.clone());
        let mut counts = StdRng::seed_from_u64(seed.wrapping_add(index as u64));
        Ok(Box::new(move |end| {
            let (semaphore, gauge, options) =
                (semaphore.clone(), Arc::clone(&gauge), options.clone());
            let k = counts.random_range(1..=MOST_AT_ONCE);
            Box::pin(async move {
                let acquire = semaphore.acquire_many_with(k, &options);
                cycle(end, k as usize - 1, acquire, |permits| async move {
                    hold(&[(gauge.as_ref(), u64::from(k))], permits.release()).await
                })
                .await
            })
        }))
    })
    .await?;
    let max_in_use = gauge.check(&format!("more than {MANY_PERMITS} permits were in use"))?;
    let mut acquire = Latencies::new();
    let mut permits = 0;
    for (k, by_count) in (1..).zip(&run.acquire) {
        acquire.merge(by_count);
        permits += k * by_count.summary().map_or(0, |s| s.count);
    }
    Ok(SemaphoreManyRun {
        permits: MANY_PERMITS,
        most_at_once: MOST_AT_ONCE,
        seed,
        permits_per_sec: permits as f64 / plan.duration.as_secs_f64(),
        run: run.run,
        acquire: acquire.summary(),
        acquire_by_count: run.acquire.iter().map(Latencies::summary).collect(),
        max_in_use,
    })
}
