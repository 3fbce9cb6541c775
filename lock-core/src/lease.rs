//! The lease machinery shared by every backend: the renewal watchdog (one batched
//! renewal per interval per client), the Held / Suspect / Lost state machine, validity
//! deadlines, the hold cap, reentrancy by owner id, and background release.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, timeout_at, Instant};

use crate::backend::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionHealth,
    SessionStatus,
};
use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::guard::{
    AtomicInstant, HoldInfo, HoldOps, LockGuard, LockState, LostReason, ReleaseOutcome,
};
use crate::lock::{check_wait, DistributedLock};
use crate::name::LockName;
use crate::options::{check_duration, AcquireOptions, LockOptions, RenewalMode, Wait};
use crate::raw::{lock_unpoisoned, Backoff};
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
/// every backend.
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
        let capabilities = backend.capabilities();
        check_ttl(&capabilities, options.ttl)?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let keeper = Arc::new_cyclic(|me| Keeper {
            me: me.clone(),
            backend,
            options,
            capabilities,
            commands,
            receiver: Mutex::new(Some(receiver)),
            next_id: AtomicU64::new(1),
            base: Instant::now(),
            table: Mutex::new(Table::default()),
            gates: Mutex::new(HashMap::new()),
            renewal_ended: Notify::new(),
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

/// One tracked hold.
struct Entry<H> {
    info: Arc<HoldInfo>,
    hold: Arc<H>,
    ttl: Duration,
    renewal: RenewalMode,
    cap_at: Option<Instant>,
    session: u64,
    owner: Option<OwnerId>,
    /// Guards sharing this hold (reentrancy).
    refs: usize,
    /// When the watchdog renews next.
    renew_due: Instant,
    /// The last renewal attempt failed.
    renew_failing: bool,
    /// The server copy was already released (hold cap).
    server_released: bool,
    /// A renewal of this hold (batched or an extend) is in flight. Renewals of one hold
    /// are serialized, so the reply handled last is the one the server applied last.
    renewing: bool,
}

impl<H> Entry<H> {
    /// The TTL to ask for now: the hold's TTL, cut at the hold cap.
    fn effective_ttl(&self, wanted: Duration, now: Instant) -> Option<Duration> {
        match self.cap_at {
            Some(cap) if cap <= now => None,
            Some(cap) => Some(wanted.min(cap - now)),
            None => Some(wanted),
        }
    }

    /// Records a successful renewal sent at `requested_at` that granted `lease`; the next
    /// one is planned from that lease (an extension may grant another than the TTL).
    fn renewed(&mut self, requested_at: Instant, lease: Duration, session_suspended: bool) {
        self.info
            .valid_until
            .store(validity_deadline(requested_at, lease));
        self.renew_due = requested_at + lease / 3;
        self.renew_failing = false;
        self.refresh_state(session_suspended);
    }

    /// Records a renewal that could not be done: Suspect, and retried soon.
    fn renewal_failed(&mut self, session_suspended: bool) {
        self.renew_failing = true;
        self.renew_due = Instant::now() + (self.ttl / 10).max(Duration::from_millis(10));
        self.refresh_state(session_suspended);
    }

    fn refresh_state(&self, session_suspended: bool) {
        let next = if self.renew_failing || session_suspended {
            LockState::Suspect
        } else {
            LockState::Held
        };
        self.info.transition(next);
    }

    fn lost_error(&self) -> Option<Error> {
        match self.info.state() {
            LockState::Lost(reason) => Some(Error::Lost {
                name: self.info.name.to_string(),
                reason,
            }),
            _ => None,
        }
    }
}

/// When a hold ends on the server by itself.
#[derive(Debug, Clone, Copy)]
struct HoldEnd {
    session: u64,
    /// The end of its last lease on the server, with the drift margin on both sides.
    lease_end: Instant,
    ttl: Duration,
}

impl HoldEnd {
    fn of<H>(entry: &Entry<H>) -> Self {
        HoldEnd {
            session: entry.session,
            lease_end: entry.info.valid_until.load() + drift_margin(entry.ttl) * 2,
            ttl: entry.ttl,
        }
    }
}

/// What dropping one guard's reference to a hold left.
enum Unref<H> {
    /// It was the last reference: the entry is the caller's to release.
    Last(Entry<H>),
    /// Other guards of the reentrant hold remain; the hold's state.
    Shared(LockState),
    /// The hold is no longer tracked.
    Gone,
}

struct Table<H> {
    holds: HashMap<u64, Entry<H>>,
    reentrant: HashMap<(LockName, OwnerId), u64>,
    session_suspended: bool,
    /// The last session status, for backends with sessions.
    session: Option<SessionStatus>,
    renewal: Option<JoinHandle<()>>,
}

impl<H> Default for Table<H> {
    fn default() -> Self {
        Table {
            holds: HashMap::new(),
            reentrant: HashMap::new(),
            session_suspended: false,
            session: None,
            renewal: None,
        }
    }
}

enum Command<B: Backend> {
    /// Re-plan the schedule.
    Wake,
    /// Release a hold whose last guard was dropped.
    Release(Arc<Keeper<B>>, Entry<B::Hold>),
}

type Gate = Arc<tokio::sync::Mutex<()>>;

struct Keeper<B: Backend> {
    me: Weak<Keeper<B>>,
    backend: B,
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

    /// Starts the keeper task on first use (we are inside the runtime then).
    fn ensure_task(&self) {
        let Some(receiver) = lock_unpoisoned(&self.receiver).take() else {
            return;
        };
        let session = self.backend.session();
        tokio::spawn(run_keeper(self.me.clone(), receiver, session));
    }

    async fn acquire(
        &self,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        let ttl = options.ttl.unwrap_or(self.options.ttl);
        check_ttl(&self.capabilities, ttl)?;
        if !self.capabilities.per_lock_ttl && ttl != self.options.ttl {
            return Err(Error::Unsupported {
                backend: self.capabilities.backend,
                operation: format!(
                    "a per-lock ttl ({ttl:?}); this backend uses one session-wide lease of {:?}",
                    self.options.ttl
                ),
            });
        }
        if let Some(cap) = options.max_hold {
            check_duration("max_hold", cap)?;
        }
        check_wait(options.wait)?;
        self.ensure_task();

        let Some(owner) = &options.owner else {
            return self.acquire_new(name, options, ttl).await;
        };
        let key = (name.clone(), owner.clone());
        let gate = Arc::clone(lock_unpoisoned(&self.gates).entry(key.clone()).or_default());
        let result = {
            let _serialized = gate.lock().await;
            match self.reenter(&key) {
                Some(guard) => Ok(Some(guard)),
                None => self.acquire_new(name, options, ttl).await,
            }
        };
        let mut gates = lock_unpoisoned(&self.gates);
        if gates.get(&key).is_some_and(|g| Arc::strong_count(g) == 2) {
            gates.remove(&key);
        }
        result
    }

    /// A new guard on an existing hold of the same (name, owner), if any.
    fn reenter(&self, key: &(LockName, OwnerId)) -> Option<LockGuard> {
        let mut table = self.table();
        let id = *table.reentrant.get(key)?;
        let entry = table.holds.get_mut(&id)?;
        if entry.info.state().is_lost() {
            return None;
        }
        entry.refs += 1;
        let info = Arc::clone(&entry.info);
        drop(table);
        Some(LockGuard::new(info, self.arc()?))
    }

    async fn acquire_new(
        &self,
        name: &LockName,
        options: &AcquireOptions,
        ttl: Duration,
    ) -> Result<Option<LockGuard>> {
        let wait = !matches!(options.wait, Wait::Try);
        let started = Instant::now();
        let deadline = match options.wait {
            Wait::Timeout(limit) => Some(started + limit),
            Wait::Try | Wait::Forever => None,
        };
        let timed_out = || Error::Timeout {
            name: name.to_string(),
            waited: started.elapsed(),
        };
        let mut backoff = Backoff::new(RETRY_FIRST_PAUSE, RETRY_LONGEST_PAUSE);
        let (token, acquired) = loop {
            // Every attempt has its own owner token: the cleanup of a failed attempt (which
            // may still be running on the server) can never touch what a retry takes.
            let token = OwnerToken::generate();
            let request = AcquireRequest {
                name,
                token: &token,
                ttl,
                wait,
            };
            let attempt = self.backend.acquire(request);
            let result = match deadline {
                Some(deadline) => timeout_at(deadline, attempt)
                    .await
                    .map_err(|_| timed_out())?,
                None => attempt.await,
            };
            // A waiting acquire rides out transient failures (a reset connection, a
            // moment without quorum) until its deadline, then reports the last one. Its
            // queue entry lost with an expired session or lease is no reason to stop
            // either: nothing was granted, so the next attempt queues with a new one.
            // (A queue entry removed behind its back, by an operator, does stop it.)
            match result {
                Err(err) if wait && (err.is_retryable() || session_ran_out(&err)) => {
                    let resume = Instant::now() + backoff.next_pause();
                    if deadline.is_some_and(|deadline| resume >= deadline) {
                        return Err(err);
                    }
                    tracing::debug!(lock = %name, error = %err, "acquire failed; retrying");
                    sleep_until(resume).await;
                }
                result => break (token, result?),
            }
        };
        let Some(acquired) = acquired else {
            return Ok(None);
        };
        self.register(name, token, ttl, options, acquired).map(Some)
    }

    /// Starts tracking a fresh hold. Synchronous, so an acquire cancelled after the
    /// backend granted the lock cannot leave it untracked.
    fn register(
        &self,
        name: &LockName,
        token: OwnerToken,
        ttl: Duration,
        options: &AcquireOptions,
        acquired: Acquired<B::Hold>,
    ) -> Result<LockGuard> {
        let now = Instant::now();
        let valid_until = validity_deadline(acquired.requested_at, acquired.lease);
        let renewal = options.renewal.unwrap_or(self.options.renewal);
        let cap = options.max_hold.or(self.options.max_hold);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (state, _) = watch::channel(LockState::Held);
        let info = Arc::new(HoldInfo {
            id,
            name: name.clone(),
            token,
            fencing_token: acquired.fencing_token,
            acquired_at: acquired.requested_at,
            valid_until: Arc::new(AtomicInstant::new(self.base, valid_until)),
            state,
        });
        let entry = Entry {
            info: Arc::clone(&info),
            hold: Arc::new(acquired.hold),
            ttl,
            renewal,
            cap_at: cap.map(|cap| acquired.requested_at + cap),
            session: acquired.session,
            owner: options.owner.clone(),
            refs: 1,
            renew_due: acquired.requested_at + ttl / 3,
            renew_failing: false,
            server_released: false,
            renewing: false,
        };
        let Some(me) = self.arc() else {
            return Err(Error::config("lock client is shutting down"));
        };
        if valid_until <= now {
            let _ = self.commands.send(Command::Release(Arc::clone(&me), entry));
            return Err(Error::Unavailable {
                backend: self.capabilities.backend,
                message: format!("the lease on `{name}` ran out before the grant arrived"),
                source: None,
            });
        }
        let mut table = self.table();
        if let Some(owner) = &entry.owner {
            table.reentrant.insert((name.clone(), owner.clone()), id);
        }
        entry.refresh_state(table.session_suspended);
        table.holds.insert(id, entry);
        drop(table);
        self.wake();
        Ok(LockGuard::new(info, me))
    }

    /// Removes a guard's reference; returns the entry when it was the last one.
    fn unref(&self, id: u64) -> Unref<B::Hold> {
        let mut table = self.table();
        let Some(entry) = table.holds.get_mut(&id) else {
            return Unref::Gone;
        };
        entry.refs -= 1;
        if entry.refs > 0 {
            return Unref::Shared(entry.info.state());
        }
        let Some(entry) = table.holds.remove(&id) else {
            return Unref::Gone;
        };
        if let Some(owner) = &entry.owner {
            let key = (entry.info.name.clone(), owner.clone());
            if table.reentrant.get(&key) == Some(&id) {
                table.reentrant.remove(&key);
            }
        }
        Unref::Last(entry)
    }

    /// Releases an entry on the server in the background and ends its state.
    async fn finish_release(&self, entry: Entry<B::Hold>) {
        entry.info.transition(LockState::Lost(LostReason::Released));
        if entry.server_released {
            return;
        }
        if let Err(err) = self.retry_release(HoldEnd::of(&entry), &entry.hold).await {
            tracing::warn!(lock = %entry.info.name, error = %err, "release failed; the server-side lease ends the hold");
        }
    }

    /// Releases `hold`, again with backoff while the release fails in a retryable way and
    /// the hold may still exist on the server: backends whose holds live with a session
    /// (ZooKeeper, etcd) keep an unreleased hold for as long as the session lives, so the
    /// server-side TTL is no fallback there. Gives up when the
    /// session ended, when the last lease ran out (backends without sessions), or after
    /// [`RELEASE_GIVE_UP`] TTLs, whichever comes first.
    async fn retry_release(&self, end: HoldEnd, hold: &B::Hold) -> Result<BackendRelease> {
        const FIRST_PAUSE: Duration = Duration::from_millis(50);
        const LONGEST_PAUSE: Duration = Duration::from_secs(2);
        let give_up = Instant::now() + (end.ttl * RELEASE_GIVE_UP).max(Duration::from_secs(60));
        let mut backoff = Backoff::new(FIRST_PAUSE, LONGEST_PAUSE);
        loop {
            let result = self.release_hold(hold).await;
            let pause = backoff.next_pause();
            let retry = matches!(&result, Err(err) if err.is_retryable())
                && Instant::now() + pause < give_up
                && !self.ended_on_server(&end);
            if !retry {
                return result;
            }
            sleep(pause).await;
        }
    }

    /// Whether a hold can no longer exist on the server: its session ended, or (without
    /// sessions) its last lease ran out.
    fn ended_on_server(&self, end: &HoldEnd) -> bool {
        match self.table().session {
            Some(status) => {
                status.epoch > end.session
                    || (status.epoch == end.session && status.health == SessionHealth::Expired)
            }
            None => Instant::now() >= end.lease_end,
        }
    }

    /// One release request for `entry`, whose state before the release was `prior`.
    async fn release_once(
        &self,
        entry: &Entry<B::Hold>,
        prior: LockState,
    ) -> Result<ReleaseOutcome> {
        if entry.server_released {
            return Ok(ReleaseOutcome::AlreadyLost(match prior {
                LockState::Lost(reason) => reason,
                _ => LostReason::HoldCapReached,
            }));
        }
        match (prior, self.release_hold(&entry.hold).await) {
            (_, Err(err)) => Err(err),
            (LockState::Lost(reason), _) => Ok(ReleaseOutcome::AlreadyLost(reason)),
            (_, Ok(BackendRelease::Released)) => Ok(ReleaseOutcome::Released),
            (_, Ok(BackendRelease::NotOwner(reason))) => Ok(ReleaseOutcome::AlreadyLost(reason)),
        }
    }

    /// One release request for `hold`, within the request deadline.
    async fn release_hold(&self, hold: &B::Hold) -> Result<BackendRelease> {
        timeout(self.options.request_timeout, self.backend.release(hold))
            .await
            .unwrap_or_else(|_| Err(self.deadline_error("release")))
    }

    fn deadline_error(&self, what: &str) -> Error {
        Error::no_answer(
            self.capabilities.backend,
            what,
            self.options.request_timeout,
        )
    }

    async fn extend_hold(&self, id: u64, ttl: Option<Duration>) -> Result<Instant> {
        // Wait for a renewal of this hold already in flight: the server must apply ours
        // after it, or the deadline we record could be one the server no longer keeps.
        let waited_until = Instant::now() + self.options.request_timeout;
        let extension = loop {
            let ended = self.renewal_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(taken) = self.start_extend(id, ttl)? {
                break taken;
            }
            if timeout_at(waited_until, ended).await.is_err() {
                return Err(self.deadline_error("extend (waiting for the renewal in flight)"));
            }
        };
        let requested_at = Instant::now();
        let items = [RenewItem {
            hold: &*extension.hold,
            ttl: extension.ttl,
        }];
        let result = timeout(self.options.request_timeout, self.backend.renew(&items))
            .await
            .unwrap_or_else(|_| Err(self.deadline_error("extend")));
        self.extend_done(id, &extension.info, requested_at, result)
    }

    /// Checks that hold `id` can be extended by `ttl` and marks its renewal in flight;
    /// `None` while another renewal of it is in flight.
    fn start_extend(&self, id: u64, ttl: Option<Duration>) -> Result<Option<Extension<'_, B>>> {
        let mut table = self.table();
        let entry = table.holds.get_mut(&id).ok_or_else(|| Error::NotHeld {
            name: String::new(),
            message: "the hold was already released".into(),
        })?;
        if let Some(err) = entry.lost_error() {
            return Err(err);
        }
        let wanted = ttl.unwrap_or(entry.ttl);
        check_ttl(&self.capabilities, wanted)?;
        if !self.capabilities.per_lock_ttl && wanted != entry.ttl {
            return Err(Error::Unsupported {
                backend: self.capabilities.backend,
                operation: "extending one hold with a different ttl".into(),
            });
        }
        let Some(effective) = entry.effective_ttl(wanted, Instant::now()) else {
            return Err(Error::Lost {
                name: entry.info.name.to_string(),
                reason: LostReason::HoldCapReached,
            });
        };
        if entry.renewing {
            return Ok(None);
        }
        entry.renewing = true;
        Ok(Some(Extension {
            hold: Arc::clone(&entry.hold),
            info: Arc::clone(&entry.info),
            ttl: effective,
            _renewing: Renewing {
                keeper: self,
                ids: vec![id],
            },
        }))
    }

    /// Records the outcome of an extension of hold `id` sent at `requested_at`.
    fn extend_done(
        &self,
        id: u64,
        info: &HoldInfo,
        requested_at: Instant,
        result: Result<Vec<RenewOutcome>>,
    ) -> Result<Instant> {
        let mut table = self.table();
        let suspended = table.session_suspended;
        let entry = table.holds.get_mut(&id);
        let outcome = match result {
            Ok(outcomes) => match outcomes.first() {
                None => Err(Error::Protocol {
                    backend: self.capabilities.backend,
                    message: "renewal returned no outcome".into(),
                    source: None,
                }),
                Some(RenewOutcome::Renewed { lease }) => Ok(Ok(*lease)),
                Some(RenewOutcome::Lost(reason)) => Ok(Err(*reason)),
                Some(RenewOutcome::Undecided) => Err(Error::Unavailable {
                    backend: self.capabilities.backend,
                    message: format!("the extension of `{}` could not be decided", info.name),
                    source: None,
                }),
            },
            Err(err) => Err(err),
        };
        match outcome {
            Ok(Ok(lease)) => {
                let valid_until = validity_deadline(requested_at, lease);
                if let Some(entry) = entry {
                    if let Some(err) = entry.lost_error() {
                        return Err(err);
                    }
                    entry.renewed(requested_at, lease, suspended);
                }
                drop(table);
                self.wake();
                Ok(valid_until)
            }
            Ok(Err(reason)) => {
                info.transition(LockState::Lost(reason));
                Err(Error::Lost {
                    name: info.name.to_string(),
                    reason,
                })
            }
            Err(err) => {
                if let Some(entry) = entry {
                    entry.renew_failing = true;
                    entry.refresh_state(suspended);
                }
                Err(err)
            }
        }
    }

    /// Expires holds whose deadline or cap passed, starts a batched renewal of the holds
    /// that are due, and returns when to look again.
    fn plan(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut table = self.table();
        let renewing = table
            .renewal
            .as_ref()
            .is_some_and(|task| !task.is_finished());
        let mut next: Option<Instant> = None;
        let mut due = Vec::new();
        // Holds that ended on the client: removed on the server too, so that backends
        // whose holds live with a session (ZooKeeper, etcd) do not keep them.
        let mut ended = Vec::new();
        for (id, entry) in table.holds.iter_mut() {
            if entry.info.state().is_lost() {
                continue;
            }
            let valid_until = entry.info.valid_until.load();
            // The last renewals are cut at the cap, so an expiry near the cap is the cap's.
            let cap_reached = entry.cap_at.is_some_and(|cap| {
                cap <= now || (valid_until <= now && cap <= valid_until + drift_margin(entry.ttl))
            });
            if cap_reached {
                entry
                    .info
                    .transition(LockState::Lost(LostReason::HoldCapReached));
                entry.server_released = true;
                ended.push((Arc::clone(&entry.hold), HoldEnd::of(entry)));
                continue;
            }
            if valid_until <= now {
                entry.info.transition(LockState::Lost(LostReason::Expired));
                entry.server_released = true;
                ended.push((Arc::clone(&entry.hold), HoldEnd::of(entry)));
                continue;
            }
            let mut wake_at = valid_until;
            if let Some(cap) = entry.cap_at {
                wake_at = wake_at.min(cap);
            }
            if entry.renewal == RenewalMode::Auto {
                // Renew early rather than twice: batch holds due within a sixth of their TTL.
                if entry.renew_due <= now + entry.ttl / 6 {
                    if !renewing && !entry.renewing {
                        due.push(*id);
                    }
                } else {
                    wake_at = wake_at.min(entry.renew_due);
                }
            }
            next = Some(next.map_or(wake_at, |n| n.min(wake_at)));
        }
        if !due.is_empty() {
            if let Some(me) = self.arc() {
                table.renewal = Some(tokio::spawn(me.renew_batch(due)));
            }
        }
        drop(table);
        for (hold, end) in ended {
            if let Some(me) = self.arc() {
                tokio::spawn(async move {
                    if let Err(err) = me.retry_release(end, &hold).await {
                        tracing::warn!(error = %err, "release of an ended hold failed; the server-side lease ends it");
                    }
                });
            }
        }
        next
    }

    /// Renews the holds `ids` in one backend call.
    async fn renew_batch(self: Arc<Self>, ids: Vec<u64>) {
        let now = Instant::now();
        let mut earliest = now + self.options.request_timeout;
        let batch: Vec<(u64, Arc<B::Hold>, Duration)> = {
            let mut table = self.table();
            ids.iter()
                .filter_map(|id| {
                    let entry = table.holds.get_mut(id)?;
                    if entry.info.state().is_lost() || entry.renewing {
                        return None;
                    }
                    let ttl = entry.effective_ttl(entry.ttl, now)?;
                    entry.renewing = true;
                    earliest = earliest.min(entry.info.valid_until.load());
                    Some((*id, Arc::clone(&entry.hold), ttl))
                })
                .collect()
        };
        let _renewing = Renewing {
            keeper: &self,
            ids: batch.iter().map(|(id, _, _)| *id).collect(),
        };
        if batch.is_empty() {
            self.wake();
            return;
        }
        let items: Vec<RenewItem<'_, B::Hold>> = batch
            .iter()
            .map(|(_, hold, ttl)| RenewItem {
                hold: &**hold,
                ttl: *ttl,
            })
            .collect();
        let requested_at = Instant::now();
        let result = match timeout_at(earliest.max(requested_at), self.backend.renew(&items)).await
        {
            Ok(Ok(outcomes)) if outcomes.len() == items.len() => Ok(outcomes),
            Ok(Ok(_)) => Err("renewal returned the wrong number of outcomes".to_owned()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("renewal got no answer before the validity deadline".to_owned()),
        };
        drop(items);
        let mut table = self.table();
        let suspended = table.session_suspended;
        match result {
            Ok(outcomes) => {
                for ((id, _, _), outcome) in batch.iter().zip(outcomes) {
                    let Some(entry) = table.holds.get_mut(id) else {
                        continue;
                    };
                    match outcome {
                        RenewOutcome::Renewed { lease } => {
                            if entry.info.state().is_lost() {
                                continue;
                            }
                            entry.renewed(requested_at, lease, suspended);
                        }
                        RenewOutcome::Lost(reason) => {
                            entry.info.transition(LockState::Lost(reason));
                        }
                        RenewOutcome::Undecided => entry.renewal_failed(suspended),
                    }
                }
            }
            Err(message) => {
                tracing::warn!(backend = self.capabilities.backend, %message, holds = batch.len(), "renewal failed; holds are suspect");
                for (id, _, _) in &batch {
                    if let Some(entry) = table.holds.get_mut(id) {
                        entry.renewal_failed(suspended);
                    }
                }
            }
        }
        drop(table);
        self.wake();
    }

    fn apply_session(&self, status: SessionStatus) {
        let mut table = self.table();
        table.session = Some(status);
        table.session_suspended = status.health == SessionHealth::Suspended;
        let suspended = table.session_suspended;
        for entry in table.holds.values_mut() {
            if entry.session < status.epoch
                || (entry.session == status.epoch && status.health == SessionHealth::Expired)
            {
                entry
                    .info
                    .transition(LockState::Lost(LostReason::SessionExpired));
            } else if entry.session == status.epoch {
                entry.refresh_state(suspended);
            }
        }
    }
}

async fn run_keeper<B: Backend>(
    keeper: Weak<Keeper<B>>,
    mut commands: mpsc::UnboundedReceiver<Command<B>>,
    mut session: Option<watch::Receiver<SessionStatus>>,
) {
    const IDLE: Duration = Duration::from_secs(3600);
    if let (Some(receiver), Some(keeper)) = (&mut session, keeper.upgrade()) {
        let initial = *receiver.borrow_and_update();
        keeper.apply_session(initial);
    }
    loop {
        let next = match keeper.upgrade() {
            Some(keeper) => keeper.plan(),
            None => return,
        };
        let next = next.unwrap_or_else(|| Instant::now() + IDLE);
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Wake) => {}
                Some(Command::Release(keeper, entry)) => {
                    tokio::spawn(async move { keeper.finish_release(entry).await });
                }
            },
            _ = sleep_until(next) => {}
            status = session_change(&mut session) => {
                match (status, keeper.upgrade()) {
                    (Some(status), Some(keeper)) => keeper.apply_session(status),
                    (None, _) => session = None,
                    (_, None) => return,
                }
            }
        }
    }
}

async fn session_change(
    session: &mut Option<watch::Receiver<SessionStatus>>,
) -> Option<SessionStatus> {
    match session {
        Some(receiver) => match receiver.changed().await {
            Ok(()) => Some(*receiver.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An extension of one hold, marked in flight until dropped.
struct Extension<'a, B: Backend> {
    hold: Arc<B::Hold>,
    info: Arc<HoldInfo>,
    ttl: Duration,
    _renewing: Renewing<'a, B>,
}

/// Marks renewals of some holds in flight (see [`Entry::renewing`]); clears the marks
/// when dropped, also when the renewal is cancelled, and wakes what waits for them.
struct Renewing<'a, B: Backend> {
    keeper: &'a Keeper<B>,
    ids: Vec<u64>,
}

impl<B: Backend> Drop for Renewing<'_, B> {
    fn drop(&mut self) {
        let mut table = self.keeper.table();
        for id in &self.ids {
            if let Some(entry) = table.holds.get_mut(id) {
                entry.renewing = false;
            }
        }
        drop(table);
        self.keeper.renewal_ended.notify_waiters();
        self.keeper.wake();
    }
}

/// An explicit release still in progress: if dropped with its entry, the background task
/// finishes the release (with retries).
struct UnfinishedRelease<B: Backend> {
    keeper: Arc<Keeper<B>>,
    entry: Option<Entry<B::Hold>>,
}

impl<B: Backend> Drop for UnfinishedRelease<B> {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            let keeper = Arc::clone(&self.keeper);
            // Fails only when the keeper task has ended; the server-side lease is left.
            let _ = self.keeper.commands.send(Command::Release(keeper, entry));
        }
    }
}

impl<B: Backend> HoldOps for Keeper<B> {
    fn extend(&self, id: u64, ttl: Option<Duration>) -> BoxFuture<'_, Result<Instant>> {
        Box::pin(self.extend_hold(id, ttl))
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
                return Err(Error::config("lock client is shutting down"));
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
                Some(entry) => self.release_once(entry, prior).await,
                None => Ok(ReleaseOutcome::Released),
            };
            if !matches!(&result, Err(err) if err.is_retryable()) {
                unfinished.entry = None;
            }
            result
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
