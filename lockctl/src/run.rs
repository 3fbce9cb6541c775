//! `run`, `hold` and `try`: taking a lock from the shell.
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

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use distlock::migration::DualConfig;
use distlock::{
    AcquireOptions, DistributedLock, LockGuard, LockName, LockState, ReleaseOutcome, Wait,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep_until, Instant};

use crate::{AcquireArgs, BoxError, EXIT_LOCK};

/// The hidden first argument that makes lockctl the trampoline of its command.
const TRAMPOLINE: &str = "__child";

/// `lockctl __child PPID PROGRAM [ARGS...]`: when lockctl was started as the trampoline
/// of a command, arms the parent-death signal, checks that the parent is still PPID, and
/// execs the command in this process; returns the exit code if that fails. `None` for
/// every other invocation.
pub(crate) fn trampoline_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    if args.nth(1).is_none_or(|first| first != TRAMPOLINE) {
        return None;
    }
    let parent = args
        .next()
        .and_then(|pid| pid.to_str()?.parse::<u32>().ok());
    let (Some(parent), Some(program)) = (parent, args.next()) else {
        eprintln!("lockctl: `{TRAMPOLINE}` is internal to `lockctl run`");
        return Some(ExitCode::FAILURE);
    };
    if let Err(err) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("lockctl: cannot tie the command to lockctl's life: {err}");
        return Some(ExitCode::FAILURE);
    }
    if std::os::unix::process::parent_id() != parent {
        // lockctl died before the death signal was armed: its lock is not ours to use.
        return Some(ExitCode::FAILURE);
    }
    let err = std::process::Command::new(&program).args(args).exec();
    eprintln!("lockctl: cannot run {}: {err}", program.to_string_lossy());
    Some(ExitCode::from(
        if err.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    ))
}

/// `url` with its `ttl` option set to `ttl` (on both sides of a dual lock).
fn url_with_ttl(url: &str, ttl: Duration) -> Result<String, distlock::Error> {
    if let Some(dual) = DualConfig::from_url(url)? {
        let sides = DualConfig::new(url_with_ttl(&dual.old, ttl)?, url_with_ttl(&dual.new, ttl)?);
        return Ok(sides.url());
    }
    let (url, fragment) = url
        .split_once('#')
        .map_or((url, None), |(u, f)| (u, Some(f)));
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("ttl="))
        .collect();
    let ttl = format!("ttl={}", distlock::raw::format_duration(ttl));
    pairs.push(&ttl);
    let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
    Ok(format!("{base}?{}{fragment}", pairs.join("&")))
}

/// A client for `url`, with the lease `acquire.ttl` asks for.
async fn connect(url: &str, acquire: &AcquireArgs) -> Result<Arc<dyn DistributedLock>, BoxError> {
    let url = match acquire.ttl {
        Some(ttl) => url_with_ttl(url, ttl)?,
        None => url.to_owned(),
    };
    Ok(distlock::connect(&url).await?)
}

impl AcquireArgs {
    /// How to wait: `-w 0` is `-n`, as for flock.
    fn wait(&self) -> Wait {
        match (self.nonblock, self.timeout) {
            (true, _) => Wait::Try,
            (false, Some(limit)) if limit.is_zero() => Wait::Try,
            (false, Some(limit)) => Wait::Timeout(limit),
            (false, None) => Wait::Forever,
        }
    }
}

/// `lockctl run`.
pub(crate) async fn run(
    url: &str,
    acquire: &AcquireArgs,
    name: &str,
    command: &[OsString],
    grace: Duration,
) -> Result<ExitCode, BoxError> {
    let name = LockName::new(name)?;
    let locks = connect(url, acquire).await?;
    let mut signals = Signals::catch()?;
    match take(locks.as_ref(), &name, acquire, &mut signals).await? {
        Ok(guard) => run_command(guard, command, grace, &mut signals).await,
        Err(code) => Ok(code),
    }
}

/// `lockctl hold`.
pub(crate) async fn hold(
    url: &str,
    acquire: &AcquireArgs,
    name: &str,
    duration: Duration,
) -> Result<ExitCode, BoxError> {
    let name = LockName::new(name)?;
    let locks = connect(url, acquire).await?;
    let mut signals = Signals::catch()?;
    let guard = match take(locks.as_ref(), &name, acquire, &mut signals).await? {
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
                match state {
                    LockState::Held => println!("state: held"),
                    LockState::Suspect => println!("state: suspect (renewal failing)"),
                    LockState::Lost(reason) => println!("state: lost ({reason})"),
                }
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

/// `lockctl try`.
pub(crate) async fn try_once(
    url: &str,
    name: &str,
    conflict_exit_code: u8,
) -> Result<ExitCode, BoxError> {
    let name = LockName::new(name)?;
    let locks = distlock::connect(url).await?;
    match locks.acquire(&name, &AcquireOptions::try_once()).await? {
        Some(guard) => {
            println!("free (fencing token {})", guard.fencing_token());
            guard.release().await?;
            Ok(ExitCode::SUCCESS)
        }
        None => {
            println!("held by someone else");
            Ok(ExitCode::from(conflict_exit_code))
        }
    }
}

/// Acquires `name` as `acquire` says, unless a signal comes first: the guard, or the exit
/// code that ends lockctl instead (not acquired: the conflict code; signal N: 128 + N).
async fn take(
    locks: &dyn DistributedLock,
    name: &LockName,
    acquire: &AcquireArgs,
    signals: &mut Signals,
) -> Result<Result<LockGuard, ExitCode>, BoxError> {
    let options = AcquireOptions::default().with_wait(acquire.wait());
    let conflict = Err(ExitCode::from(acquire.conflict_exit_code));
    match signals.or_signal(locks.acquire(name, &options)).await {
        Ok(Ok(Some(guard))) => Ok(Ok(guard)),
        Ok(Ok(None)) => {
            eprintln!("lockctl: `{name}` is held by someone else");
            Ok(conflict)
        }
        Ok(Err(err)) if err.kind() == distlock::ErrorKind::Timeout => {
            eprintln!("lockctl: {err}");
            Ok(conflict)
        }
        Ok(Err(err)) => Err(err.into()),
        Err(signal) => Ok(Err(ExitCode::from(
            u8::try_from(128 + signal as i32).unwrap_or(1),
        ))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_set_once_on_every_side() {
        let ttl = Duration::from_millis(1500);
        let with = |url| url_with_ttl(url, ttl).expect("a valid URL");
        assert_eq!(with("redis://h:1"), "redis://h:1?ttl=1500ms");
        assert_eq!(
            with("zk://h:1/locks?ttl=5s&recheck=1s"),
            "zk://h:1/locks?recheck=1s&ttl=1500ms"
        );
        assert_eq!(
            with(" DUAL:zk://a:1/l?ttl=2s | redis://b:2 "),
            "dual:zk://a:1/l?ttl=1500ms|redis://b:2?ttl=1500ms"
        );
        assert_eq!(with("redis://h:1#x"), "redis://h:1?ttl=1500ms#x");
        assert!(url_with_ttl("dual:zk://a:1", ttl).is_err());
    }
}
