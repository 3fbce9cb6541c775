//! lockctl: distributed locks from the shell, in the manner of `flock(1)`.
//!
//! ```text
//! lockctl --url redis://127.0.0.1:6379 run -n nightly-backup ./backup.sh
//! lockctl --url zk://127.0.0.1:2181/locks status nightly-backup
//! lockctl --url etcd://127.0.0.1:2379 break nightly-backup --force
//! lockctl --url postgres://locks@127.0.0.1:5432/app list -l
//! ```
//!
//! `run` holds a lock while a command runs and stops the command if the lock is lost
//! ([`run`] says how), and `elect` runs it while leader of an election, under the same
//! rules; `status`, `list`, `break`, `leader` and `observe` are what an operator needs
//! during an incident ([`operate`]); `migration check` tells whether a step of a move between
//! backends is safe (see docs/migration.md); `completions` and `man` print the shell
//! completion scripts and the man pages ([`docs`]). The exit codes are in [`EXIT_CODES`].

mod docs;
mod local;
mod migration;
mod operate;
mod run;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use distlock::raw::backend::HoldKind;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Exit code when the lock could not be had (by default) or was lost (EX_TEMPFAIL).
const EXIT_LOCK: u8 = 75;
/// Exit code of `status` for a free name, `break` for a name nobody held, and `migration
/// check` for a step that is not clear.
const EXIT_NO: u8 = 3;
/// Exit code of a usage error (as clap's own), and of `break` without `--force`.
const EXIT_USAGE: u8 = 2;

/// Every exit code, as `--help` prints it.
const EXIT_CODES: &str = "\
Exit codes:
  0        done: the command exited 0; status: held; break: a hold was removed;
           leader: someone leads; observe: stopped by a signal
  1        an error (bad URL, unreachable service, bad name; the message says which)
  2        a usage error (migration without a lock service, among others); break
           without --force
  3        status: nobody holds the name; break: nothing to break; leader: nobody
           leads; migration check: the step is not clear
  75       run, elect, hold, try: the lock (leadership) was not acquired (-n, -w),
           unless -E says otherwise; run, elect, hold: it was lost while held
  N        run, elect: the command's own exit status (also when the release failed
           after the command ended within the lease: lockctl warns on stderr)
  126/127  run, elect: the command could not be executed / was not found
  128+N    run, elect: the command died of signal N; run, elect, hold: lockctl got
           signal N while waiting for the lock";

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Distributed locks from the shell: run a command under a lock, see who holds \
             one, break a wedged one",
    long_about = "Distributed locks from the shell, in the manner of flock(1).\n\n\
        run holds a lock (or a permit of a semaphore, a side of a read-write lock) while a \
        command runs and stops the command before the lock can be lost; elect does the same \
        while leader of an election. status, list, break, leader and observe show and mend \
        locks during an incident; migration check says whether a step of a move between \
        backends is safe. Every command but completions and man uses the lock service that \
        --url or LOCK_URL names (redis://, zk://, etcd://, postgres://, file://, ...); \
        without one, a directory of this machine private to the user \
        (file://$XDG_RUNTIME_DIR/distlock, else /run/user/UID/distlock, else \
        /tmp/distlock-UID), so the same user's processes on this machine exclude each other \
        as with flock(1), and no other machine sees the lock.\n\n\
        `lockctl COMMAND --help` and the man page lockctl-COMMAND(1) describe each command.",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Lock service URL: redis://, rediss://, redis+sentinel://, rediss+sentinel://,
    /// redis+cluster://, rediss+cluster://, redlock://, zk://, zks://, etcd://, etcds://,
    /// postgres://, postgresql://, file:///DIR, memory://, dual:OLD|NEW (default:
    /// $LOCK_URL, else file://$XDG_RUNTIME_DIR/distlock, else /run/user/UID/distlock,
    /// else /tmp/distlock-UID: locks of this machine, shared by this user's processes;
    /// migration needs one given). memory:// is a lock of the lockctl process alone, taken
    /// only when given.
    #[arg(long, global = true, env = "LOCK_URL", hide_env = true)]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// How to acquire: flock's options.
#[derive(Debug, Args)]
struct AcquireArgs {
    /// Fail at once (exit 75, or -E) if the lock is held (flock -n).
    #[arg(short = 'n', long = "nonblock", conflicts_with = "timeout")]
    nonblock: bool,
    /// Give up after this long (exit 75, or -E): seconds as flock takes them (10, 0.5)
    /// or a duration (250ms, 30s, 2m); 0 is -n. Default: wait forever.
    #[arg(short = 'w', long = "timeout", value_parser = parse_seconds)]
    timeout: Option<Duration>,
    /// Exit code when the lock was not acquired (-n or -w).
    #[arg(short = 'E', long = "conflict-exit-code", default_value_t = EXIT_LOCK)]
    conflict_exit_code: u8,
    /// The lock's lease (time to live on the server; renewed at a third of it while
    /// held). Default: the URL's `ttl`, else 30s.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
}

/// What `run` takes of NAME: the lock (the default), one of N permits of the semaphore
/// NAME, or a side of the read-write lock NAME.
#[derive(Debug, Args)]
#[group(multiple = false)]
struct KindArgs {
    /// Take one of N permits of the semaphore NAME (every process using NAME must give
    /// the same N: another number fails with exit 1 and takes nothing).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// Take the read (shared) side of the read-write lock NAME, beside other readers
    /// (flock -s). Readers queued behind a waiting writer wait for it.
    #[arg(short = 's', long)]
    shared: bool,
    /// Take the write (exclusive) side of the read-write lock NAME (flock -x). Plain
    /// `run NAME` takes the lock NAME, not a read-write lock.
    #[arg(short = 'x', long)]
    exclusive: bool,
}

/// How many of the semaphore's permits `run --permits N` takes.
#[derive(Debug, Args)]
struct TakeArgs {
    /// With --permits N: take K of the N permits at once, as one hold (all or nothing, in
    /// its turn: later requests wait behind it). K above N exits 2 (usage); a backend that
    /// cannot take several permits in one hold (ZooKeeper) exits 1, saying so.
    #[arg(
        long,
        value_name = "K",
        requires = "permits",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    take: Option<u32>,
}

impl KindArgs {
    /// The kind of hold `run` takes; `take`: how many permits, with `--permits`.
    fn kind(&self, take: &TakeArgs) -> HoldKind {
        match (self.permits, self.shared, self.exclusive) {
            (Some(permits), _, _) => HoldKind::Permit {
                permits,
                count: take.take.unwrap_or(1),
            },
            (None, true, _) => HoldKind::Read,
            (None, false, true) => HoldKind::Write,
            (None, false, false) => HoldKind::Mutex,
        }
    }
}

/// The command `run` and `elect` run, and the name they take.
#[derive(Debug, Args)]
struct CommandArgs {
    /// Time the command gets to end after a forwarded signal or a lost lock (or
    /// leadership), before SIGKILL. At most half the TTL less 100ms (the command is
    /// stopped before the lease can end). Default: 5s, or that limit if lower.
    #[arg(long, value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Run this shell command line with `sh -c` (flock -c).
    #[arg(
        short = 'c',
        long = "command",
        value_name = "COMMAND LINE",
        conflicts_with = "command"
    )]
    shell: Option<String>,
    /// Lock (or election) name.
    name: String,
    /// The command and its arguments (after the name, or after `--`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "shell"
    )]
    command: Vec<std::ffi::OsString>,
}

impl CommandArgs {
    /// The program and its arguments: `sh -c LINE` for `-c`.
    fn argv(self) -> Vec<std::ffi::OsString> {
        match self.shell {
            Some(line) => vec!["sh".into(), "-c".into(), line.into()],
            None => self.command,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock; stop it if the lock is lost.
    ///
    /// The command gets DISTLOCK_LOCK_NAME and DISTLOCK_FENCING_TOKEN in its environment
    /// (pass the token to every resource it writes). SIGTERM, SIGINT and SIGHUP are
    /// forwarded to it; the lock is released only once it has ended, and lockctl exits as
    /// it did. A lost lock, or renewals so far behind that the lease could end: SIGTERM,
    /// then SIGKILL after --grace and before the lease ends; exit 75. If lockctl dies, the
    /// kernel kills the command. A failed release after the command ended within the lease
    /// is a warning: lockctl exits as the command did.
    ///
    /// With --permits N, --shared or --exclusive it takes one of N permits of the
    /// semaphore NAME or a side of the read-write lock NAME instead (Curator's
    /// InterProcessSemaphoreV2 and InterProcessReadWriteLock on ZooKeeper), with the
    /// same stop rules.
    #[command(after_help = EXIT_CODES)]
    Run {
        #[command(flatten)]
        acquire: AcquireArgs,
        #[command(flatten)]
        kind: KindArgs,
        #[command(flatten)]
        take: TakeArgs,
        #[command(flatten)]
        command: CommandArgs,
    },
    /// Run a command while leader of an election; stop it before another can lead.
    ///
    /// Campaigns for NAME with --value (candidates lead in the order they campaigned),
    /// then runs the command as `run` does, with the same stop rules: the command is
    /// stopped (SIGTERM, SIGKILL after --grace) before the leadership's lease can end, so
    /// no other leader can be elected while it runs. The command also gets
    /// DISTLOCK_LEADER_TERM, the term (a fencing token: pass it to every resource it
    /// writes). Compatible with Curator's LeaderLatch on ZooKeeper and `etcdctl elect` on
    /// etcd.
    #[command(after_help = EXIT_CODES)]
    Elect {
        #[command(flatten)]
        acquire: AcquireArgs,
        /// The value readers see while this candidate leads (its identity or address).
        /// Default: HOSTNAME:PID.
        #[arg(long)]
        value: Option<String>,
        /// Campaign again each time the command ends or leadership is lost (after a
        /// jittered pause, 100 ms doubling up to 10 s), and run the command again on each
        /// new term, until lockctl gets SIGTERM, SIGINT or SIGHUP (forwarded to a running
        /// command; lockctl then exits as it did). Waits to lead: no -n or -w.
        #[arg(long, conflicts_with_all = ["nonblock", "timeout"])]
        requeue: bool,
        #[command(flatten)]
        command: CommandArgs,
    },
    /// The current leader of an election: its value, term and since when; exit 3 if
    /// nobody leads.
    Leader {
        /// Election name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Follow an election: a line per change (a new leader, a proclaimed value, nobody
    /// leading), the current state first, until interrupted. Terms never go back.
    Observe {
        /// Election name.
        name: String,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Take a lock and hold it for a while (or until a signal), printing its state.
    #[command(after_help = EXIT_CODES)]
    Hold {
        #[command(flatten)]
        acquire: AcquireArgs,
        /// Lock name.
        name: String,
        /// How long to hold it.
        #[arg(long = "for", value_parser = parse_duration, default_value = "10s")]
        duration: Duration,
    },
    /// Try once: exit 0 if the lock was free (released at once), 75 (or -E) if held.
    Try {
        /// Lock name.
        name: String,
        /// Exit code when the lock is held.
        #[arg(short = 'E', long = "conflict-exit-code", default_value_t = EXIT_LOCK)]
        conflict_exit_code: u8,
    },
    /// Who holds a lock and who waits; exit 0 if held, 3 if free.
    ///
    /// The holder's owner token, fencing token, lease left, since when and session; the
    /// waiters in queue order; the bound every later fencing token exceeds. Each part is shown where the backend keeps it: since when only on ZooKeeper,
    /// waiters only where the backend queues them on the server.
    Status {
        /// Lock name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The names held right now under a prefix (all by default), sorted.
    List {
        /// Lock name prefix (e.g. `jobs/`).
        #[arg(default_value = "")]
        prefix: String,
        /// Also show each name's holder and how many wait (one look per name).
        #[arg(short = 'l', long)]
        long: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove the current hold of a lock on the server, whoever holds it (needs --force).
    ///
    /// For a holder that is wedged but still renewing. The next waiter gets the lock at
    /// once; the broken holder's guard turns lost (reason: broken) at its next renewal,
    /// a third of its TTL at most, so until then two processes may work: only fenced
    /// writes are safe. Without --force, shows the holder it would remove and exits 2.
    #[command(after_help = EXIT_CODES)]
    Break {
        /// Lock name.
        name: String,
        /// Really break it.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Moving a fleet between backends (the URL is a `dual:<old>|<new>` lock's).
    #[command(subcommand)]
    Migration(migration::Migration),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    ///
    /// Load it for this shell with `source <(lockctl completions bash)` (zsh: the same;
    /// fish: `lockctl completions fish | source`), or install it where the shell looks:
    /// /usr/share/bash-completion/completions/lockctl, a directory of $fpath as _lockctl,
    /// ~/.config/fish/completions/lockctl.fish (`make install-lockctl` does it). Needs no
    /// lock service.
    Completions(docs::CompletionsArgs),
    /// Print the man page, or write every page into a directory for a package.
    ///
    /// lockctl(1) lists the commands; each command has a page of its own, lockctl-run(1),
    /// lockctl-migration-check(1) and so on, written with --dir (`make install-lockctl`
    /// installs them in share/man/man1). Read it with `lockctl man | man -l -`. Needs no
    /// lock service.
    Man(docs::ManArgs),
}

/// Seconds as flock reads them (`10`, `0.5`), or a duration with a unit (`250ms`, `2m`).
fn parse_seconds(text: &str) -> Result<Duration, String> {
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return parse_duration(&format!("{text}s"));
    }
    parse_duration(text)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::raw::durations::parse_duration("duration", text).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    if let Some(code) = run::trampoline_if_asked() {
        return code;
    }
    let cli = Cli::parse();
    // `block_on` runs `dispatch` on this, the main thread: a command's parent-death
    // signal is tied to the thread that starts it (see `run`).
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Into::into)
        .and_then(|runtime| runtime.block_on(dispatch(cli)));
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lockctl: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `work` with the client `locks`, then closes the client whatever the outcome (done,
/// failed, cut short by a signal): what it held or queued goes before lockctl exits, rather
/// than when its lease or session times out. A failed close is a warning.
async fn closing<T>(
    locks: &dyn distlock::DistributedLock,
    work: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    let result = work.await;
    if let Err(err) = locks.close().await {
        eprintln!("lockctl: warning: closing the lock client: {err}");
    }
    result
}

/// The lock service URL, for the commands that take or look at locks: the one given, else
/// the machine-local directory ([`local`]), which every process of this user on this
/// machine shares. `None` (after saying why) when that directory cannot be used: the caller
/// exits with a usage error.
fn lock_url(url: Option<String>) -> Option<String> {
    match url {
        Some(url) => Some(url),
        None => match local::default_url() {
            Ok(url) => Some(url),
            Err(why) => {
                eprintln!("lockctl: no lock service given, and the machine-local one: {why}");
                None
            }
        },
    }
}

/// The lock service URL, for commands that look at other processes' locks: as
/// [`lock_url`], but not `memory://`, which sees this process's locks alone (it would
/// answer "free" and "nothing to break" with confidence). `None` (after saying so)
/// otherwise: the caller exits with a usage error.
fn shared_url(url: Option<String>) -> Option<String> {
    let url = lock_url(url)?;
    if url.trim().to_ascii_lowercase().starts_with("memory:") {
        eprintln!(
            "lockctl: memory:// only holds this process's locks: give the URL of a shared \
             lock service"
        );
        return None;
    }
    Some(url)
}

/// The lock service URL of `migration`, which compares two backends: it must be given.
fn migration_url(url: Option<String>) -> Option<String> {
    if url.is_none() {
        eprintln!(
            "lockctl: no lock service: give --url or set LOCK_URL to the dual:OLD|NEW URL \
             of the migration"
        );
        return None;
    }
    shared_url(url)
}

async fn dispatch(cli: Cli) -> Result<ExitCode, BoxError> {
    let url = cli.url;
    let usage = || Ok(ExitCode::from(EXIT_USAGE));
    match cli.command {
        Command::Migration(command) => match migration_url(url) {
            Some(url) => migration::run(&url, command).await,
            None => usage(),
        },
        Command::Run {
            acquire,
            kind,
            take,
            command,
        } => {
            let Some(url) = lock_url(url) else {
                return Ok(ExitCode::from(EXIT_USAGE));
            };
            let kind = kind.kind(&take);
            if let Err(err) = kind.check_count() {
                eprintln!("lockctl: {err}");
                return usage();
            }
            let (name, grace) = (command.name.clone(), command.grace);
            let argv = command.argv();
            run::run(&url, &acquire, &name, &argv, grace, kind, run::Terms::Once).await
        }
        Command::Elect {
            acquire,
            value,
            requeue,
            command,
        } => {
            let Some(url) = lock_url(url) else {
                return Ok(ExitCode::from(EXIT_USAGE));
            };
            let (name, grace) = (command.name.clone(), command.grace);
            let value = value.unwrap_or_else(run::default_candidate_value);
            let kind = HoldKind::Candidate {
                value: value.into_bytes(),
            };
            let terms = if requeue {
                run::Terms::Requeue
            } else {
                run::Terms::Once
            };
            run::run(&url, &acquire, &name, &command.argv(), grace, kind, terms).await
        }
        Command::Leader { name, json } => match shared_url(url) {
            Some(url) => operate::leader(&url, &name, json).await,
            None => usage(),
        },
        Command::Observe { name, json } => match shared_url(url) {
            Some(url) => operate::observe(&url, &name, json).await,
            None => usage(),
        },
        Command::Hold {
            acquire,
            name,
            duration,
        } => match lock_url(url) {
            Some(url) => run::hold(&url, &acquire, &name, duration).await,
            None => Ok(ExitCode::from(EXIT_USAGE)),
        },
        Command::Try {
            name,
            conflict_exit_code,
        } => match lock_url(url) {
            Some(url) => run::try_once(&url, &name, conflict_exit_code).await,
            None => Ok(ExitCode::from(EXIT_USAGE)),
        },
        Command::Status { name, json } => match shared_url(url) {
            Some(url) => operate::status(&url, &name, json).await,
            None => usage(),
        },
        Command::List { prefix, long, json } => match shared_url(url) {
            Some(url) => operate::list(&url, &prefix, long, json).await,
            None => usage(),
        },
        Command::Break { name, force, json } => match shared_url(url) {
            Some(url) => operate::break_lock(&url, &name, force, json).await,
            None => usage(),
        },
        Command::Completions(args) => docs::completions(&args),
        Command::Man(args) => docs::man(&args),
    }
}
