//! lockctl: distributed locks from the shell.
//!
//! ```text
//! lockctl --url redis://127.0.0.1:6379 run nightly-backup -- ./backup.sh
//! lockctl --url zk://127.0.0.1:2181/locks hold deploy --for 30s
//! ```
//!
//! `run` holds the lock while a command runs, passes the fencing token to it in
//! `DISTLOCK_FENCING_TOKEN`, and stops the command (SIGTERM, then SIGKILL) if the lock is
//! lost. Exit codes: the command's own; 75 when the lock was not acquired in time or was
//! lost; 1 on other errors.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lock_core::{AcquireOptions, DistributedLock, LockName, LockState, Wait};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::timeout;

/// Exit code when the lock could not be had or was lost (EX_TEMPFAIL).
const EXIT_LOCK: u8 = 75;
/// Time a command gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Parser)]
#[command(version, about = "Distributed locks from the shell")]
struct Cli {
    /// Lock service URL (default: $LOCK_URL, else memory://).
    #[arg(long, global = true)]
    url: Option<String>,
    /// Give up acquiring after this long (e.g. 30s); default: wait forever.
    #[arg(long, global = true, value_parser = parse_duration)]
    timeout: Option<Duration>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding the lock; stop it if the lock is lost.
    Run {
        /// Lock name.
        name: String,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Take the lock and hold it for a while (or until Ctrl-C), printing its state.
    Hold {
        /// Lock name.
        name: String,
        /// How long to hold it.
        #[arg(long = "for", value_parser = parse_duration, default_value = "10s")]
        duration: Duration,
    },
    /// Try once: exit 0 if the lock was free (it is released at once), 75 if held.
    Try {
        /// Lock name.
        name: String,
    },
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    lock_core::parse_duration("duration", text).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    examples::register_backends();
    match run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lockctl: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let url = cli.url.unwrap_or_else(examples::lock_url);
    let locks = lock_core::connect(&url).await?;
    let wait = cli.timeout.map_or(Wait::Forever, Wait::Timeout);
    match cli.command {
        Command::Try { name } => {
            let name = LockName::new(name)?;
            match locks.acquire(&name, &AcquireOptions::try_once()).await? {
                Some(guard) => {
                    println!("free (fencing token {})", guard.fencing_token());
                    guard.release().await?;
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    println!("held by someone else");
                    Ok(ExitCode::from(EXIT_LOCK))
                }
            }
        }
        Command::Hold { name, duration } => hold(locks.as_ref(), &name, wait, duration).await,
        Command::Run { name, command } => run_command(locks.as_ref(), &name, wait, &command).await,
    }
}

async fn acquire(
    locks: &dyn DistributedLock,
    name: &str,
    wait: Wait,
) -> Result<Option<lock_core::LockGuard>, Box<dyn std::error::Error>> {
    let name = LockName::new(name)?;
    match locks
        .acquire(&name, &AcquireOptions::default().with_wait(wait))
        .await
    {
        Ok(guard) => Ok(guard),
        Err(err) if err.kind() == lock_core::ErrorKind::Timeout => {
            eprintln!("lockctl: {err}");
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

async fn hold(
    locks: &dyn DistributedLock,
    name: &str,
    wait: Wait,
    duration: Duration,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Some(guard) = acquire(locks, name, wait).await? else {
        return Ok(ExitCode::from(EXIT_LOCK));
    };
    println!(
        "holding `{name}` with fencing token {}",
        guard.fencing_token()
    );
    let mut watch = guard.watch();
    let until = tokio::time::Instant::now() + duration;
    loop {
        tokio::select! {
            state = watch.changed() => {
                println!("state: {state:?}");
                if let LockState::Lost(reason) = state {
                    eprintln!("lockctl: lost `{name}`: {reason}");
                    return Ok(ExitCode::from(EXIT_LOCK));
                }
            }
            _ = tokio::time::sleep_until(until) => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    println!("release: {:?}", guard.release().await?);
    Ok(ExitCode::SUCCESS)
}

async fn run_command(
    locks: &dyn DistributedLock,
    name: &str,
    wait: Wait,
    command: &[String],
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (program, args) = command.split_first().ok_or("no command given")?;
    let Some(guard) = acquire(locks, name, wait).await? else {
        return Ok(ExitCode::from(EXIT_LOCK));
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("DISTLOCK_LOCK_NAME", name)
        .env("DISTLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .kill_on_drop(true)
        .spawn()?;
    let status = tokio::select! {
        status = child.wait() => status?,
        reason = guard.lost() => {
            eprintln!("lockctl: lost `{name}` ({reason}); stopping the command");
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            if timeout(STOP_GRACE, child.wait()).await.is_err() {
                child.kill().await?;
            }
            drop(guard);
            return Ok(ExitCode::from(EXIT_LOCK));
        }
    };
    guard.release().await?;
    let code = status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1));
    Ok(ExitCode::from(code))
}
