//! The semaphore, read-write lock and multi-lock workloads (issue 26): 64 contenders on a
//! semaphore of 4 permits, readers and writers (10% writes) on one read-write lock, and
//! multi-locks of 3 names, uncontended and contended. Each is compared with the mutex of
//! the same run (its contended throughput, its uncontended cycle): information, not a
//! target. Semaphores and read-write locks run where the backend grants them
//! (`Capabilities::semaphore` / `Capabilities::rwlock`); multi-locks run everywhere. The
//! semaphore of several permits a hold has a file of its own (`semaphore_many.rs`).
//!
//! The contended loops are the contention workload's ([`contend`]): bounded acquires cut
//! at the end of the measurement, failures counted. Inside each hold the workload counts
//! who holds what, and fails if the primitive let in more than it may (a fifth permit, a
//! writer beside anyone, a name held twice by multi-locks).

use std::sync::Arc;

use distlock::{AcquireOptions, DistributedLock, MultiLock, RwLock, Semaphore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::timeout;

use crate::contention::{contend, cycle, LoopRun, Step, ACQUIRE_LIMIT};
use crate::error::BoxError;
use crate::gauge::{hold, Gauge, EXCLUSIVE, SEMAPHORE_CLIENTS};
use crate::semaphore_many::{semaphore_many, SemaphoreManyRun};
pub(crate) use crate::semaphore_many::{MANY_PERMITS, MOST_AT_ONCE};
use crate::stats::{Latencies, Summary};
use crate::targets::Target;
use crate::workloads::{bench_name, connect, lock_cycle, timed, Plan, SLICES, WAIT_LIMIT};

/// The workloads of this file, as `--primitives` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Primitive {
    /// [`SEMAPHORE_CLIENTS`] contenders on a semaphore of [`PERMITS`] permits.
    Semaphore,
    /// [`SEMAPHORE_CLIENTS`] contenders on a semaphore of [`MANY_PERMITS`] permits, each
    /// taking 1 to [`MOST_AT_ONCE`] of them in one hold.
    SemaphoreMany,
    /// Readers and writers on one read-write lock.
    Rwlock,
    /// Multi-locks of [`MULTI_PARTS`] names, uncontended and contended (two workloads).
    Multi,
}

impl Primitive {
    /// Workloads (progress steps) per run.
    pub(crate) fn steps(self) -> usize {
        match self {
            Primitive::Semaphore | Primitive::SemaphoreMany | Primitive::Rwlock => 1,
            Primitive::Multi => 2,
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Primitive::Semaphore => "semaphore",
            Primitive::SemaphoreMany => "semaphore, several permits a hold",
            Primitive::Rwlock => "read-write lock",
            Primitive::Multi => "multi-lock",
        }
    }
}

/// Permits of the semaphore workload.
pub(crate) const PERMITS: u32 = 4;
/// Share of the read-write workload's iterations that write.
pub(crate) const WRITE_SHARE: f64 = 0.1;
/// Names in one multi-lock.
pub(crate) const MULTI_PARTS: usize = 3;
/// Clients of the contended multi-lock workload, each a client of its own.
pub(crate) const MULTI_CLIENTS: usize = 16;
/// Names the contended multi-locks pick their parts from.
pub(crate) const MULTI_NAMES: usize = 8;

/// Clients of the read-write workload: as many as the largest throughput row.
pub(crate) fn rw_clients(throughput_clients: &[usize]) -> usize {
    throughput_clients
        .iter()
        .copied()
        .max()
        .unwrap_or(64)
        .max(1)
}

/// The acquire histograms of the read-write workload.
const READ: usize = 0;
const WRITE: usize = 1;

/// Everything one run measured of this file's workloads on one backend (`None`: not
/// run, not offered, or failed; the notes say which).
#[derive(Debug, Default, Serialize)]
pub(crate) struct PrimitivesRun {
    pub(crate) semaphore: Option<SemaphoreRun>,
    pub(crate) semaphore_many: Option<SemaphoreManyRun>,
    pub(crate) rwlock: Option<RwLockRun>,
    pub(crate) multi: Option<MultiRun>,
    pub(crate) multi_contended: Option<MultiContendedRun>,
}

/// The semaphore workload of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SemaphoreRun {
    pub(crate) permits: u32,
    #[serde(flatten)]
    pub(crate) run: LoopRun,
    /// Request sent → permit granted.
    pub(crate) acquire: Option<Summary>,
    /// The most permits the clients held at once, as they counted them inside their
    /// holds (never above `permits`, or the workload fails).
    pub(crate) max_in_use: u64,
}

/// The read-write workload of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RwLockRun {
    #[serde(flatten)]
    pub(crate) run: LoopRun,
    pub(crate) write_share: f64,
    /// Seed of the clients' read-or-write choices (client i: seed + i).
    pub(crate) seed: u64,
    /// Request sent → read side granted.
    pub(crate) read_acquire: Option<Summary>,
    /// Request sent → write side granted.
    pub(crate) write_acquire: Option<Summary>,
    /// The most readers that held at once, as they counted themselves.
    pub(crate) max_readers: u64,
}

/// The uncontended multi-lock workload of one run: one client, [`MULTI_PARTS`] names.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MultiRun {
    pub(crate) parts: usize,
    /// Multi-lock acquire (a try) + release of every name.
    pub(crate) multi_cycle: Option<Summary>,
    /// The same names one after another: try + release, try + release, …
    pub(crate) sequential_cycle: Option<Summary>,
}

impl MultiRun {
    /// Multi-lock cycle p50 against the sequential cycles' p50 of the same run.
    pub(crate) fn ratio(&self) -> Option<f64> {
        Some(self.multi_cycle?.p50_us / self.sequential_cycle?.p50_us)
    }
}

/// The contended multi-lock workload of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MultiContendedRun {
    #[serde(flatten)]
    pub(crate) run: LoopRun,
    pub(crate) names: usize,
    pub(crate) parts: usize,
    /// Request sent → every part granted.
    pub(crate) acquire: Option<Summary>,
}

/// What the read-write and seeded workloads need from the command line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    /// Clients of the read-write workload.
    pub(crate) rw_clients: usize,
    /// Seed of the random choices (client i: seed + i).
    pub(crate) seed: u64,
}

/// Runs `primitive`'s workloads on `target` into `out`; a primitive the target does not
/// offer is left out (its rows say "not offered").
pub(crate) async fn measure(
    primitive: Primitive,
    target: &Target,
    setup: Setup,
    plan: Plan,
    out: &mut PrimitivesRun,
) -> Result<(), BoxError> {
    match primitive {
        Primitive::Semaphore if target.semaphores => {
            out.semaphore = Some(semaphore(target, plan).await?);
        }
        Primitive::Rwlock if target.rwlocks => {
            out.rwlock = Some(rwlock(target, setup, plan).await?);
        }
        Primitive::SemaphoreMany if target.semaphores_many => {
            out.semaphore_many = Some(semaphore_many(target, setup.seed, plan).await?);
        }
        Primitive::Semaphore | Primitive::SemaphoreMany | Primitive::Rwlock => {}
        Primitive::Multi => {
            // Both are tried; the first failure is returned.
            let uncontended = multi(target, plan).await.map(|row| out.multi = Some(row));
            let contended = multi_contended(target, setup.seed, plan)
                .await
                .map(|row| out.multi_contended = Some(row));
            uncontended.and(contended)?;
        }
    }
    Ok(())
}

/// Semaphore: [`SEMAPHORE_CLIENTS`] clients on one semaphore of [`PERMITS`] permits, each
/// taking a permit and giving it back in a loop.
async fn semaphore(target: &Target, plan: Plan) -> Result<SemaphoreRun, BoxError> {
    let name = bench_name("semaphore");
    let gauge = Gauge::new(u64::from(PERMITS));
    let options = AcquireOptions::timeout(ACQUIRE_LIMIT);
    let run = contend(target, SEMAPHORE_CLIENTS, 1, plan, |_, client| {
        let (semaphore, gauge) = (Semaphore::new(client, &name, PERMITS)?, Arc::clone(&gauge));
        let options = options.clone();
        Ok(Box::new(move |end| {
            let (semaphore, gauge, options) =
                (semaphore.clone(), Arc::clone(&gauge), options.clone());
            Box::pin(async move {
                let acquire = semaphore.acquire_with(&options);
                cycle(end, 0, acquire, |permit| async move {
                    hold(&[(gauge.as_ref(), 1)], permit.release()).await
                })
                .await
            })
        }))
    })
    .await?;
    let max_in_use = gauge.check(&format!("more than {PERMITS} permits were in use"))?;
    Ok(SemaphoreRun {
        permits: PERMITS,
        run: run.run,
        acquire: run.acquire[0].summary(),
        max_in_use,
    })
}

/// Read-write lock: `setup.rw_clients` clients on one read-write lock, each iteration a
/// write ([`WRITE_SHARE`]) or a read, chosen by a generator seeded with `setup.seed` plus
/// the client's index.
async fn rwlock(target: &Target, setup: Setup, plan: Plan) -> Result<RwLockRun, BoxError> {
    let name = bench_name("rwlock");
    // Readers share up to any number; a writer holds alone.
    let gauge = Gauge::new(EXCLUSIVE - 1);
    let options = AcquireOptions::timeout(ACQUIRE_LIMIT);
    let run = contend(target, setup.rw_clients, 2, plan, |index, client| {
        let (rwlock, gauge) = (RwLock::new(client, &name)?, Arc::clone(&gauge));
        let options = options.clone();
        let mut choices = StdRng::seed_from_u64(setup.seed.wrapping_add(index as u64));
        Ok(Box::new(move |end| {
            let (rwlock, gauge, options) = (rwlock.clone(), Arc::clone(&gauge), options.clone());
            let write = choices.random_bool(WRITE_SHARE);
            Box::pin(async move {
                if write {
                    let acquire = rwlock.write_with(&options);
                    cycle(end, WRITE, acquire, |w| async move {
                        hold(&[(gauge.as_ref(), EXCLUSIVE)], w.release()).await
                    })
                    .await
                } else {
                    let acquire = rwlock.read_with(&options);
                    cycle(end, READ, acquire, |r| async move {
                        hold(&[(gauge.as_ref(), 1)], r.release()).await
                    })
                    .await
                }
            })
        }))
    })
    .await?;
    let max_readers = gauge.check("a writer held beside another holder")?;
    Ok(RwLockRun {
        run: run.run,
        write_share: WRITE_SHARE,
        seed: setup.seed,
        read_acquire: run.acquire[READ].summary(),
        write_acquire: run.acquire[WRITE].summary(),
        max_readers,
    })
}

/// Uncontended multi-lock: one client takes [`MULTI_PARTS`] free names together (a try)
/// and releases them, and takes the same names one after another, each warmed up for
/// `plan.warmup`, then taking turns in [`SLICES`] slices of `plan.duration`.
async fn multi(target: &Target, plan: Plan) -> Result<MultiRun, BoxError> {
    let client = connect(target, "").await?;
    let base = bench_name("multi");
    let names: Vec<String> = (0..MULTI_PARTS).map(|i| format!("{base}/{i}")).collect();
    let multi = MultiLock::new(Arc::clone(&client), &names)?;
    let (client, multi, names) = (client.as_ref(), &multi, &names);
    let (mut together, mut sequential) = (Latencies::new(), Latencies::new());
    timed(plan.warmup, None, || multi_cycle(multi)).await?;
    timed(plan.warmup, None, || sequential_cycles(client, names)).await?;
    let slice = plan.duration / SLICES;
    for _ in 0..SLICES {
        timed(slice, Some(&mut together), || multi_cycle(multi)).await?;
        timed(slice, Some(&mut sequential), || {
            sequential_cycles(client, names)
        })
        .await?;
    }
    Ok(MultiRun {
        parts: MULTI_PARTS,
        multi_cycle: together.summary(),
        sequential_cycle: sequential.summary(),
    })
}

/// One uncontended multi-lock try + release, each within [`WAIT_LIMIT`].
async fn multi_cycle(multi: &MultiLock) -> Result<(), BoxError> {
    let guard = timeout(WAIT_LIMIT, multi.acquire_with(&AcquireOptions::try_once()))
        .await??
        .ok_or("an uncontended multi-lock found a name held")?;
    timeout(WAIT_LIMIT, guard.release()).await??;
    Ok(())
}

/// An uncontended lock cycle on each of `names`, one after another.
async fn sequential_cycles(client: &dyn DistributedLock, names: &[String]) -> Result<(), BoxError> {
    for name in names {
        lock_cycle(client, name).await?;
    }
    Ok(())
}

/// Contended multi-lock: [`MULTI_CLIENTS`] clients, each iteration a multi-lock of
/// [`MULTI_PARTS`] names drawn (by a generator seeded with `seed` plus the client's index)
/// among [`MULTI_NAMES`]. Overlapping sets are taken in one order, so they never wait
/// for each other in a cycle; every wait is bounded anyway.
async fn multi_contended(
    target: &Target,
    seed: u64,
    plan: Plan,
) -> Result<MultiContendedRun, BoxError> {
    let base = bench_name("multi-contended");
    let names: Arc<Vec<String>> =
        Arc::new((0..MULTI_NAMES).map(|i| format!("{base}/{i}")).collect());
    // Each name alone, counted per name.
    let gauges: Arc<Vec<Arc<Gauge>>> = Arc::new((0..MULTI_NAMES).map(|_| Gauge::new(1)).collect());
    let options = AcquireOptions::timeout(ACQUIRE_LIMIT);
    let run = contend(target, MULTI_CLIENTS, 1, plan, |index, client| {
        let (names, gauges, options) = (Arc::clone(&names), Arc::clone(&gauges), options.clone());
        let mut picks = StdRng::seed_from_u64(seed.wrapping_add(index as u64));
        Ok(Box::new(move |end| {
            let picked = rand::seq::index::sample(&mut picks, MULTI_NAMES, MULTI_PARTS).into_vec();
            let (client, names, gauges, options) = (
                Arc::clone(&client),
                Arc::clone(&names),
                Arc::clone(&gauges),
                options.clone(),
            );
            Box::pin(async move {
                let multi = match MultiLock::new(client, picked.iter().map(|&i| &names[i])) {
                    Ok(multi) => multi,
                    Err(err) => return Step::Done(Err(err.to_string())),
                };
                let acquire = multi.acquire_with(&options);
                cycle(end, 0, acquire, |guard| async move {
                    let counted: Vec<(&Gauge, u64)> =
                        picked.iter().map(|&i| (gauges[i].as_ref(), 1)).collect();
                    hold(&counted, guard.release()).await
                })
                .await
            })
        }))
    })
    .await?;
    for gauge in gauges.iter() {
        gauge.check("a name was held by two multi-locks at once")?;
    }
    Ok(MultiContendedRun {
        run: run.run,
        names: MULTI_NAMES,
        parts: MULTI_PARTS,
        acquire: run.acquire[0].summary(),
    })
}
