//! The migration walk-through (`make demo` runs it): a fleet of three worker processes
//! moves one lock from ZooKeeper to Redis, one restart at a time, through every phase and
//! back: old only → dual → old only (a rollback, possible while no new-only process has
//! run), then old only → dual → new only → dual, and the check before dual → old only,
//! which refuses once new-only processes have held the lock. Only adjacent phases ever
//! run side by side. Before each restart the advance check says whether the step is
//! safe, and once per leg it shows what it reports while a process of the far phase still
//! runs. Every worker writes a fenced counter with its fencing token; at the end the
//! counter's history shows no two holders inside at once and no token going back.
//!
//! The servers are throwaway ones on free 127.0.0.1 ports (the lab's harness), as
//! for the tests and lockbench. The processes are `fleet_member`s (built next to this
//! program): each knows only its lock URL. docs/migration.md is the runbook this follows.
//!
//! ```text
//! cargo build --release -p examples --bin migration --bin fleet_member
//! ./target/release/migration --step 1s --watch 1s
//! ```

mod check;
mod fleet;

use std::time::Duration;

use clap::Parser;
use conformance::{FenceServer, FencedResource};
use distlock::migration::CheckReport;
use harness::{RedisServer, ZkServer};
use tokio::time::sleep;

use crate::fleet::{Done, Fleet, Phase, Urls};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock the fleet shares.
const NAME: &str = "jobs/nightly";
/// Processes in the fleet.
const FLEET: usize = 3;

/// A fleet of processes migrates a lock from ZooKeeper to Redis and back.
#[derive(Debug, Parser)]
#[command(about)]
struct Cli {
    /// How long the fleet runs after each restart.
    #[arg(long, default_value = "700ms", value_parser = parse_duration)]
    step: Duration,
    /// How long each advance check watches the lock.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    watch: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::raw::durations::parse_duration("duration", text).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    walk(cli.step, cli.watch).await
}

/// The walk: each leg moves every worker, one restart at a time, from one phase to the
/// next. A rollback to old only first, while it is still possible; then on to new only
/// and back as far as the check allows.
const LEGS: [(Phase, Phase); 6] = [
    (Phase::Old, Phase::Dual),
    (Phase::Dual, Phase::Old),
    (Phase::Old, Phase::Dual),
    (Phase::Dual, Phase::New),
    (Phase::New, Phase::Dual),
    (Phase::Dual, Phase::Old),
];

async fn walk(step: Duration, watch: Duration) -> Result<(), BoxError> {
    println!(
        "distlock migration walk-through: ZooKeeper -> Redis and back, {FLEET} worker \
         processes on `{NAME}`\n"
    );
    let (zk, redis) = tokio::try_join!(ZkServer::start(), RedisServer::start())?;
    let urls = Urls {
        old: format!("{}/migration", zk.url()),
        new: redis.url(),
    };
    println!("  old only: {}", urls.of(Phase::Old));
    println!("  dual:     {}", urls.of(Phase::Dual));
    println!("  new only: {}\n", urls.of(Phase::New));
    let resource = FencedResource::new();
    let fence = FenceServer::start(resource.clone()).await?;
    let mut fleet = Fleet::start(urls.clone(), NAME, fence.addr(), FLEET, Phase::Old).await?;
    println!("{}  the fleet starts", show(&fleet.phases()));
    sleep(step).await;
    'legs: for (from, to) in LEGS {
        println!();
        for slot in 0..FLEET {
            if slot + 1 == FLEET && to == Phase::Dual {
                // One process of the far phase is left: the check of the step after
                // this leg sees it.
                let far = check::step(Phase::Dual, opposite(from));
                let report = check::run(&urls, NAME, far, watch).await?;
                println!(
                    "      worker {slot} is still {}: a check of {far} now says",
                    from.label()
                );
                print_report(&report);
            }
            let report = check::run(&urls, NAME, check::step(from, to), watch).await?;
            println!("      before worker {slot} goes {}:", to.label());
            print_report(&report);
            if !report.is_clear() {
                if to == Phase::Old && report.unmarked.is_empty() && report.failures.is_empty() {
                    println!(
                        "\n      New-only processes have held `{NAME}`: their Redis tokens are \
                         clock-seeded, above\n      every ZooKeeper czxid, so old-only holders \
                         would get lower tokens. The way back ends\n      at dual \
                         (docs/migration.md, \"Rolling back\")."
                    );
                    break 'legs;
                }
                return Err(format!("the check refused {}", check::step(from, to)).into());
            }
            let done = fleet.restart(slot, to).await?;
            println!(
                "{}  worker {slot}: {} -> {}; {}",
                show(&fleet.phases()),
                from.label(),
                to.label(),
                describe(&done)
            );
            sleep(step).await;
        }
    }
    println!();
    for (slot, (phase, done)) in fleet.stop().await?.into_iter().enumerate() {
        println!(
            "   worker {slot} ({}) stopped; {}",
            phase.label(),
            describe(&done)
        );
    }
    let report = resource.check();
    let stale = report.rejected_begins + report.rejected_writes;
    println!(
        "\nThe fenced counter: {} sections, {} writes accepted, counter = {}, stale tokens \
         turned away: {stale}, overlapping sections: {}, tokens going back: {}.",
        report.sections,
        report.accepted_writes,
        report.counter,
        report.overlaps.len(),
        report.tokens_backwards.len()
    );
    if !report.is_safe() || stale > 0 {
        return Err("the fleet broke exclusion or fencing during the walk".into());
    }
    println!("No two holders were ever inside at once, and no fencing token went back.");
    Ok(())
}

/// The far end of the walk from `phase`.
fn opposite(phase: Phase) -> Phase {
    match phase {
        Phase::Old => Phase::New,
        Phase::Dual => Phase::Dual,
        Phase::New => Phase::Old,
    }
}

/// The check's report, indented.
fn print_report(report: &CheckReport) {
    for line in report.to_string().lines() {
        println!("        {line}");
    }
}

/// The fleet's phases, one column per worker.
fn show(phases: &[Phase]) -> String {
    let cells: Vec<String> = phases.iter().map(|p| format!("{:<8}", p.label())).collect();
    format!("[{}]", cells.join(" | "))
}

fn describe(done: &Done) -> String {
    let token = |t: Option<u64>| t.map_or("-".to_owned(), |t| t.to_string());
    format!(
        "the stopped process held the lock {} times, fencing tokens {} .. {}",
        done.cycles,
        token(done.first_token),
        token(done.last_token)
    )
}
