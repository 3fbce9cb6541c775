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
//! - `try [TTL]`: try once with another client of the same URL (not acquired while held),
//!   with a TTL of its own if given (`try 0s` is refused: an invalid TTL);
//! - `wait TIMEOUT`: in the background, another client of the same URL waits for the lock
//!   up to `TIMEOUT` (e.g. `3s`), then releases it at once if granted (one line when
//!   done: `granted …` or `timed out …`); commands go on meanwhile (a `release` grants it);
//! - `release`: release the held lock;
//! - `break`: break the lock with another client of the same URL, as an operator would
//!   (`DistributedLock::force_release`): the holder's guard turns Lost;
//! - `quit`: release what is held, let background waits end, and end.
//!
//! Every line printed starts with what happened (`acquired`, `not acquired`, `refused`,
//! `waiting`, `granted`, `timed out`, `lost`, `released`, `broke`, `error`).

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use distlock::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockGuard, LockName,
    ReleaseOutcome,
};
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder};
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
    distlock::raw::durations::parse_duration("duration", text)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    // --- the taught part ---
    // The recorder first (`install_exporter`): a lock client takes its metric handles when
    // it is made.
    let addr = serve_metrics(metrics_port(cli.port)?)?;
    distlock::metrics::describe_metrics();
    let locks = distlock::connect(&examples::lock_url()).await?;
    // --- end of the taught part ---

    listening(addr).await?;
    say(format!("metrics at http://{addr}/metrics"));
    let name = LockName::new(cli.name.as_str())?;
    let ran = if cli.commands {
        follow_commands(&locks, &name).await
    } else {
        cycle(&locks, &name, &cli).await
    };
    locks.close().await?;
    ran
}

/// Installs the Prometheus recorder, its endpoint listening on `addr` (taught code).
fn install_exporter(addr: SocketAddr) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(distlock::metrics::BUCKETS_SECONDS)?
        .install()
}

/// The port asked for: `--port`, else `METRICS_PORT`, else [`DEFAULT_PORT`].
fn metrics_port(port: Option<u16>) -> Result<u16, BoxError> {
    Ok(match port {
        Some(port) => port,
        None => match std::env::var("METRICS_PORT") {
            Ok(text) => text.parse()?,
            Err(_) => DEFAULT_PORT,
        },
    })
}

/// Installs the exporter on 127.0.0.1:`port` and returns where it listens. For port 0 a
/// free port is found and handed over (the exporter binds by itself, to an address it is
/// given); another process may take it in between, so a failed bind tries another.
fn serve_metrics(port: u16) -> Result<SocketAddr, BoxError> {
    /// Binds tried for port 0.
    const TRIES: u32 = 3;
    let mut tried = 0;
    loop {
        tried += 1;
        let picked = match port {
            0 => TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port(),
            port => port,
        };
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, picked));
        match install_exporter(addr) {
            Ok(()) => return Ok(addr),
            Err(BuildError::FailedToCreateHTTPListener(_)) if port == 0 && tried < TRIES => {}
            Err(err) => return Err(err.into()),
        }
    }
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
    let mut waits = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let (command, argument) = match line.trim().split_once(' ') {
            Some((command, argument)) => (command, Some(argument.trim())),
            None => (line.trim(), None),
        };
        match (command, argument) {
            ("lock", None) => {
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
            ("try", ttl) => {
                let mut options = AcquireOptions::try_once();
                if let Some(ttl) = ttl {
                    options = options.with_ttl(duration(ttl)?);
                }
                let other = distlock::connect(&examples::lock_url()).await?;
                match other.acquire(name, &options).await {
                    Ok(Some(guard)) => {
                        say(format!("acquired {name} from another client"));
                        release(guard).await?;
                    }
                    Ok(None) => say(format!("not acquired: {name} is held")),
                    Err(err) => say(format!("refused ({}): {err}", err.kind().label())),
                }
            }
            ("wait", Some(limit)) => {
                let limit = duration(limit)?;
                let other = distlock::connect(&examples::lock_url()).await?;
                say(format!("waiting for {name} up to {limit:?}"));
                waits.push(tokio::spawn(wait_for(other, name.clone(), limit)));
            }
            ("release", None) => match held.take() {
                Some(guard) => release(guard).await?,
                None => say("error: nothing held"),
            },
            ("break", None) => {
                let operator = distlock::connect(&examples::lock_url()).await?;
                match operator.force_release(name).await {
                    Ok(Some(_)) => say(format!("broke {name}")),
                    Ok(None) => say(format!("error: nobody holds {name}")),
                    Err(err) => say(format!("error: {err}")),
                }
            }
            ("quit", None) => break,
            ("", None) => {}
            _ => say(format!("error: unknown command {line:?}")),
        }
    }
    if let Some(guard) = held {
        release(guard).await?;
    }
    for wait in waits {
        wait.await?;
    }
    Ok(())
}

/// Waits for `name` with client `other` up to `limit`, and releases it at once if granted.
async fn wait_for(other: Arc<dyn DistributedLock>, name: LockName, limit: Duration) {
    let started = tokio::time::Instant::now();
    match other.acquire(&name, &AcquireOptions::timeout(limit)).await {
        Ok(Some(guard)) => {
            let waited = started.elapsed();
            match guard.release().await {
                Ok(_) => say(format!(
                    "granted {name} to the waiting client after {waited:?}; released it"
                )),
                Err(err) => say(format!("error: {err}")),
            }
        }
        Ok(None) => say(format!("error: the wait for {name} returned no guard")),
        Err(err) if err.kind() == ErrorKind::Timeout => {
            say(format!("timed out waiting for {name}: {err}"));
        }
        Err(err) => say(format!("error: {err}")),
    }
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
