//! lockbench: the same lock workloads on every backend in one run, each next to its raw
//! protocol floor on the same server, the leader-election workloads (uncontended
//! campaign, failover after a killed leader, observer notification) where the backend
//! grants elections, and semaphores (one permit a hold, or several), read-write locks
//! (where granted) and multi-locks against the mutex of the same run. Every workload but
//! the takeovers and renewal is repeated `--runs` times and reported as medians; writes a
//! Markdown + JSON + SVG report.
//!
//! ```text
//! lockbench --backends memory,redis,redlock,zookeeper,etcd,postgres --duration 2s --runs 3
//! lockbench --backends zookeeper,zookeeper-3 --held 100,1000,10000   # ZooKeeper, also on an ensemble
//! lockbench --backends zookeeper,redis,dual    # the migration lock next to its two sides
//! lockbench --backends redis,redis-sentinel,redis-sentinel-wait1,redis-cluster,zookeeper,zookeeper-tls
//! ```
//!
//! All backends' servers are started first; each run is then one pass over the backends,
//! so that "the same run" of two backends is close in time on a noisy shared machine.

mod contention;
mod contention_report;
mod election;
mod election_report;
mod error;
mod floors;
mod gauge;
mod goals;
mod primitives;
mod primitives_report;
mod report;
mod results;
mod semaphore_many;
mod sides;
mod stats;
mod svg;
mod targets;
mod workloads;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::runtime::Runtime;

use crate::error::BoxError;
use crate::primitives::Primitive;
use crate::results::{BackendReport, Report, RunReport, UncontendedRun};
use crate::targets::Target;
use crate::workloads::Plan;

/// Comparative benchmark of distlock backends.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Internal: hold a lock, or lead an election, until killed (the holder process of
    /// the takeover and election failover workloads).
    Hold {
        /// Lock service URL.
        #[arg(long)]
        url: String,
        /// Lock name.
        #[arg(long)]
        name: String,
        /// Campaign in the election `name` with this value instead of taking the lock.
        #[arg(long)]
        campaign: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Backends to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,redis,redlock,zookeeper,etcd,postgres,dual"
    )]
    backends: Vec<String>,
    /// Runs of every workload but takeover and renewal; the report shows their medians.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
    /// Measurement time of each workload, e.g. 2s.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before each measurement.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    warmup: Duration,
    /// Concurrent clients of the throughput workload (a row per value and lock count).
    #[arg(long, value_delimiter = ',', default_value = "8,64")]
    clients: Vec<usize>,
    /// Lock names of the throughput workload.
    #[arg(long, value_delimiter = ',', default_value = "1,1024")]
    locks: Vec<usize>,
    /// Contenders on one lock name in the queue-length sweep (`--sweep` with no value:
    /// no sweep).
    #[arg(long, value_delimiter = ',', num_args = 0..=1, default_value = "1,8,64,256")]
    sweep: Vec<usize>,
    /// Waiters queued behind the holder in the hand-off workload.
    #[arg(long, default_value_t = 4)]
    waiters: usize,
    /// Locks held by one client in the renewal workload (a row per value).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    held: Vec<usize>,
    /// TTL of the renewal workload.
    #[arg(long, default_value = "1500ms", value_parser = parse_duration)]
    renewal_ttl: Duration,
    /// Holder processes killed in the takeover workload, and leaders killed in the
    /// election failover workload.
    #[arg(long, default_value_t = 3)]
    takeover_rounds: usize,
    /// Observers following the election in the observer notification workload, each on a
    /// client of its own.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    observers: u16,
    /// Semaphore, read-write lock and multi-lock workloads to run, comma-separated
    /// (`--primitives` with no value: none).
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 0..=1,
        default_value = "semaphore,semaphore-many,rwlock,multi"
    )]
    primitives: Vec<Primitive>,
    /// Seed of the read-write workload's read-or-write choices, of the contended
    /// multi-locks' names and of the permits each semaphore-many request asks for.
    #[arg(long, default_value_t = 26)]
    seed: u64,
    /// Directory for report.md, report.json, latency.svg and queue-sweep.svg.
    #[arg(long, default_value = "lockbench-report")]
    out: PathBuf,
}

impl RunArgs {
    /// The (clients, names) pairs of the contended workloads: the throughput grid and the
    /// sweep on one name, each pair once.
    fn contention_shapes(&self) -> Vec<(usize, usize)> {
        let mut shapes: Vec<(usize, usize)> = self.sweep.iter().map(|&n| (n, 1)).collect();
        for &clients in &self.clients {
            for &locks in &self.locks {
                shapes.push((clients, locks));
            }
        }
        shapes.retain(|&(clients, locks)| clients > 0 && locks > 0);
        shapes.sort_unstable();
        shapes.dedup();
        shapes
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::raw::durations::parse_duration("duration", text).map_err(|e| e.to_string())
}

/// The tokio runtime a measurement runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Flavour {
    /// A worker per core (what `#[tokio::main]` builds); everything else runs here too.
    MultiThread,
    /// One thread, built afresh for each measurement.
    CurrentThread,
}

impl Flavour {
    pub(crate) const ALL: [Flavour; 2] = [Flavour::MultiThread, Flavour::CurrentThread];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Flavour::MultiThread => "multi-thread",
            Flavour::CurrentThread => "current-thread",
        }
    }

    fn runtime(self) -> std::io::Result<Runtime> {
        match self {
            Flavour::MultiThread => tokio::runtime::Builder::new_multi_thread(),
            Flavour::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        }
        .enable_all()
        .build()
    }

    /// Runs `work` to completion on this flavour: on `main` for the multi-thread one, on a
    /// fresh current-thread runtime (dropped afterwards, with whatever `work` spawned) for
    /// the other. Called from outside any runtime.
    fn block_on<T>(
        self,
        main: &Runtime,
        work: impl Future<Output = Result<T, BoxError>>,
    ) -> Result<T, BoxError> {
        match self {
            Flavour::MultiThread => main.block_on(work),
            Flavour::CurrentThread => self.runtime()?.block_on(work),
        }
    }
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    let runtime = Flavour::MultiThread.runtime()?;
    match cli.command {
        Some(Command::Hold {
            url,
            name,
            campaign,
        }) => runtime.block_on(workloads::hold_until_killed(
            &url,
            &name,
            campaign.as_deref(),
        )),
        None => run(&runtime, &cli.run),
    }
}

fn run(runtime: &Runtime, args: &RunArgs) -> Result<(), BoxError> {
    let began = std::time::Instant::now();
    let plan = Plan {
        warmup: args.warmup,
        duration: args.duration,
    };
    let runs = usize::from(args.runs);
    let shapes = args.contention_shapes();
    // Per run: the uncontended flavours, hand-off, the contended shapes, campaign,
    // observers, leader service turns and the primitives; once: takeover, election failover and renewal.
    let primitive_steps: usize = args.primitives.iter().map(|p| p.steps()).sum();
    let steps_per_backend =
        runs * (Flavour::ALL.len() + 4 + shapes.len() + primitive_steps) + 2 + args.held.len();
    let bar = ProgressBar::new((steps_per_backend * args.backends.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for backend in &args.backends {
        bar.set_message(format!("{backend}: starting servers"));
        match runtime.block_on(targets::start(backend)) {
            Ok(mut target) => {
                if let Err(why) = runtime.block_on(target.check_capabilities()) {
                    bar.println(format!("lockbench: {backend}: capabilities: {why}"));
                }
                for missing in missing_capabilities(&target, &args.primitives) {
                    bar.println(format!("lockbench: {}: {missing}", target.label));
                }
                targets.push(target);
            }
            Err(why) => {
                bar.println(format!("lockbench: SKIPPING {backend}: {why}"));
                skipped.push((backend.clone(), why));
                bar.inc(steps_per_backend as u64);
            }
        }
    }
    let mut backends: Vec<BackendReport> = targets
        .iter()
        .map(|t| BackendReport {
            backend: t.label.clone(),
            floor: t.floor.as_ref().map(floors::FloorSpec::describe),
            handoff_waiters: args.waiters,
            elections: t.elections,
            semaphores: t.semaphores,
            semaphores_many: t.semaphores_many,
            rwlocks: t.rwlocks,
            observers: usize::from(args.observers),
            notes: missing_capabilities(t, &args.primitives)
                .map(String::from)
                .collect(),
            ..BackendReport::default()
        })
        .collect();
    for run in 0..runs {
        for (target, report) in targets.iter().zip(&mut backends) {
            let tag = format!("run {}/{runs}", run + 1);
            let measured = measure_run(runtime, target, args, &shapes, plan, &bar, &tag);
            report.notes.extend(measured.1);
            report.runs.push(measured.0);
        }
    }
    for (target, report) in targets.iter().zip(&mut backends) {
        measure_once(runtime, target, args, &bar, report);
    }
    // The servers go with their targets; their handles belong to the main runtime.
    runtime.block_on(async move { drop(targets) });
    bar.finish_with_message("done");
    let mut report = Report {
        machine: machine(),
        started: started(),
        runs,
        warmup_s: plan.warmup.as_secs_f64(),
        duration_s: plan.duration.as_secs_f64(),
        elapsed_s: began.elapsed().as_secs_f64(),
        throughput_clients: args.clients.clone(),
        throughput_locks: args.locks.clone(),
        sweep: args.sweep.clone(),
        primitives: args.primitives.clone(),
        backends,
        skipped,
        goals: Vec::new(),
    };
    report.goals = goals::evaluate(&report);
    report.write(&args.out)?;
    println!("\n{}", report.markdown());
    println!(
        "Report written to {0}/report.md, {0}/report.json, {0}/latency.svg and {0}/{1}",
        args.out.display(),
        results::SWEEP_SVG
    );
    Ok(())
}

/// The note of a backend whose clients grant no election candidates.
const NO_ELECTIONS: &str =
    "no elections (capabilities().election is false): election workloads skipped";
/// The note of a backend whose clients grant no semaphore permits.
const NO_SEMAPHORES: &str =
    "no semaphores (capabilities().semaphore is false): semaphore workload not offered";
/// The note of a backend whose clients grant no hold of several semaphore permits.
const NO_SEMAPHORES_MANY: &str = "no semaphore holds of several permits \
     (capabilities().semaphore_many is false): semaphore-many workload not offered";
/// The note of a backend whose clients grant no read-write locks.
const NO_RWLOCKS: &str =
    "no read-write locks (capabilities().rwlock is false): read-write workload not offered";

/// The notes on what `target` does not offer of what lockbench would run on it.
fn missing_capabilities(
    target: &Target,
    asked: &[Primitive],
) -> impl Iterator<Item = &'static str> {
    let missing = [
        (!target.elections).then_some(NO_ELECTIONS),
        (!target.semaphores && asked.contains(&Primitive::Semaphore)).then_some(NO_SEMAPHORES),
        (!target.semaphores_many && asked.contains(&Primitive::SemaphoreMany))
            .then_some(NO_SEMAPHORES_MANY),
        (!target.rwlocks && asked.contains(&Primitive::Rwlock)).then_some(NO_RWLOCKS),
    ];
    missing.into_iter().flatten()
}

/// One run of the repeated workloads on `target`, and the failures to note.
fn measure_run(
    runtime: &Runtime,
    target: &Target,
    args: &RunArgs,
    shapes: &[(usize, usize)],
    plan: Plan,
    bar: &ProgressBar,
    tag: &str,
) -> (RunReport, Vec<String>) {
    let label = &target.label;
    let mut out = RunReport::default();
    let mut failures = Vec::new();
    let mut note = |what: &str, err: BoxError| {
        let text = format!("{tag}: {what} failed: {err}");
        bar.println(format!("lockbench: {label}: {text}"));
        failures.push(text);
    };
    for flavour in Flavour::ALL {
        let runtime_label = flavour.label();
        bar.set_message(format!(
            "{label} {tag}: uncontended, {runtime_label} runtime"
        ));
        match flavour.block_on(runtime, workloads::uncontended(target, plan)) {
            Ok(measured) => {
                let floor = measured.floor.as_ref();
                out.uncontended.push(UncontendedRun {
                    runtime: flavour,
                    library: measured.library.summary(),
                    floor_cycle: floor.and_then(|f| f.cycle.summary()),
                    floor_acquire: floor.and_then(|f| f.acquire.summary()),
                    floor_release: floor.and_then(|f| f.release.summary()),
                });
            }
            Err(e) => note(&format!("uncontended ({runtime_label})"), e),
        }
        bar.inc(1);
    }
    bar.set_message(format!("{label} {tag}: hand-off"));
    match runtime.block_on(workloads::handoff(target, args.waiters, plan)) {
        Ok(latencies) => out.handoff = latencies.summary(),
        Err(e) => note("hand-off", e),
    }
    match runtime.block_on(workloads::handoff_floor(target, plan)) {
        Ok(latencies) => out.handoff_floor = latencies.and_then(|l| l.summary()),
        Err(e) => note("raw hand-off", e),
    }
    bar.inc(1);
    for &(clients, locks) in shapes {
        bar.set_message(format!("{label} {tag}: {clients} clients on {locks} names"));
        match runtime.block_on(contention::contention(target, clients, locks, plan)) {
            Ok(row) => out.contention.push(row),
            Err(e) => note(&format!("{clients} clients on {locks} names"), e),
        }
        bar.inc(1);
    }
    if target.elections {
        bar.set_message(format!("{label} {tag}: uncontended campaign"));
        match runtime.block_on(election::campaign(target, plan)) {
            Ok(row) => out.campaign = Some(row),
            Err(e) => note("uncontended campaign", e),
        }
        bar.inc(1);
        bar.set_message(format!("{label} {tag}: observer notification"));
        let observers = usize::from(args.observers);
        match runtime.block_on(election::notify(target, observers, plan)) {
            Ok(row) => out.notify = Some(row),
            Err(e) => note("observer notification", e),
        }
        bar.inc(1);
        bar.set_message(format!("{label} {tag}: leader service turns"));
        match runtime.block_on(election::service_turns(target, plan)) {
            Ok(row) => out.service = Some(row),
            Err(e) => note("leader service turns", e),
        }
        bar.inc(1);
    } else {
        bar.inc(3);
    }
    let setup = primitives::Setup {
        rw_clients: primitives::rw_clients(&args.clients),
        seed: args.seed,
    };
    for &primitive in &args.primitives {
        bar.set_message(format!("{label} {tag}: {}", primitive.label()));
        let measured = primitives::measure(primitive, target, setup, plan, &mut out.primitives);
        if let Err(e) = runtime.block_on(measured) {
            note(primitive.label(), e);
        }
        bar.inc(primitive.steps() as u64);
    }
    (out, failures)
}

/// The workloads measured once: takeover, election failover and renewal.
fn measure_once(
    runtime: &Runtime,
    target: &Target,
    args: &RunArgs,
    bar: &ProgressBar,
    out: &mut BackendReport,
) {
    let label = &target.label;
    let mut notes = Vec::new();
    let mut note = |what: &str, err: BoxError| {
        let text = format!("{what} failed: {err}");
        bar.println(format!("lockbench: {label}: {text}"));
        notes.push(text);
    };
    bar.set_message(format!("{label}: takeover"));
    if target.cross_process {
        match runtime.block_on(workloads::takeover(target, args.takeover_rounds)) {
            Ok(t) => out.takeover = Some(t),
            Err(e) => note("takeover", e),
        }
    } else {
        out.notes
            .push("takeover not measured: in-process backend, no holder process to kill".into());
    }
    bar.inc(1);
    bar.set_message(format!("{label}: election failover"));
    if target.elections {
        match runtime.block_on(election::failover(target, args.takeover_rounds)) {
            Ok(t) => out.failover = Some(t),
            Err(e) => note("election failover", e),
        }
    }
    bar.inc(1);
    for &held in &args.held {
        bar.set_message(format!("{label}: renewal K={held}"));
        match runtime.block_on(workloads::renewal(target, held, args.renewal_ttl)) {
            Ok(row) => out.renewal.push(row),
            Err(e) => note(&format!("renewal K={held}"), e),
        }
        bar.inc(1);
    }
    out.notes.extend(notes);
}

/// A one-line description of this machine.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let kb: f64 = text
                .lines()
                .find(|l| l.starts_with("MemTotal"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(kb / 1024.0 / 1024.0)
        })
        .unwrap_or(0.0);
    format!(
        "{cores} cores ({cpu}), {memory_gib:.0} GiB, {}",
        std::env::consts::OS
    )
}

fn started() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("at unix time {now}")
}
