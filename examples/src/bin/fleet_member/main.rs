//! fleet_member: one process of a fleet that takes one lock name over and over, each time
//! writing a fenced resource (a `conformance::FenceServer` on loopback TCP): acquire,
//! begin a section with the fencing token, read, write the value + 1, end, release.
//!
//! ```text
//! fleet_member --url 'dual:zk://127.0.0.1:2181/locks|redis://127.0.0.1:6379' \
//!     --name jobs --fence 127.0.0.1:4000 --cycles 500
//! fleet_member --kind curator --classpath DIR:JARS --url zk://127.0.0.1:2181/locks …
//! fleet_member --kind set-nx --url redis://127.0.0.1:6379 …
//! ```
//!
//! `--kind distlock` (the default) takes any lock URL (`zk://` old only, `dual:…`, `redis://`
//! new only); `--kind elect` is distlock too, as a candidate of the election of that name:
//! each cycle campaigns, writes with its term as the token, and resigns; `--kind permit`
//! takes the one permit of a semaphore of one and `--kind write` a read-write lock's write
//! side (both exclusive, so the fenced resource judges them as it judges the lock). The foreign kinds take the same names without distlock: `curator` is Apache
//! Curator's `InterProcessMutex` on the `zk://` URL's lock directory (token: its node's
//! czxid), `set-nx` is a plain `SET key token NX PX ttl` and compare-and-delete on the
//! `redis://` URL's lock key (token: `INCR` of the backend's fencing counter).
//!
//! Starts cycling once `--go-file` exists (if given); stops after `--cycles`, after
//! `--duration`, or once `--stop-file` exists, whichever comes first. Prints `READY` once connected and `CYCLE <n> <token>` after each cycle;
//! ends with `SUMMARY <json>`. Any error (an acquire not granted within `--wait`, a token
//! the fence turns away, a lock lost during a section, a release that found the lock
//! gone) ends the process with status 1 after the summary.

mod members;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use conformance::FenceClient;
use serde::Serialize;
use tokio::time::Instant;

use crate::members::Member;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often a member waiting for `--go-file` looks for it.
const GO_POLL: Duration = Duration::from_millis(5);

/// One member of a lock fleet writing a fenced resource.
#[derive(Debug, Parser)]
#[command(about)]
struct Cli {
    /// Lock URL: `zk://…`, `dual:<old>|<new>`, `redis://…`.
    #[arg(long)]
    url: String,
    /// Who takes the lock.
    #[arg(long, value_enum, default_value_t = Kind::Distlock)]
    kind: Kind,
    /// Lock name.
    #[arg(long)]
    name: String,
    /// Address of the fenced resource.
    #[arg(long)]
    fence: SocketAddr,
    /// Cycles to run at most.
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// Run at most this long, e.g. 30s.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Stop before the next cycle once this file exists.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Start the first cycle only once this file exists (waits at most `--wait`), so that
    /// a fleet starts together.
    #[arg(long)]
    go_file: Option<PathBuf>,
    /// Bound on each acquire.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    wait: Duration,
    /// Time inside each section between the read and the write.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    hold: Duration,
    /// Pause after each release.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    pause: Duration,
    /// `curator`: class path of the compiled holder (`harness::curator::compile`).
    #[arg(long)]
    classpath: Option<String>,
}

/// Who takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    /// distlock on the URL.
    Distlock,
    /// distlock's leader election on the URL: each cycle a term.
    Elect,
    /// The one permit of distlock's semaphore of one permit on the URL.
    Permit,
    /// The write side of distlock's read-write lock on the URL.
    Write,
    /// Curator's `InterProcessMutex` on the `zk://` URL's lock directory.
    Curator,
    /// Plain `SET NX PX` on the `redis://` URL's lock key.
    SetNx,
}

/// What a member did, printed as `SUMMARY <json>`.
#[derive(Debug, Default, Serialize)]
struct Summary {
    kind: Option<Kind>,
    url: String,
    cycles: u64,
    first_token: Option<u64>,
    last_token: Option<u64>,
    /// Cycles whose token was below the member's previous one.
    tokens_backwards: u64,
    max_wait_ms: u128,
    error: Option<String>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::raw::durations::parse_duration("duration", text).map_err(|e| e.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut summary = Summary {
        kind: Some(cli.kind),
        url: cli.url.clone(),
        ..Summary::default()
    };
    let result = run(&cli, &mut summary).await;
    if let Err(err) = &result {
        summary.error = Some(err.to_string());
    }
    match serde_json::to_string(&summary) {
        Ok(json) => println!("SUMMARY {json}"),
        Err(err) => eprintln!("summary: {err}"),
    }
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run(cli: &Cli, summary: &mut Summary) -> Result<(), BoxError> {
    let mut member = Member::connect(cli).await?;
    let mut fence = FenceClient::connect(cli.fence).await?;
    println!("READY");
    if let Some(go) = &cli.go_file {
        let deadline = Instant::now() + cli.wait;
        while !go.exists() {
            if Instant::now() >= deadline {
                return Err(
                    format!("{} did not appear within {:?}", go.display(), cli.wait).into(),
                );
            }
            tokio::time::sleep(GO_POLL).await;
        }
    }
    let stop_at = cli.duration.map(|d| Instant::now() + d);
    while summary.cycles < cli.cycles
        && stop_at.is_none_or(|at| Instant::now() < at)
        && !cli.stop_file.as_ref().is_some_and(|f| f.exists())
    {
        let asked = Instant::now();
        let hold = member.acquire(cli.wait).await?;
        summary.max_wait_ms = summary.max_wait_ms.max(asked.elapsed().as_millis());
        let token = hold.token();
        section(&mut fence, &hold, token, cli.hold).await?;
        member.release(hold).await?;
        if summary.last_token.is_some_and(|last| token < last) {
            summary.tokens_backwards += 1;
        }
        summary.first_token.get_or_insert(token);
        summary.last_token = Some(token);
        summary.cycles += 1;
        println!("CYCLE {} {token}", summary.cycles);
        if !cli.pause.is_zero() {
            tokio::time::sleep(cli.pause).await;
        }
    }
    member.close().await;
    Ok(())
}

/// One read-increment-write of the fenced resource under `hold`.
async fn section(
    fence: &mut FenceClient,
    hold: &members::Hold,
    token: u64,
    work: Duration,
) -> Result<(), BoxError> {
    fence
        .begin(token)
        .await?
        .map_err(|stale| format!("fence refused the begin: {stale}"))?;
    let seen = fence.read().await?;
    if !work.is_zero() {
        tokio::time::sleep(work).await;
    }
    if !hold.vouches() {
        fence.end().await?;
        return Err(format!("lock lost during the section of token {token}").into());
    }
    fence
        .write(token, seen + 1)
        .await?
        .map_err(|stale| format!("fence refused the write: {stale}"))?;
    fence.end().await?;
    Ok(())
}
