//! The protocol half of a `file://` client: attempts off the runtime, waits woken by the
//! directory's inotify watch, renewals that check the hold was not broken.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lock_core::raw::backend::{
    AcquireRequest, Acquired, Amended, Amendment, Backend, BackendRelease, ChangeFeed, LeaseClient,
    RenewItem, RenewOutcome,
};
use lock_core::raw::driver::Connect;
use lock_core::raw::plumbing::lock_unpoisoned;
use lock_core::raw::url::LockUrl;
use lock_core::{
    Capabilities, Error, FencingSource, FencingToken, LockName, LockOptions, Occupancy,
    Participant, Result,
};
use nix::fcntl::FlockArg;
use tokio::time::{sleep, Instant};

use crate::config::FileConfig;
use crate::error::{from_errno, from_io, task_failed, BACKEND};
use crate::hold::{attempt, Ask, Attempt, FileHold, OpenFiles, WaitRecord};
use crate::layout::{stem_of, Layout, RECORDS};
use crate::turnstile::{Answer, Class, Turn, Turnstile};
use crate::wakeup::{next_for, Interest, Wakeup};
use crate::FileLock;

/// What a `file://` client offers: no FIFO order (the kernel grants `flock`s in no
/// order), holds that last as long as their process rather than a lease, one permit per
/// semaphore hold, no resizing, no upgradeable readers.
pub const CAPABILITIES: Capabilities = Capabilities::new(BACKEND)
    .fair(false)
    .lease(false)
    .push_wakeup(true)
    .fencing(FencingSource::Counter)
    .fence_at_least(true)
    .election(true)
    .semaphore(true)
    .rwlock(true);

/// How many times, [`UNRECORDED_PAUSE`] apart, an inspection or a break looks again at a
/// lock file held without a record: a distlock holder writes its record a moment after
/// taking its flock (the fencing counter is synced between); a process outside distlock
/// (`flock(1)`) never does.
const UNRECORDED_LOOKS: u32 = 10;
const UNRECORDED_PAUSE: Duration = Duration::from_millis(10);

/// The protocol half of a `file://` client.
pub struct FileBackend {
    pub(crate) layout: Arc<Layout>,
    recheck: Duration,
    wakeup: Mutex<Option<Arc<Wakeup>>>,
}

impl FileBackend {
    /// A client of `config`'s directory.
    ///
    /// # Errors
    /// As [`LeaseClient::connect`].
    pub async fn client(config: FileConfig) -> Result<FileLock> {
        LeaseClient::connect(config).await
    }

    /// Runs blocking file-system work off the runtime.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Arc<Layout>) -> T + Send + 'static,
    ) -> Result<T> {
        let layout = Arc::clone(&self.layout);
        tokio::task::spawn_blocking(move || work(&layout))
            .await
            .map_err(task_failed)
    }

    fn wakeup_now(&self) -> Result<Arc<Wakeup>> {
        lock_unpoisoned(&self.wakeup)
            .clone()
            .ok_or_else(|| Error::closed(BACKEND, "waiting"))
    }
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("dir", &self.layout.dir)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file://{}", self.layout.dir.display())
    }
}

/// Makes `config.dir` if it is missing (not its parents) and checks it is a directory
/// this process may write.
fn prepare(config: &FileConfig) -> Result<()> {
    let what = "opening the lock directory";
    match std::fs::create_dir(&config.dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::InvalidConfig {
                message: format!("{what}: its parent directory does not exist"),
                source: Some(Box::new(err)),
            })
        }
        Err(err) => return Err(from_io(what, err)),
    }
    let meta = std::fs::metadata(&config.dir).map_err(|e| from_io(what, e))?;
    if !meta.is_dir() {
        return Err(Error::config(format!(
            "{what}: the path is not a directory"
        )));
    }
    nix::unistd::access(
        &config.dir,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .map_err(|e| from_errno(what, e))?;
    // The records' directory, as open to others as the lock directory (a shared
    // `/run/lock` is world-writable and sticky, so is this).
    let records = config.dir.join(RECORDS);
    match std::fs::create_dir(&records) {
        Ok(()) => {
            let mode = std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777);
            std::fs::set_permissions(&records, mode).map_err(|e| from_io(what, e))
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(from_io(what, err)),
    }
}

#[async_trait]
impl Connect for FileBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = FileConfig;

    fn config_from_url(url: &LockUrl) -> Result<FileConfig> {
        FileConfig::from_url(url)
    }

    fn lock_options(config: &FileConfig) -> &LockOptions {
        &config.options
    }

    fn validate(config: &FileConfig) -> Result<()> {
        config.validate()
    }

    async fn open(config: FileConfig) -> Result<Self> {
        let (config, wakeup) = tokio::task::spawn_blocking(move || {
            prepare(&config)?;
            let canonical = std::fs::canonicalize(&config.dir)
                .map_err(|e| from_io("opening the lock directory", e))?;
            Ok::<_, Error>((config, Wakeup::of(&canonical)?))
        })
        .await
        .map_err(task_failed)??;
        Ok(FileBackend {
            layout: Arc::new(Layout { dir: config.dir }),
            recheck: config.options.recheck,
            wakeup: Mutex::new(Some(wakeup)),
        })
    }
}

#[async_trait]
impl Backend for FileBackend {
    type Hold = FileHold;

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<FileHold>>> {
        request.kind.check_count()?;
        let ask = Ask {
            name: request.name.clone(),
            stem: stem_of(request.name)?,
            token: request.token.as_str().to_owned(),
            kind: request.kind.clone(),
            floor: request.fence_at_least.map(FencingToken::get),
        };
        let wakeup = self.wakeup_now()?;
        let mut changes = wakeup.subscribe();
        let class = Class::of(&ask.kind);
        // Only a reader's chances change with the records (a writer's wait ending).
        let interest = if class == Class::Shared {
            Interest::ClosesAndRecords
        } else {
            Interest::Closes
        };
        let mut files = OpenFiles::default();
        let mut waiting: Option<WaitRecord> = None;
        let mut turnstile: Option<Arc<Turnstile>> = None;
        let mut turn: Option<Turn> = None;
        loop {
            let attempted_at = Instant::now();
            let first = waiting.is_none();
            let (tried, kept) = self
                .blocking({
                    let ask = ask.clone();
                    move |layout| {
                        let tried = attempt(layout, &ask, &mut files, first);
                        (tried, files)
                    }
                })
                .await?;
            files = kept;
            tracing::trace!(
                target: "lock_file::attempt",
                stem = %ask.stem,
                taken = matches!(tried, Ok(Attempt::Granted(_))),
                "tried a file lock"
            );
            let tried = tried?;
            if let Some(turn) = turn.as_mut() {
                turn.answers(match &tried {
                    Attempt::Granted(_) if class == Class::Exclusive => Answer::HeldExclusively,
                    Attempt::Refused => Answer::Refused,
                    Attempt::Granted(_) | Attempt::GaveWay => Answer::Nothing,
                });
            }
            // Hands the turn on.
            turn = None;
            if let Attempt::Granted(hold) = tried {
                drop(waiting);
                tokio::spawn(give_back_when_broken(&hold, changes));
                return Ok(Some(Acquired {
                    fencing_token: FencingToken(hold.fence),
                    hold,
                    requested_at: attempted_at,
                    lease: request.ttl,
                    session: 0,
                }));
            }
            if !request.wait {
                return Ok(None);
            }
            if waiting.is_none() {
                let ask = ask.clone();
                waiting = Some(
                    self.blocking(move |layout| WaitRecord::write(layout, &ask))
                        .await??,
                );
            }
            let turnstile = turnstile.get_or_insert_with(|| wakeup.turnstile(&ask.stem));
            while turn.is_none() {
                let woke = tokio::select! {
                    tick = next_for(&mut changes, &ask.stem, interest) => {
                        tick.unwrap_or_else(|| wakeup.now())
                    }
                    () = sleep(self.recheck) => wakeup.tick(),
                };
                turn = turnstile.turn(class, woke).await;
            }
        }
    }

    /// A hold lasts as long as its `flock`s, which only its own process can give back:
    /// renewing checks that no operator broke it (its record is still in place). A broken
    /// hold gives its `flock`s back at once.
    async fn renew(&self, items: &[RenewItem<'_, FileHold>]) -> Result<Vec<RenewOutcome>> {
        Ok(items
            .iter()
            .map(|item| match item.hold.still_ours() {
                Ok(()) => RenewOutcome::Renewed { lease: item.ttl },
                Err(reason) => {
                    item.hold.give_back();
                    RenewOutcome::Lost(reason)
                }
            })
            .collect())
    }

    async fn release(&self, hold: &FileHold) -> Result<BackendRelease> {
        if let Err(reason) = hold.still_ours() {
            hold.give_back();
            return Ok(BackendRelease::NotOwner(reason));
        }
        Ok(if hold.give_back() {
            BackendRelease::Released
        } else {
            BackendRelease::NotOwner(lock_core::LostReason::Broken)
        })
    }

    async fn amend(&self, hold: &FileHold, amendment: Amendment<'_>) -> Result<Amended> {
        if let Err(reason) = hold.still_ours() {
            return Ok(Amended::NotOwner(reason));
        }
        match amendment {
            Amendment::Proclaim(value) => {
                let value = value.to_vec();
                hold.rewrite(|record| {
                    record.kind = lock_core::raw::backend::HoldKind::Candidate { value };
                })?;
            }
            Amendment::Downgrade => {
                // Linux converts an flock from exclusive to shared under one kernel lock:
                // no moment in which another process could take it.
                for lock in lock_unpoisoned(&hold.locks).iter() {
                    lock.relock(FlockArg::LockSharedNonblock)
                        .map_err(|e| from_errno("downgrading a file lock", e))?;
                }
                hold.rewrite(|record| record.kind = lock_core::raw::backend::HoldKind::Read)?;
            }
            other => return Err(other.unsupported(BACKEND)),
        }
        Ok(Amended::Done)
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        let stem = stem_of(name)?;
        let mut looks = 0;
        loop {
            let stem = stem.clone();
            let occupancy = self
                .blocking(move |layout| crate::operator::inspect(layout, &stem))
                .await??;
            looks += 1;
            if !crate::operator::unrecorded(&occupancy) || looks >= UNRECORDED_LOOKS {
                return Ok(occupancy);
            }
            sleep(UNRECORDED_PAUSE).await;
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        let prefix = prefix.to_owned();
        self.blocking(move |layout| crate::operator::list(layout, &prefix))
            .await?
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        let stem = stem_of(name)?;
        let mut looks = 0;
        loop {
            let stem = stem.clone();
            let broken = self
                .blocking(move |layout| crate::operator::force_release(layout, &stem))
                .await?;
            looks += 1;
            match broken {
                Err(err)
                    if err.kind() == lock_core::ErrorKind::Unsupported
                        && looks < UNRECORDED_LOOKS =>
                {
                    sleep(UNRECORDED_PAUSE).await;
                }
                done => return done,
            }
        }
    }

    /// Fires when a lock or slot file of `name` is closed or one of its records is
    /// removed or replaced (a proclaim).
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let stem = stem_of(name)?;
        let changes = self.wakeup_now()?.subscribe();
        let stream = futures::stream::unfold((changes, stem), |(mut changes, stem)| async move {
            next_for(&mut changes, &stem, Interest::ClosesAndRecords).await;
            Some(((), (changes, stem)))
        });
        Ok(ChangeFeed::from_stream(stream.boxed()))
    }

    /// Lets go of the directory watch (its thread ends with the process's last client of
    /// the directory); the lease client has given every hold back by now.
    async fn close(&self) -> Result<()> {
        lock_unpoisoned(&self.wakeup).take();
        Ok(())
    }
}

/// Watches the record of `hold` and gives its `flock`s back the moment an operator's
/// `force_release` removes it, as a server-side break frees a name at once: the waiters
/// are granted now, not at the holder's next renewal (a third of a TTL away), which then
/// reports the hold `Broken`. Ends when the hold ends.
fn give_back_when_broken(
    hold: &FileHold,
    mut changes: tokio::sync::broadcast::Receiver<crate::wakeup::Change>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let locks = Arc::downgrade(&hold.locks);
    let record = hold.record_path();
    let stem = hold.stem.clone();
    async move {
        loop {
            next_for(&mut changes, &stem, Interest::ClosesAndRecords).await;
            let Some(locks) = locks.upgrade() else {
                return;
            };
            let mut held = lock_unpoisoned(&locks);
            if held.is_empty() {
                return;
            }
            // A proclaim renames a new record into place: the path is there again.
            if !record.exists() {
                held.clear();
                return;
            }
        }
    }
}
