//! lockctl: distributed locks from the shell.
//!
//! ```text
//! lockctl --url redis://127.0.0.1:6379 run nightly-backup -- ./backup.sh
//! lockctl --url zk://127.0.0.1:2181/locks hold deploy --for 30s
//! ```
//!
//! `migration check` tells whether a step of a move between backends is safe (see
//! docs/migration.md).
//!
//! `run` holds the lock while a command runs and passes the fencing token to it in
//! `DISTLOCK_FENCING_TOKEN`. Exit codes: the command's own (128 + N if it died of signal
//! N; 127 if it was not found, 126 if it could not be run); 75 when the lock was not
//! acquired in time or was lost; 128 + N when lockctl got signal N before the command
//! started; 1 on other errors.
//!
//! # The command never outlives the lock
//! The command is lockctl's child, in lockctl's process group (a terminal's job control
//! and a group-wide SIGSTOP reach both).
//! - SIGTERM, SIGINT and SIGHUP sent to lockctl are forwarded to the command. lockctl
//!   waits for it to end (after `--grace`, default 5 s, it SIGKILLs it), releases the
//!   lock only then, and exits as the command did. Signals that a terminal sends to the
//!   whole foreground group (Ctrl-C) thus reach the command twice.
//! - A lost lock: SIGTERM to the command, the same grace, SIGKILL; exit 75.
//! - lockctl itself dies (SIGKILL, crash): the kernel SIGKILLs the command, which runs
//!   with a parent-death signal. That signal must be set by the child between fork and
//!   exec, which std offers only through an unsafe `pre_exec` hook, and this workspace
//!   forbids unsafe code. So lockctl starts `/proc/self/exe __child PPID COMMAND...`, a
//!   trampoline that sets `PR_SET_PDEATHSIG` on itself, checks that its parent is still
//!   lockctl (PPID; if lockctl died before the prctl, the command never starts), and
//!   execs the command in place: same pid, and the death signal survives the exec.
//!
//! Limits: the death signal follows the *thread* that forked, so lockctl starts the
//! command from its main thread, which lives as long as the process. The kernel clears
//! it when the command is a set-user-ID or set-group-ID program (such as `sudo`). The
//! command's own subprocesses are its business: a wrapper script should `exec` its last
//! command or pass signals on, as under any supervisor.

mod migration;

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{
    AcquireOptions, DistributedLock, LockGuard, LockName, LockState, ReleaseOutcome, Wait,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep_until, Instant};

/// Exit code when the lock could not be had or was lost (EX_TEMPFAIL).
const EXIT_LOCK: u8 = 75;
/// The hidden first argument that makes lockctl the trampoline of its command.
const TRAMPOLINE: &str = "__child";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
    ///
    /// SIGTERM, SIGINT and SIGHUP are forwarded to the command; the lock is released
    /// only once the command has ended, and lockctl exits as the command did.
    Run {
        /// Lock name.
        name: String,
        /// Time the command gets to end after a forwarded signal or a lost lock, before
        /// SIGKILL.
        #[arg(long, value_parser = parse_duration, default_value = "5s")]
        grace: Duration,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
    /// Take the lock and hold it for a while (or until a signal), printing its state.
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
    /// Moving a fleet between backends (the URL is a `dual:<old>|<new>` lock's).
    #[command(subcommand)]
    Migration(migration::Migration),
}

/// The lock URL from `LOCK_URL`, or `memory://`.
fn lock_url() -> String {
    std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".to_owned())
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::raw::parse_duration("duration", text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|first| first == TRAMPOLINE) {
        return trampoline(args);
    }
    let cli = Cli::parse();
    // `block_on` runs `run` on this, the main thread: the command's parent-death signal
    // is tied to the thread that starts it.
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Into::into)
        .and_then(|runtime| runtime.block_on(run(cli)));
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lockctl: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `lockctl __child PPID PROGRAM [ARGS...]`: arms the parent-death signal, checks that
/// the parent is still PPID, and execs the command in this process.
fn trampoline(mut args: impl Iterator<Item = OsString>) -> ExitCode {
    let parent = args
        .next()
        .and_then(|pid| pid.to_str()?.parse::<u32>().ok());
    let (Some(parent), Some(program)) = (parent, args.next()) else {
        eprintln!("lockctl: `{TRAMPOLINE}` is internal to `lockctl run`");
        return ExitCode::FAILURE;
    };
    if let Err(err) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("lockctl: cannot tie the command to lockctl's life: {err}");
        return ExitCode::FAILURE;
    }
    if std::os::unix::process::parent_id() != parent {
        // lockctl died before the death signal was armed: its lock is not ours to use.
        return ExitCode::FAILURE;
    }
    let err = std::process::Command::new(&program).args(args).exec();
    eprintln!("lockctl: cannot run {}: {err}", program.to_string_lossy());
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// The signals lockctl catches, for the command and for its own orderly exit.
struct Signals([(Signal, tokio::signal::unix::Signal); 3]);

impl Signals {
    fn catch() -> std::io::Result<Self> {
        let on = |kind, ours| Ok::<_, std::io::Error>((ours, signal(kind)?));
        Ok(Self([
            on(SignalKind::terminate(), Signal::SIGTERM)?,
            on(SignalKind::interrupt(), Signal::SIGINT)?,
            on(SignalKind::hangup(), Signal::SIGHUP)?,
        ]))
    }

    /// The next signal received.
    async fn recv(&mut self) -> Signal {
        let [(term, a), (int, b), (hup, c)] = &mut self.0;
        tokio::select! {
            Some(()) = a.recv() => *term,
            Some(()) = b.recv() => *int,
            Some(()) = c.recv() => *hup,
            else => std::future::pending().await,
        }
    }

    /// Runs `work` unless a signal comes first, which is returned instead.
    async fn or_signal<T>(&mut self, work: impl Future<Output = T>) -> Result<T, Signal> {
        tokio::select! {
            value = work => Ok(value),
            signal = self.recv() => Err(signal),
        }
    }
}

/// The exit code of a process that ended with `status` (128 + N for signal N).
fn exit_code(status: ExitStatus) -> ExitCode {
    let code = status
        .code()
        .or_else(|| status.signal().map(|n| 128 + n))
        .and_then(|code| u8::try_from(code).ok());
    ExitCode::from(code.unwrap_or(1))
}

async fn run(cli: Cli) -> Result<ExitCode, BoxError> {
    let url = cli.url.unwrap_or_else(lock_url);
    if let Command::Migration(command) = cli.command {
        return migration::run(&url, command).await;
    }
    let locks = distlock::connect(&url).await?;
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
        Command::Hold { name, duration } => {
            let mut signals = Signals::catch()?;
            hold(locks.as_ref(), &name, wait, duration, &mut signals).await
        }
        Command::Migration(_) => unreachable!("handled before connecting"),
        Command::Run {
            name,
            grace,
            command,
        } => {
            let mut signals = Signals::catch()?;
            match acquire(locks.as_ref(), &name, wait, &mut signals)
                .await?
                .guard()
            {
                Ok(guard) => run_command(guard, &command, grace, &mut signals).await,
                Err(code) => Ok(code),
            }
        }
    }
}

/// How an acquisition ended, short of an error.
enum Acquired {
    Held(LockGuard),
    TimedOut,
    /// lockctl got a signal while waiting.
    Signalled(Signal),
}

impl Acquired {
    /// The guard, or the exit code that ends lockctl instead.
    fn guard(self) -> Result<LockGuard, ExitCode> {
        match self {
            Self::Held(guard) => Ok(guard),
            Self::TimedOut => Err(ExitCode::from(EXIT_LOCK)),
            Self::Signalled(signal) => Err(ExitCode::from(
                u8::try_from(128 + signal as i32).unwrap_or(1),
            )),
        }
    }
}

/// Acquires `name`, waiting as `wait` says, unless a signal comes first.
async fn acquire(
    locks: &dyn DistributedLock,
    name: &str,
    wait: Wait,
    signals: &mut Signals,
) -> Result<Acquired, BoxError> {
    let name = LockName::new(name)?;
    let options = AcquireOptions::default().with_wait(wait);
    match signals.or_signal(locks.acquire(&name, &options)).await {
        Ok(Ok(Some(guard))) => Ok(Acquired::Held(guard)),
        Ok(Ok(None)) => Ok(Acquired::TimedOut),
        Ok(Err(err)) if err.kind() == distlock::ErrorKind::Timeout => {
            eprintln!("lockctl: {err}");
            Ok(Acquired::TimedOut)
        }
        Ok(Err(err)) => Err(err.into()),
        Err(signal) => Ok(Acquired::Signalled(signal)),
    }
}

async fn hold(
    locks: &dyn DistributedLock,
    name: &str,
    wait: Wait,
    duration: Duration,
    signals: &mut Signals,
) -> Result<ExitCode, BoxError> {
    let guard = match acquire(locks, name, wait, signals).await?.guard() {
        Ok(guard) => guard,
        Err(code) => return Ok(code),
    };
    println!(
        "holding `{name}` with fencing token {}",
        guard.fencing_token()
    );
    let mut watch = guard.watch();
    let until = Instant::now() + duration;
    loop {
        tokio::select! {
            state = watch.changed() => {
                println!("state: {state:?}");
                if let LockState::Lost(reason) = state {
                    eprintln!("lockctl: lost `{name}`: {reason}");
                    return Ok(ExitCode::from(EXIT_LOCK));
                }
            }
            () = sleep_until(until) => break,
            _ = signals.recv() => break,
        }
    }
    println!("release: {:?}", guard.release().await?);
    Ok(ExitCode::SUCCESS)
}

/// Runs `command` under `guard` until it ends, then releases the lock.
async fn run_command(
    guard: LockGuard,
    command: &[OsString],
    grace: Duration,
    signals: &mut Signals,
) -> Result<ExitCode, BoxError> {
    // Called from `block_on` on the main thread (see `main`): the trampoline's parent is
    // a thread that lives as long as lockctl.
    let mut child = tokio::process::Command::new("/proc/self/exe")
        .arg0("lockctl")
        .arg(TRAMPOLINE)
        .arg(std::process::id().to_string())
        .args(command)
        .env("DISTLOCK_LOCK_NAME", guard.name().as_str())
        .env("DISTLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .kill_on_drop(true)
        .spawn()?;
    let pid = Pid::from_raw(i32::try_from(child.id().ok_or("the command is gone")?)?);
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut was_lost = false;
    // Once the command was told to stop: when it gets SIGKILL, unless it ended before.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        // The child is reaped only when `wait` returns, so `pid` is ours in every branch.
        tokio::select! {
            status = child.wait() => break status?,
            reason = &mut lost, if !was_lost => {
                eprintln!(
                    "lockctl: lost `{}` ({reason}); stopping the command",
                    guard.name()
                );
                let _ = kill(pid, Signal::SIGTERM);
                was_lost = true;
                kill_at.get_or_insert_with(|| Instant::now() + grace);
            }
            signal = signals.recv() => {
                let _ = kill(pid, signal);
                kill_at.get_or_insert_with(|| Instant::now() + grace);
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                eprintln!(
                    "lockctl: the command did not end within {}; killing it",
                    distlock::raw::format_duration(grace)
                );
                let _ = child.start_kill();
                killed = true;
            }
        }
    };
    // The command may end before the lost signal is seen (lockctl and the command were
    // frozen together, say): a deadline passed meanwhile, or a release the server answers
    // with "not yours", still means the command ran without the lock at the end.
    let expired = guard.valid_until() <= Instant::now();
    if was_lost || expired {
        drop(guard);
        eprintln!("lockctl: the lock was lost while the command ran");
        return Ok(ExitCode::from(EXIT_LOCK));
    }
    match guard.release().await? {
        ReleaseOutcome::Released => Ok(exit_code(status)),
        ReleaseOutcome::AlreadyLost(reason) => {
            eprintln!("lockctl: the lock was lost while the command ran ({reason})");
            Ok(ExitCode::from(EXIT_LOCK))
        }
    }
}
