//! Serve distlock's metrics in Prometheus text format while a lock is taken, held (renewed
//! by the watchdog), released, and maybe lost.
//!
//! ```text
//! LOCK_URL='redis://127.0.0.1:6379?ttl=3s' cargo run -p examples --bin metrics -- --port 9100
//! curl -s http://127.0.0.1:9100/metrics | grep ^distlock_
//! ```
//!
//! The endpoint listens on 127.0.0.1 only, on `--port`, else `METRICS_PORT`, else 9100; port
//! 0 picks a free one. The first line printed names it. By default the example cycles:
//! acquire, hold for `--hold`, release, pause, `--cycles` times (0: until stopped). With
//! `--commands` it does what standard input says instead, one command a line:
//!
//! - `lock`: acquire the lock (waiting for it) and hold it until told otherwise;
//! - `try`: try once with another client of the same URL (not acquired while held);
//! - `release`: release the held lock;
//! - `break`: break the lock with another client of the same URL, as an operator would
//!   (`DistributedLock::force_release`): the holder's guard turns Lost;
//! - `quit`: release what is held and end.
//!
//! Every line printed starts with what happened (`acquired`, `lost`, `released`, …).

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use distlock::{DistributedLock, DistributedLockExt, LockGuard, LockName, ReleaseOutcome};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncBufReadExt, BufReader};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The port when neither `--port` nor `METRICS_PORT` gives one.
const DEFAULT_PORT: u16 = 9100;

/// Takes a lock over and over and serves the metrics of it.
#[derive(Debug, Parser)]
#[command(about)]
struct Cli {
    /// Port of the metrics endpoint on 127.0.0.1 (0: a free one) [env: METRICS_PORT;
    /// default: 9100].
    #[arg(long)]
    port: Option<u16>,
    /// Lock name.
    #[arg(long, default_value = "examples/metrics")]
    name: String,
    /// How long each cycle holds the lock.
    #[arg(long, default_value = "5s", value_parser = duration)]
    hold: Duration,
    /// Pause after each release.
    #[arg(long, default_value = "1s", value_parser = duration)]
    pause: Duration,
    /// Cycles to run (0: until stopped).
    #[arg(long, default_value_t = 0)]
    cycles: u64,
    /// Do what standard input says instead of cycling.
    #[arg(long)]
    commands: bool,
}

fn duration(text: &str) -> distlock::Result<Duration> {
    distlock::raw::parse_duration("duration", text)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    let addr = metrics_addr(cli.port)?;

    // --- the taught part ---
    // The recorder first: a lock client takes its metric handles when it is made.
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(distlock::metrics::BUCKETS_SECONDS)?
        .install()?;
    distlock::describe_metrics();
    let locks = distlock::connect(&examples::lock_url()).await?;
    // --- end of the taught part ---

    listening(addr).await?;
    say(format!("metrics at http://{addr}/metrics"));
    let name = LockName::new(cli.name.as_str())?;
    if cli.commands {
        follow_commands(&locks, &name).await
    } else {
        cycle(&locks, &name, &cli).await
    }
}

/// Where the endpoint listens: 127.0.0.1 and the port asked for, a free one for 0.
fn metrics_addr(port: Option<u16>) -> Result<SocketAddr, BoxError> {
    let port = match port {
        Some(port) => port,
        None => match std::env::var("METRICS_PORT") {
            Ok(text) => text.parse()?,
            Err(_) => DEFAULT_PORT,
        },
    };
    let port = match port {
        // The exporter binds by itself: take a free port and hand it over at once.
        0 => TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port(),
        port => port,
    };
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// Waits until the exporter's listener (started in the background) accepts connections.
async fn listening(addr: SocketAddr) -> Result<(), BoxError> {
    const WITHIN: Duration = Duration::from_secs(5);
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => return Ok(()),
            Err(err) if tokio::time::Instant::now() >= deadline => {
                return Err(format!("the metrics endpoint {addr} is not listening: {err}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Prints one line at once (standard output is a pipe when a test reads it).
fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn cycle(
    locks: &Arc<dyn DistributedLock>,
    name: &LockName,
    cli: &Cli,
) -> Result<(), BoxError> {
    let mut done = 0;
    while cli.cycles == 0 || done < cli.cycles {
        let guard = acquire(locks, name).await?;
        tokio::select! {
            () = tokio::time::sleep(cli.hold) => release(guard).await?,
            reason = guard.lost() => say(format!("lost {name}: {} ({reason})", reason.label())),
        }
        done += 1;
        tokio::time::sleep(cli.pause).await;
    }
    Ok(())
}

async fn follow_commands(
    locks: &Arc<dyn DistributedLock>,
    name: &LockName,
) -> Result<(), BoxError> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut held: Option<LockGuard> = None;
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "lock" => {
                if held.is_some() {
                    say("error: already held");
                    continue;
                }
                let guard = acquire(locks, name).await?;
                let lost = guard.lost();
                let name = name.clone();
                tokio::spawn(async move {
                    let reason = lost.await;
                    if reason != distlock::LostReason::Released {
                        say(format!("lost {name}: {} ({reason})", reason.label()));
                    }
                });
                held = Some(guard);
            }
            "try" => {
                let other = distlock::connect(&examples::lock_url()).await?;
                match other.try_lock(name.as_str()).await? {
                    Some(guard) => {
                        say(format!("acquired {name} from another client"));
                        release(guard).await?;
                    }
                    None => say(format!("not acquired: {name} is held")),
                }
            }
            "release" => match held.take() {
                Some(guard) => release(guard).await?,
                None => say("error: nothing held"),
            },
            "break" => {
                let operator = distlock::connect(&examples::lock_url()).await?;
                match operator.force_release(name).await {
                    Ok(Some(_)) => say(format!("broke {name}")),
                    Ok(None) => say(format!("error: nobody holds {name}")),
                    Err(err) => say(format!("error: {err}")),
                }
            }
            "quit" => break,
            "" => {}
            other => say(format!("error: unknown command {other:?}")),
        }
    }
    if let Some(guard) = held {
        release(guard).await?;
    }
    Ok(())
}

async fn acquire(locks: &Arc<dyn DistributedLock>, name: &LockName) -> distlock::Result<LockGuard> {
    let guard = locks.lock(name.as_str()).await?;
    say(format!(
        "acquired {name} (fencing token {})",
        guard.fencing_token()
    ));
    Ok(guard)
}

async fn release(guard: LockGuard) -> distlock::Result<()> {
    let name = guard.name().clone();
    match guard.release().await? {
        ReleaseOutcome::Released => say(format!("released {name}")),
        ReleaseOutcome::AlreadyLost(reason) => {
            say(format!("released {name}: it had been lost ({reason})"));
        }
    }
    Ok(())
}
