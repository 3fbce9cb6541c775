//! lockbench: the same lock workloads on every backend in one run, each next to its raw
//! protocol floor on the same server. Writes a Markdown + JSON + SVG report.
//!
//! ```text
//! lockbench --backends memory,redis,redlock,zookeeper,etcd --duration 2s
//! lockbench --backends zookeeper,zookeeper-3 --held 100,1000,10000   # ZooKeeper, also on an ensemble
//! ```

mod floors;
mod report;
mod stats;
mod targets;
mod workloads;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::report::{BackendReport, Report};
use crate::targets::{BoxError, Target};
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
    /// Internal: hold a lock until killed (the takeover workload's holder process).
    Hold {
        /// Lock service URL.
        #[arg(long)]
        url: String,
        /// Lock name.
        #[arg(long)]
        name: String,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Backends to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,redis,redlock,zookeeper,etcd"
    )]
    backends: Vec<String>,
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
    /// Waiters queued behind the holder in the hand-off workload.
    #[arg(long, default_value_t = 4)]
    waiters: usize,
    /// Locks held by one client in the renewal workload (a row per value).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    held: Vec<usize>,
    /// TTL of the renewal workload.
    #[arg(long, default_value = "1500ms", value_parser = parse_duration)]
    renewal_ttl: Duration,
    /// Holder processes killed in the takeover workload.
    #[arg(long, default_value_t = 3)]
    takeover_rounds: usize,
    /// Directory for report.md, report.json and latency.svg.
    #[arg(long, default_value = "lockbench-report")]
    out: PathBuf,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::raw::parse_duration("duration", text).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Hold { url, name }) => workloads::hold_until_killed(&url, &name).await,
        None => run(cli.run).await,
    }
}

async fn run(args: RunArgs) -> Result<(), BoxError> {
    let plan = Plan {
        warmup: args.warmup,
        duration: args.duration,
    };
    let mut report = Report {
        machine: machine(),
        started: started(),
        warmup_s: plan.warmup.as_secs_f64(),
        duration_s: plan.duration.as_secs_f64(),
        backends: Vec::new(),
        skipped: Vec::new(),
    };
    let rows = args.clients.len() * args.locks.len();
    let steps_per_backend = 4 + rows + args.held.len();
    let bar = ProgressBar::new((steps_per_backend * args.backends.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    for backend in &args.backends {
        bar.set_message(format!("{backend}: starting servers"));
        let target = match targets::start(backend).await {
            Ok(target) => target,
            Err(why) => {
                bar.println(format!("lockbench: SKIPPING {backend}: {why}"));
                report.skipped.push((backend.clone(), why));
                bar.inc(steps_per_backend as u64);
                continue;
            }
        };
        let result = measure(&target, &args, plan, &bar).await;
        report.backends.push(result);
    }
    bar.finish_with_message("done");
    report.write(&args.out)?;
    println!("\n{}", report.markdown());
    println!(
        "Report written to {0}/report.md, {0}/report.json and {0}/latency.svg",
        args.out.display()
    );
    Ok(())
}

async fn measure(target: &Target, args: &RunArgs, plan: Plan, bar: &ProgressBar) -> BackendReport {
    let label = &target.label;
    let mut out = BackendReport {
        backend: label.clone(),
        floor: target.floor.as_ref().map(|f| f.describe()),
        handoff_waiters: args.waiters,
        ..BackendReport::default()
    };
    let mut failures = Vec::new();
    let mut note = |what: &str, err: BoxError| {
        let text = format!("{what} failed: {err}");
        bar.println(format!("lockbench: {label}: {text}"));
        failures.push(text);
    };

    bar.set_message(format!("{label}: uncontended"));
    match workloads::uncontended(target, plan).await {
        Ok(l) => out.uncontended = l.summary(),
        Err(e) => note("uncontended", e),
    }
    bar.inc(1);
    bar.set_message(format!("{label}: raw floor"));
    if let Some(floor) = &target.floor {
        match workloads::uncontended_floor(floor.as_ref(), plan).await {
            Ok(f) => {
                out.floor_cycle = f.cycle.summary();
                out.floor_acquire = f.acquire.summary();
                out.floor_release = f.release.summary();
            }
            Err(e) => note("raw floor", e),
        }
    }
    bar.inc(1);
    bar.set_message(format!("{label}: hand-off"));
    match workloads::handoff(target, args.waiters, plan).await {
        Ok(l) => out.handoff = l.summary(),
        Err(e) => note("hand-off", e),
    }
    bar.inc(1);
    for &clients in &args.clients {
        for &locks in &args.locks {
            bar.set_message(format!("{label}: throughput C={clients} L={locks}"));
            match workloads::throughput(target, clients, locks, plan).await {
                Ok(row) => out.throughput.push(row),
                Err(e) => note(&format!("throughput C={clients} L={locks}"), e),
            }
            bar.inc(1);
        }
    }
    bar.set_message(format!("{label}: takeover"));
    if target.cross_process {
        match workloads::takeover(target, args.takeover_rounds).await {
            Ok(t) => out.takeover = Some(t),
            Err(e) => note("takeover", e),
        }
    } else {
        out.notes
            .push("takeover not measured: in-process backend, no holder process to kill".into());
    }
    bar.inc(1);
    for &held in &args.held {
        bar.set_message(format!("{label}: renewal K={held}"));
        match workloads::renewal(target, held, args.renewal_ttl).await {
            Ok(row) => out.renewal.push(row),
            Err(e) => note(&format!("renewal K={held}"), e),
        }
        bar.inc(1);
    }
    out.notes.extend(failures);
    out
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
