//! `run`, `hold` and `try`: taking a lock from the shell.
//!
//! # The command never outlives the lock
//! The command is lockctl's child, in lockctl's process group (a terminal's job control
//! and a group-wide SIGSTOP reach both).
//! - SIGTERM, SIGINT and SIGHUP sent to lockctl are forwarded to the command. lockctl
//!   waits for it to end (after `--grace` it SIGKILLs it), releases the lock only then,
//!   and exits as the command did. Signals that a terminal sends to the whole foreground
//!   group (Ctrl-C) thus reach the command twice.
//! - The stop sequence always ends before the guard's validity deadline: SIGTERM comes at
//!   the deadline less the grace (reached only when renewals fall behind: a cut link, a
//!   server that does not answer), SIGKILL before the deadline, so no one else can be
//!   granted the lock while the command runs. A lost lock: SIGTERM at once, SIGKILL after
//!   the grace or before the deadline, whichever is first; exit 75. The grace must fit in
//!   the lease (at most half the TTL less a margin); a longer one is a usage error.
//! - A release that fails after the command ended within the lease changes nothing: the
//!   command ran under the lock to its end, lockctl warns and exits as it did.
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

use distlock::raw::backend::{AcquireKind, HoldKind};
use distlock::raw::plumbing::Backoff;
use distlock::{
    AcquireOptions, DistributedLock, LockGuard, LockName, LockOptions, LockState, ReleaseOutcome,
    Wait,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep_until, Instant};

use crate::{closing, AcquireArgs, BoxError, EXIT_LOCK, EXIT_USAGE};

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

/// A client for `url`, with the lease `acquire.ttl` asks for (winning over the URL's, on
/// both sides of a dual lock).
async fn connect(url: &str, acquire: &AcquireArgs) -> Result<Arc<dyn DistributedLock>, BoxError> {
    let mut options = LockOptions::builder();
    if let Some(ttl) = acquire.ttl {
        options = options.ttl(ttl);
    }
    Ok(distlock::connect_with(url, &options).await?)
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

/// A candidate's value when `elect` is given none: `HOSTNAME:PID`.
pub(crate) fn default_candidate_value() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// First pause before `elect --requeue` campaigns again (jittered, doubling).
const REQUEUE_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause before `elect --requeue` campaigns again.
const LONGEST_REQUEUE_PAUSE: Duration = Duration::from_secs(10);

/// How many times `run_terms` takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Terms {
    /// Once: lockctl exits as the command did.
    Once,
    /// Again after each end of the command or loss of the lock, until a signal.
    Requeue,
}

/// `lockctl run` (a hold of `kind`: the mutex, a permit, a read or a write).
pub(crate) async fn run(
    url: &str,
    acquire: &AcquireArgs,
    name: &str,
    command: &[OsString],
    grace: Option<Duration>,
    kind: HoldKind,
) -> Result<ExitCode, BoxError> {
    run_terms(url, acquire, name, command, grace, kind, Terms::Once).await
}

/// `lockctl run`, and `lockctl elect` (a candidate's hold), once or `Terms::Requeue`.
pub(crate) async fn run_terms(
    url: &str,
    acquire: &AcquireArgs,
    name: &str,
    command: &[OsString],
    grace: Option<Duration>,
    kind: HoldKind,
    terms: Terms,
) -> Result<ExitCode, BoxError> {
    let name = LockName::new(name)?;
    let locks = connect(url, acquire).await?;
    closing(locks.as_ref(), async {
        let grace = match grace_within(grace, locks.options().ttl) {
            Ok(grace) => grace,
            Err(usage) => {
                eprintln!("lockctl: {usage}");
                return Ok(ExitCode::from(EXIT_USAGE));
            }
        };
        let mut signals = Signals::catch()?;
        let leader = matches!(kind, HoldKind::Candidate { .. });
        let mut backoff = Backoff::new(REQUEUE_PAUSE, LONGEST_REQUEUE_PAUSE);
        loop {
            let guard =
                match take(locks.as_ref(), &name, acquire, kind.clone(), &mut signals).await? {
                    Ok(guard) => guard,
                    Err(code) => return Ok(code),
                };
            let taken_at = Instant::now();
            let mut signalled = false;
            let code =
                run_command(guard, command, grace, leader, &mut signals, &mut signalled).await?;
            if terms == Terms::Once || signalled {
                return Ok(code);
            }
            if taken_at.elapsed() > LONGEST_REQUEUE_PAUSE {
                backoff.reset();
            }
            let pause = backoff.next_pause();
            eprintln!(
                "lockctl: the command's term on `{name}` ended; campaigning again in {}",
                distlock::raw::durations::format_duration(pause)
            );
            if let Err(signal) = signals.or_signal(tokio::time::sleep(pause)).await {
                return Ok(signal_exit(signal));
            }
        }
    })
    .await
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
    closing(
        locks.as_ref(),
        hold_with(locks.as_ref(), acquire, &name, duration),
    )
    .await
}

/// `lockctl hold` with the client `locks`.
async fn hold_with(
    locks: &dyn DistributedLock,
    acquire: &AcquireArgs,
    name: &LockName,
    duration: Duration,
) -> Result<ExitCode, BoxError> {
    let mut signals = Signals::catch()?;
    let guard = match take(locks, name, acquire, HoldKind::Mutex, &mut signals).await? {
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
    closing(locks.as_ref(), async {
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
    })
    .await
}

/// Acquires `name` (a hold of `kind`) as `acquire` says, unless a signal comes first: the
/// guard, or the exit code that ends lockctl instead (not acquired: the conflict code;
/// signal N: 128 + N).
async fn take(
    locks: &dyn DistributedLock,
    name: &LockName,
    acquire: &AcquireArgs,
    kind: HoldKind,
    signals: &mut Signals,
) -> Result<Result<LockGuard, ExitCode>, BoxError> {
    let options = AcquireOptions::default()
        .with_wait(acquire.wait())
        .with_kind(kind);
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
        Err(signal) => Ok(Err(signal_exit(signal))),
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

/// The exit code of lockctl ended by signal N before a command ran: 128 + N.
fn signal_exit(signal: Signal) -> ExitCode {
    ExitCode::from(u8::try_from(128 + signal as i32).unwrap_or(1))
}

/// The exit code of a process that ended with `status` (128 + N for signal N).
fn exit_code(status: ExitStatus) -> ExitCode {
    let code = status
        .code()
        .or_else(|| status.signal().map(|n| 128 + n))
        .and_then(|code| u8::try_from(code).ok());
    ExitCode::from(code.unwrap_or(1))
}

/// How long before the guard's validity deadline the command gets SIGKILL: time for the
/// kernel to end it before the lease can end on the server.
const KILL_MARGIN: Duration = Duration::from_millis(100);

/// Grace of a command when `--grace` is not given, if the lease leaves room for it.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The longest grace that fits in a lease of `ttl`: SIGTERM comes at the validity
/// deadline less the grace and [`KILL_MARGIN`], which a renewal on time (at a third of the
/// TTL, so two thirds of it left) never lets come near; half the TTL leaves a sixth of it
/// for a renewal's round trip.
fn longest_grace(ttl: Duration) -> Duration {
    (ttl / 2).saturating_sub(KILL_MARGIN)
}

/// The grace of the command of a lock with lease `ttl`: `asked` if it fits in the lease,
/// else a usage error; without `asked`, [`DEFAULT_GRACE`] or the longest that fits.
pub(crate) fn grace_within(asked: Option<Duration>, ttl: Duration) -> Result<Duration, String> {
    let longest = longest_grace(ttl);
    match asked {
        None => Ok(DEFAULT_GRACE.min(longest)),
        Some(grace) if grace <= longest => Ok(grace),
        Some(grace) => Err(format!(
            "--grace {} does not fit in the lock's TTL of {}: the command must be stopped \
             before the lease can end, so the grace is at most {} (half the TTL less {}); \
             give a shorter --grace or a longer --ttl",
            distlock::raw::durations::format_duration(grace),
            distlock::raw::durations::format_duration(ttl),
            distlock::raw::durations::format_duration(longest),
            distlock::raw::durations::format_duration(KILL_MARGIN),
        )),
    }
}

/// When the command is told to stop (SIGTERM) and killed (SIGKILL): both before the
/// guard's validity deadline, which renewals move forward while they are on time.
#[derive(Debug)]
struct StopPlan {
    grace: Duration,
    /// When SIGTERM (or a forwarded signal) was sent.
    told: Option<Instant>,
    killed: bool,
}

impl StopPlan {
    /// By when the command must be gone for a hold valid until `valid_until`.
    fn gone_by(valid_until: Instant) -> Instant {
        valid_until.checked_sub(KILL_MARGIN).unwrap_or(valid_until)
    }

    /// When to send SIGTERM, unless the command was told already.
    fn term_at(&self, valid_until: Instant) -> Option<Instant> {
        let gone_by = Self::gone_by(valid_until);
        self.told
            .is_none()
            .then(|| gone_by.checked_sub(self.grace).unwrap_or(gone_by))
    }

    /// When to send SIGKILL: the end of the grace once told, and before the deadline.
    fn kill_at(&self, valid_until: Instant) -> Option<Instant> {
        let gone_by = Self::gone_by(valid_until);
        (!self.killed).then(|| match self.told {
            Some(told) => (told + self.grace).min(gone_by),
            None => gone_by,
        })
    }
}

/// Runs `command` under `guard` (a `leader`'s: the command learns its term) until it
/// ends, then releases the lock.
/// `signalled` is set when a signal to lockctl was passed on to the command.
async fn run_command(
    guard: LockGuard,
    command: &[OsString],
    grace: Duration,
    leader: bool,
    signals: &mut Signals,
    signalled: &mut bool,
) -> Result<ExitCode, BoxError> {
    // A lock handed over by its last holder's release starts on a short first lease (so a
    // granted holder that died costs only that), renewed a third of the way into it. When
    // that renewal would come after the plan's SIGTERM, renew now: the command starts
    // with its whole grace ahead of it.
    let left = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    if left * 2 / 3 < grace + KILL_MARGIN {
        if let Err(error) = guard.extend().await {
            eprintln!(
                "lockctl: could not renew `{}` before starting the command: {error}",
                guard.name()
            );
            return Ok(ExitCode::from(EXIT_LOCK));
        }
    }
    // Called from `block_on` on the main thread (see `main`): the trampoline's parent is
    // a thread that lives as long as lockctl.
    let mut child = tokio::process::Command::new("/proc/self/exe");
    child
        .arg0("lockctl")
        .arg(TRAMPOLINE)
        .arg(std::process::id().to_string())
        .args(command)
        .env("DISTLOCK_LOCK_NAME", guard.name().as_str())
        .env("DISTLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .kill_on_drop(true);
    if leader {
        child.env("DISTLOCK_LEADER_TERM", guard.fencing_token().to_string());
    }
    let mut child = child.spawn()?;
    let pid = Pid::from_raw(i32::try_from(child.id().ok_or("the command is gone")?)?);
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut was_lost = false;
    // Whether the command was stopped because the lock was at risk (lost, or renewals
    // behind its validity deadline).
    let mut stopped_for_the_lock = false;
    let mut plan = StopPlan {
        grace,
        told: None,
        killed: false,
    };
    let status = loop {
        // Read again on every turn: renewals move the deadline forward.
        let valid_until = guard.valid_until();
        let term_at = plan.term_at(valid_until);
        let kill_at = plan.kill_at(valid_until);
        // The child is reaped only when `wait` returns, so `pid` is ours in every branch.
        tokio::select! {
            status = child.wait() => break status?,
            reason = &mut lost, if !was_lost => {
                eprintln!(
                    "lockctl: lost `{}` ({reason}); stopping the command",
                    guard.name()
                );
                was_lost = true;
                stopped_for_the_lock = true;
                if plan.told.is_none() {
                    let _ = kill(pid, Signal::SIGTERM);
                    plan.told = Some(Instant::now());
                }
            }
            signal = signals.recv() => {
                *signalled = true;
                let _ = kill(pid, signal);
                plan.told.get_or_insert_with(Instant::now);
            }
            () = sleep_until(term_at.unwrap_or_else(Instant::now)), if term_at.is_some() => {
                if plan.term_at(guard.valid_until()).is_some_and(|at| at <= Instant::now()) {
                    eprintln!(
                        "lockctl: renewals of `{}` fell behind; stopping the command before \
                         the lock can be lost",
                        guard.name()
                    );
                    stopped_for_the_lock = true;
                    let _ = kill(pid, Signal::SIGTERM);
                    plan.told = Some(Instant::now());
                }
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                if plan.kill_at(guard.valid_until()).is_some_and(|at| at <= Instant::now()) {
                    eprintln!("lockctl: the command did not end in time; killing it");
                    let _ = child.start_kill();
                    plan.killed = true;
                }
            }
        }
    };
    // The command may end before the lost signal is seen (lockctl and the command were
    // frozen together, say): a deadline passed meanwhile, or a release the server answers
    // with "not yours", still means the command ran without the lock at the end.
    let expired = guard.valid_until() <= Instant::now();
    if stopped_for_the_lock || expired {
        drop(guard);
        eprintln!("lockctl: the lock was lost while the command ran");
        return Ok(ExitCode::from(EXIT_LOCK));
    }
    match guard.release().await {
        Ok(ReleaseOutcome::Released) => Ok(exit_code(status)),
        Ok(ReleaseOutcome::AlreadyLost(reason)) => {
            eprintln!("lockctl: the lock was lost while the command ran ({reason})");
            Ok(ExitCode::from(EXIT_LOCK))
        }
        // The command ended within the lease: it ran under the lock to its end. Its
        // status stands, lest a completed job be run again.
        Err(err) => {
            eprintln!(
                "lockctl: warning: the release failed after the command ended ({err}); \
                 the lease frees the lock"
            );
            Ok(exit_code(status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_fits_in_the_lease() {
        let s = Duration::from_secs;
        assert_eq!(grace_within(None, s(30)), Ok(s(5)));
        assert_eq!(grace_within(None, s(3)), Ok(Duration::from_millis(1400)));
        assert_eq!(grace_within(Some(s(1)), s(3)), Ok(s(1)));
        let refused = grace_within(Some(s(5)), s(3)).expect_err("5 s cannot fit in 3 s");
        assert!(refused.contains("at most 1400ms"), "{refused}");
    }
}
