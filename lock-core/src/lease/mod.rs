//! The lease machinery shared by every backend: the renewal watchdog (one batched
//! renewal per interval per client and renewal group), the Held / Suspect / Lost state
//! machine, validity deadlines, the hold cap, reentrancy by owner id, and background
//! release.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::{sleep, sleep_until, timeout, timeout_at, Instant};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

use crate::backend::{
    AcquireRequest, Acquired, Amended, Backend, BackendRelease, RenewItem, RenewOutcome,
    SessionHealth, SessionStatus,
};
use crate::capabilities::Capabilities;
use crate::changes::ChangeFeed;
use crate::durations::check_duration;
use crate::error::{Error, Result};
use crate::guard::{AtomicInstant, HoldInfo, HoldObserver, HoldOps, LockGuard, StateSlot};
use crate::kind::{Amendment, HoldKind, SemaphoreResize};
use crate::lock::{check_wait, DistributedLock};
use crate::metrics::{ClientMetrics, HoldMetrics, Renewal, Series};
use crate::name::{check_prefix, LockName};
use crate::occupancy::{Occupancy, Participant};
use crate::options::{AcquireOptions, LockOptions, RenewalMode, Wait};
use crate::plumbing::{lock_unpoisoned, Background, Backoff};
use crate::state::{LockState, LostReason, ReleaseOutcome};
use crate::token::{OwnerId, OwnerToken};

/// The safety margin taken off every lease: 1 % of it plus 2 ms, for clock-rate drift
/// between client and server and for scheduling delay.
pub fn drift_margin(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// The validity deadline of a lease granted for a request sent at `requested_at`.
pub fn validity_deadline(requested_at: Instant, lease: Duration) -> Instant {
    requested_at + lease.saturating_sub(drift_margin(lease))
}

/// A release that keeps failing in a retryable way is given up after this many TTLs
/// (at least a minute), even while the hold's session lives.
const RELEASE_GIVE_UP: u32 = 10;

/// An inspection may take this many request timeouts (a ZooKeeper inspection is two
/// round trips, each under the request timeout).
const INSPECT_ROUNDS: u32 = 3;
/// A listing or a break may take this many request timeouts: a listing may walk many
/// pages or nodes, a break takes up to four requests (etcd) or starts over when the holder
/// changes under it (ZooKeeper). Each request has its own deadline in the backend; this
/// bounds the whole call.
const LONG_ROUNDS: u32 = 10;

/// First pause before a waiting acquire retries after a retryable error.
const RETRY_FIRST_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between such retries.
const RETRY_LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// Whether a waiting acquire failed because its session or lease ran out.
fn session_ran_out(err: &Error) -> bool {
    matches!(
        err,
        Error::Lost {
            reason: LostReason::SessionExpired,
            ..
        }
    )
}

/// Turns a [`Backend`] into a [`DistributedLock`], adding everything that is the same for
/// every backend: also the metrics of [`crate::metrics`] (labelled with
/// [`Capabilities::backend`]) and the `distlock.*` tracing spans (docs/metrics.md).
pub struct LeaseClient<B: Backend> {
    keeper: Arc<Keeper<B>>,
}

impl<B: Backend> LeaseClient<B> {
    /// Wraps `backend` with client-wide defaults `options`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `options` are out of range for the backend.
    pub fn new(backend: B, options: LockOptions) -> Result<Self> {
        options.validate()?;
        Self::with_valid_options(backend, options)
    }

    /// [`LeaseClient::new`] with `options` already checked by the driver.
    pub(crate) fn with_valid_options(backend: B, options: LockOptions) -> Result<Self> {
        let capabilities = backend.capabilities();
        check_ttl(&capabilities, options.ttl)?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let metrics = ClientMetrics::new(capabilities.backend, options.metrics_names);
        let keeper = Arc::new_cyclic(|me| Keeper {
            me: me.clone(),
            backend,
            metrics,
            options,
            capabilities,
            commands,
            receiver: Mutex::new(Some(receiver)),
            next_id: AtomicU64::new(1),
            base: Instant::now(),
            table: Mutex::new(Table::default()),
            gates: Mutex::new(HashMap::new()),
            renewal_ended: Notify::new(),
            background: Background::new(),
            closing: watch::Sender::new(false),
            acquiring: TaskTracker::new(),
            session: Mutex::new(None),
        });
        Ok(LeaseClient { keeper })
    }

    /// The backend, for backend-specific operations.
    pub fn backend(&self) -> &B {
        &self.keeper.backend
    }

    /// How many holds this client tracks right now (held, suspect, or lost but not yet
    /// released by their guard).
    pub fn tracked_holds(&self) -> usize {
        self.keeper.table().holds.len()
    }
}

impl<B: Backend> fmt::Debug for LeaseClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseClient")
            .field("backend", &self.keeper.backend)
            .field("options", &self.keeper.options)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> fmt::Display for LeaseClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.keeper.backend, f)
    }
}

#[async_trait]
impl<B: Backend> DistributedLock for LeaseClient<B> {
    async fn acquire(
        &self,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        self.keeper.acquire(name, options).await
    }

    fn capabilities(&self) -> Capabilities {
        self.keeper.capabilities.clone()
    }

    fn options(&self) -> &LockOptions {
        &self.keeper.options
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        let call = self.keeper.backend.inspect(name);
        let operation = || format!("inspect `{name}`");
        self.keeper
            .operate(operation, "inspect", INSPECT_ROUNDS, call)
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        check_prefix(prefix)?;
        let call = self.keeper.backend.list(prefix);
        let operation = || format!("list the locks under `{prefix}`");
        self.keeper
            .operate(operation, "list", LONG_ROUNDS, call)
            .await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        let call = self.keeper.backend.force_release(name);
        let operation = || format!("break `{name}`");
        self.keeper
            .operate(operation, "force release", LONG_ROUNDS, call)
            .await
    }

    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        HoldKind::permit(resize.from).check_count()?;
        HoldKind::permit(resize.to).check_count()?;
        if !self.keeper.capabilities.semaphore_resize {
            // The backend's own refusal says why its layout cannot.
            return self.keeper.backend.resize_semaphore(name, resize).await;
        }
        let call = self.keeper.backend.resize_semaphore(name, resize);
        let operation = || format!("resize the semaphore `{name}`");
        self.keeper
            .operate(operation, "resize", LONG_ROUNDS, call)
            .await
    }

    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let call = self.keeper.backend.changes(name);
        let operation = || format!("follow the changes of `{name}`");
        self.keeper
            .operate(operation, "subscribe to changes", 1, call)
            .await
    }

    async fn close(&self) -> Result<()> {
        self.keeper.close().await
    }
}

fn check_ttl(capabilities: &Capabilities, ttl: Duration) -> Result<()> {
    check_duration("ttl", ttl)?;
    if ttl < capabilities.min_ttl {
        return Err(Error::config(format!(
            "ttl {ttl:?} is below the {} minimum of {:?}",
            capabilities.backend, capabilities.min_ttl
        )));
    }
    Ok(())
}

mod acquire;
mod release;
mod renewal;
mod table;

use release::UnfinishedRelease;
pub(crate) use release::{release_patiently, ServerEnd};
use renewal::run_keeper;
use table::{Attention, Entry, HoldEnd, Table, Unref};

enum Command<B: Backend> {
    /// Re-plan the schedule.
    Wake,
    /// Release a hold whose last guard was dropped.
    Release(Arc<Keeper<B>>, Entry<B::Hold>),
    /// Answer once every command sent before has been handled.
    Flush(oneshot::Sender<()>),
}

type Gate = Arc<tokio::sync::Mutex<()>>;

struct Keeper<B: Backend> {
    me: Weak<Keeper<B>>,
    backend: B,
    metrics: ClientMetrics,
    options: LockOptions,
    capabilities: Capabilities,
    commands: mpsc::UnboundedSender<Command<B>>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Command<B>>>>,
    next_id: AtomicU64,
    base: Instant,
    table: Mutex<Table<B::Hold>>,
    /// Serializes reentrant acquisitions of one (name, owner).
    gates: Mutex<HashMap<(LockName, OwnerId), Gate>>,
    /// Notified whenever a renewal of some hold ends (see [`Entry::renewing`]).
    renewal_ended: Notify,
    /// The releases under way in the background, which closing waits for.
    background: Background,
    /// Set by [`DistributedLock::close`]: acquires are refused from then on, and those in
    /// flight end.
    closing: watch::Sender<bool>,
    /// The acquires in flight, which closing waits for.
    acquiring: TaskTracker,
    /// The backend's session status as it changes (before the keeper task applies it),
    /// once the task runs, for backends with sessions.
    session: Mutex<Option<watch::Receiver<SessionStatus>>>,
}

impl<B: Backend> fmt::Debug for Keeper<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Keeper<B> {
    fn table(&self) -> MutexGuard<'_, Table<B::Hold>> {
        lock_unpoisoned(&self.table)
    }

    fn arc(&self) -> Option<Arc<Self>> {
        self.me.upgrade()
    }

    fn wake(&self) {
        // Fails only when the keeper task has ended, when there is nothing to re-plan.
        let _ = self.commands.send(Command::Wake);
    }

    /// The span of a release of the hold `info` (`background`: by the client's task).
    fn release_span(&self, info: &HoldInfo, background: bool) -> Span {
        tracing::info_span!(
            "distlock.release",
            backend = self.capabilities.backend,
            lock = %info.name,
            fencing_token = info.fencing_token.0,
            background,
        )
    }

    /// Starts the keeper task on first use (we are inside the runtime then).
    fn ensure_task(&self) {
        let Some(receiver) = lock_unpoisoned(&self.receiver).take() else {
            return;
        };
        let session = self.backend.session();
        lock_unpoisoned(&self.session).clone_from(&session);
        tokio::spawn(run_keeper(self.me.clone(), receiver, session));
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl<B: Backend> HoldOps for Keeper<B> {
    fn extend<'a>(
        &'a self,
        hold: &'a HoldInfo,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Instant>> {
        Box::pin(async move {
            if self.is_closed() {
                return Err(self.closed_error(format_args!("extend `{}`", hold.name)));
            }
            self.extend_hold(hold.id, ttl).await
        })
    }

    fn release(&self, id: u64) -> BoxFuture<'_, Result<ReleaseOutcome>> {
        Box::pin(async move {
            let entry = match self.unref(id) {
                Unref::Last(entry) => entry,
                // Another guard of a reentrant hold still holds it.
                Unref::Shared(LockState::Lost(reason)) => {
                    return Ok(ReleaseOutcome::AlreadyLost(reason))
                }
                Unref::Shared(_) => return Ok(ReleaseOutcome::Released),
                Unref::Gone => return Ok(ReleaseOutcome::AlreadyLost(LostReason::Released)),
            };
            let Some(me) = self.arc() else {
                return Err(self.closed_error(format_args!("release `{}`", entry.info.name)));
            };
            // The first attempt runs here; if this future is dropped before it ends, or it
            // fails in a way worth retrying, the background task carries on.
            let prior = entry.info.state();
            entry.info.transition(LockState::Lost(LostReason::Released));
            let mut unfinished = UnfinishedRelease {
                keeper: me,
                entry: Some(entry),
            };
            let result = match unfinished.entry.as_ref() {
                Some(entry) => {
                    let span = self.release_span(&entry.info, false);
                    self.release_once(entry, prior).instrument(span).await
                }
                None => Ok(ReleaseOutcome::Released),
            };
            if !matches!(&result, Err(err) if err.is_retryable()) {
                unfinished.entry = None;
            }
            result
        })
    }

    fn amend<'a>(
        &'a self,
        hold: &'a HoldInfo,
        amendment: Amendment<'a>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if self.is_closed() {
                let operation = format!("{} `{}`", amendment.label(), hold.name);
                return Err(self.closed_error(operation));
            }
            self.amend_hold(hold.id, amendment).await
        })
    }

    fn release_in_background(&self, id: u64) {
        let Unref::Last(entry) = self.unref(id) else {
            return;
        };
        match self.arc() {
            Some(me) => {
                let _ = self.commands.send(Command::Release(me, entry));
            }
            None => {
                entry.info.transition(LockState::Lost(LostReason::Released));
            }
        }
    }
}
