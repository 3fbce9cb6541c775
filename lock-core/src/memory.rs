//! `memory://`, the in-process reference backend: every rule of the contract (TTL expiry,
//! fencing, FIFO hand-off, lost signal, cancellation) with no server.
//!
//! Clients connected to the same space (`memory://SPACE`) share locks; `memory://` is
//! the process-wide default space.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::{watch, Notify};
use tokio::time::{sleep_until, Instant};

use crate::backend::{
    AcquireRequest, Acquired, Backend, BackendRelease, HoldKind, Proclaimed, RenewItem,
    RenewOutcome,
};
use crate::capabilities::{Capabilities, FencingSource};
use crate::changes::ChangeFeed;
use crate::driver::Connect;
use crate::error::{Error, Result};
use crate::lease::LeaseClient;
use crate::lock_url::LockUrl;
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::LockOptions;
use crate::plumbing::lock_unpoisoned;
use crate::state::LostReason;
use crate::token::{FencingToken, OwnerToken};

/// A lock client on the in-memory backend.
pub type MemoryLock = LeaseClient<MemoryBackend>;

/// What a memory client connects to.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// The space whose locks it shares.
    pub space: Arc<MemorySpace>,
    /// Client-wide lock options.
    pub options: LockOptions,
}

/// A set of locks shared by the memory clients connected to it.
pub struct MemorySpace {
    name: String,
    slots: Mutex<HashMap<LockName, Slot>>,
    next_waiter: AtomicU64,
    /// Bumped by every write to the space: the change feed of every name.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Slot {
    holder: Option<Holder>,
    fence: u64,
    queue: VecDeque<Arc<Waiter>>,
    /// The owner tokens of the last holders broken by an operator, newest last.
    broken: VecDeque<OwnerToken>,
}

/// How many broken owner tokens a slot remembers.
const BROKEN_REMEMBERED: usize = 8;

struct Holder {
    token: OwnerToken,
    expires_at: Instant,
    since: SystemTime,
    /// A candidate's value.
    value: Option<Vec<u8>>,
}

struct Waiter {
    id: u64,
    token: OwnerToken,
    ttl: Duration,
    fence_at_least: Option<FencingToken>,
    value: Option<Vec<u8>>,
    grant: Mutex<Option<(FencingToken, Instant)>>,
    notify: Notify,
}

impl Slot {
    /// Drops an expired holder and hands a free lock to the first waiter.
    fn settle(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
        if self.holder.is_none() {
            if let Some(waiter) = self.queue.pop_front() {
                let fence = self.grant(
                    &waiter.token,
                    waiter.ttl,
                    waiter.fence_at_least,
                    waiter.value.clone(),
                    now,
                );
                *lock_unpoisoned(&waiter.grant) = Some((fence, now));
                waiter.notify.notify_one();
            }
        }
    }

    fn grant(
        &mut self,
        token: &OwnerToken,
        ttl: Duration,
        fence_at_least: Option<FencingToken>,
        value: Option<Vec<u8>>,
        now: Instant,
    ) -> FencingToken {
        self.fence = (self.fence + 1).max(fence_at_least.map_or(0, FencingToken::get));
        self.holder = Some(Holder {
            token: token.clone(),
            expires_at: now + ttl,
            since: SystemTime::now(),
            value,
        });
        FencingToken(self.fence)
    }

    /// Why `token` does not hold this slot, or `None` if it does.
    fn not_owner(&self, token: &OwnerToken, now: Instant) -> Option<LostReason> {
        match &self.holder {
            Some(h) if h.token == *token && h.expires_at > now => None,
            Some(h) if h.token == *token => Some(LostReason::Expired),
            _ if self.broken.contains(token) => Some(LostReason::Broken),
            Some(_) => Some(LostReason::Taken),
            None => Some(LostReason::Vanished),
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }
}

/// The value a hold of `kind` stores: a candidate's.
fn candidate_value(kind: &HoldKind) -> Option<Vec<u8>> {
    match kind {
        HoldKind::Candidate { value } => Some(value.clone()),
        HoldKind::Mutex => None,
    }
}

impl Holder {
    /// The holder as an inspection shows it, `fence` being its fencing token.
    fn participant(&self, fence: u64, now: Instant) -> Participant {
        Participant::new(Some(self.token.to_string()))
            .fencing_token(Some(FencingToken(fence)))
            .lease_left(Some(self.expires_at.saturating_duration_since(now)))
            .since(Some(self.since))
            .value(self.value.clone())
    }
}

impl MemorySpace {
    /// The space called `name`, shared by everyone in this process who asks for it.
    pub fn named(name: &str) -> Arc<MemorySpace> {
        static SPACES: OnceLock<Mutex<HashMap<String, Weak<MemorySpace>>>> = OnceLock::new();
        let mut spaces = lock_unpoisoned(SPACES.get_or_init(Default::default));
        spaces.retain(|_, space| space.strong_count() > 0);
        if let Some(space) = spaces.get(name).and_then(Weak::upgrade) {
            return space;
        }
        let space = Arc::new(MemorySpace {
            name: name.to_owned(),
            slots: Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(1),
            changed: watch::Sender::new(0),
        });
        spaces.insert(name.to_owned(), Arc::downgrade(&space));
        space
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<LockName, Slot>> {
        lock_unpoisoned(&self.slots)
    }

    /// Tells the change feeds that the space was written.
    fn touch(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    /// Removes the holder of `name` behind its back (as an operator or a clock jump
    /// would). Returns whether there was one.
    pub fn steal(&self, name: &LockName) -> bool {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        let had = slot.holder.take().is_some();
        slot.settle(Instant::now());
        drop(slots);
        self.touch();
        had
    }

    /// Removes the holder of `name` as an operator breaking it does, remembering its owner
    /// token so that its renewal finds [`LostReason::Broken`].
    fn force_release(&self, name: &LockName) -> Option<Participant> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(now);
        let fence = slot.fence;
        let holder = slot.holder.take()?;
        if slot.broken.len() == BROKEN_REMEMBERED {
            slot.broken.pop_front();
        }
        slot.broken.push_back(holder.token.clone());
        slot.settle(now);
        drop(slots);
        self.touch();
        Some(holder.participant(fence, now))
    }

    /// The held names that start with `prefix`, sorted.
    fn held_names(&self, prefix: &str) -> Vec<LockName> {
        let now = Instant::now();
        let mut slots = self.slots();
        let mut names: Vec<LockName> = slots
            .iter_mut()
            .filter(|(name, _)| name.as_str().starts_with(prefix))
            .filter_map(|(name, slot)| {
                slot.settle(now);
                slot.holder.is_some().then(|| name.clone())
            })
            .collect();
        names.sort();
        names
    }

    /// The owner token currently holding `name`, if any.
    pub fn holder(&self, name: &LockName) -> Option<OwnerToken> {
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(Instant::now());
        slot.holder.as_ref().map(|h| h.token.clone())
    }

    /// How many acquirers are queued on `name`.
    pub fn waiters(&self, name: &LockName) -> usize {
        self.slots().get(name).map_or(0, |slot| slot.queue.len())
    }

    /// Names with a live holder or a queued waiter.
    pub fn busy_names(&self) -> Vec<LockName> {
        let now = Instant::now();
        let mut slots = self.slots();
        slots
            .iter_mut()
            .filter_map(|(name, slot)| {
                slot.settle(now);
                (!slot.is_idle()).then(|| name.clone())
            })
            .collect()
    }

    fn try_take(&self, request: &AcquireRequest<'_>) -> Option<FencingToken> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(request.name.clone()).or_default();
        slot.settle(now);
        let fence = (slot.holder.is_none() && slot.queue.is_empty()).then(|| {
            slot.grant(
                request.token,
                request.ttl,
                request.fence_at_least,
                candidate_value(request.kind),
                now,
            )
        });
        drop(slots);
        if fence.is_some() {
            self.touch();
        }
        fence
    }

    /// Stores `value` as the value of `hold`, if it still holds.
    fn proclaim(&self, hold: &MemoryHold, value: &[u8]) -> Proclaimed {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(&hold.name) else {
            return Proclaimed::NotOwner(LostReason::Vanished);
        };
        if let Some(reason) = slot.not_owner(&hold.token, now) {
            return Proclaimed::NotOwner(reason);
        }
        if let Some(holder) = slot.holder.as_mut() {
            holder.value = Some(value.to_vec());
        }
        drop(slots);
        self.touch();
        Proclaimed::Done
    }

    /// The holder and waiters of `name`; the token floor is the counter.
    fn occupancy(&self, name: &LockName) -> Occupancy {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Occupancy::new(None, Vec::new()).token_floor(Some(FencingToken(0)));
        };
        slot.settle(now);
        let holder = slot
            .holder
            .as_ref()
            .map(|holder| holder.participant(slot.fence, now));
        let waiters = slot
            .queue
            .iter()
            .map(|waiter| Participant::new(Some(waiter.token.to_string())))
            .collect();
        Occupancy::new(holder, waiters).token_floor(Some(FencingToken(slot.fence)))
    }

    /// Removes a waiter that gave up; releases the lock if it was granted meanwhile.
    fn abandon(&self, name: &LockName, waiter: &Waiter) {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return;
        };
        slot.queue.retain(|w| w.id != waiter.id);
        if slot
            .holder
            .as_ref()
            .is_some_and(|h| h.token == waiter.token)
        {
            slot.holder = None;
        }
        slot.settle(now);
        if slot.is_idle() && slot.fence == 0 {
            slots.remove(name);
        }
        drop(slots);
        self.touch();
    }
}

impl fmt::Debug for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySpace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The protocol half of a memory client.
pub struct MemoryBackend {
    space: Arc<MemorySpace>,
    recheck: Duration,
    /// `true` while this client is cut off from the space.
    partitioned: watch::Sender<bool>,
}

impl MemoryBackend {
    /// A client of `space`.
    pub fn client(space: Arc<MemorySpace>, options: LockOptions) -> Result<MemoryLock> {
        LeaseClient::new(MemoryBackend::new(space, &options), options)
    }

    fn new(space: Arc<MemorySpace>, options: &LockOptions) -> Self {
        MemoryBackend {
            space,
            recheck: options.recheck,
            partitioned: watch::Sender::new(false),
        }
    }

    /// The configuration of `memory://[SPACE][?options]`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a path, credentials or an unknown query key.
    fn parse_url(url: &LockUrl) -> Result<MemoryConfig> {
        if !matches!(url.path.as_str(), "" | "/") {
            return Err(Error::config(
                "memory:// URLs take a space name as host and no path",
            ));
        }
        if url.username.is_some() || url.password.is_some() || url.hosts.len() > 1 {
            return Err(Error::config(
                "memory:// URLs take one space name and no credentials",
            ));
        }
        if url.hosts.first().is_some_and(|h| h.port.is_some()) {
            return Err(Error::config("memory:// URLs take no port"));
        }
        let mut options = LockOptions::default();
        if let Some((key, _)) = url.apply_common_options(&mut options)?.first() {
            return Err(Error::config(format!(
                "unknown memory:// option `{key}` (known: ttl, renewal, max_hold, request_timeout, recheck)"
            )));
        }
        let space = MemorySpace::named(url.hosts.first().map_or("default", |h| h.host.as_str()));
        Ok(MemoryConfig { space, options })
    }

    /// The space this client uses.
    pub fn space(&self) -> &Arc<MemorySpace> {
        &self.space
    }

    /// Simulates a crashed client: from now on no request of this client reaches the
    /// space (they hang), so its holds end only by TTL.
    pub fn crash(&self) {
        self.partition(true);
    }

    /// Cuts this client off from the space (`true`) or heals the cut (`false`). While
    /// cut, requests wait; after healing they go through.
    pub fn partition(&self, cut: bool) {
        self.partitioned.send_replace(cut);
    }

    async fn reachable(&self) {
        let mut partitioned = self.partitioned.subscribe();
        // The sender lives as long as this backend, so waiting cannot fail.
        let _ = partitioned.wait_for(|cut| !cut).await;
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("space", &self.space.name)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory://{}", self.space.name)
    }
}

/// A hold on the memory backend.
#[derive(Debug)]
pub struct MemoryHold {
    name: LockName,
    token: OwnerToken,
}

impl MemoryHold {
    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }
}

/// Removes a queued waiter if the acquire future is dropped.
struct QueuedWaiter<'a> {
    space: &'a MemorySpace,
    name: &'a LockName,
    waiter: Arc<Waiter>,
    done: bool,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.space.abandon(self.name, &self.waiter);
        }
    }
}

#[async_trait]
impl Connect for MemoryBackend {
    const SCHEMES: &'static [&'static str] = &["memory"];
    type Config = MemoryConfig;

    fn config_from_url(url: &LockUrl) -> Result<MemoryConfig> {
        MemoryBackend::parse_url(url)
    }

    fn lock_options(config: &MemoryConfig) -> &LockOptions {
        &config.options
    }

    fn validate(_config: &MemoryConfig) -> Result<()> {
        Ok(())
    }

    async fn open(config: MemoryConfig) -> Result<Self> {
        Ok(MemoryBackend::new(config.space, &config.options))
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    type Hold = MemoryHold;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("memory")
            .fair(true)
            .election(true)
            .fencing(FencingSource::Counter)
            .fence_at_least(true)
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        self.reachable().await;
        Ok(self.space.occupancy(name))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        self.reachable().await;
        Ok(self.space.held_names(prefix))
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        self.reachable().await;
        Ok(self.space.force_release(name))
    }

    async fn proclaim(&self, hold: &MemoryHold, value: &[u8]) -> Result<Proclaimed> {
        self.reachable().await;
        Ok(self.space.proclaim(hold, value))
    }

    /// Every write to the space fires the feed of every name.
    async fn changes(&self, _name: &LockName) -> Result<ChangeFeed> {
        self.reachable().await;
        let changed = self.space.changed.subscribe();
        let stream = futures::stream::unfold(changed, |mut changed| async move {
            changed.changed().await.ok()?;
            Some(((), changed))
        });
        Ok(ChangeFeed::from_stream(Box::pin(stream)))
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<MemoryHold>>> {
        self.reachable().await;
        let requested_at = Instant::now();
        let hold = || MemoryHold {
            name: request.name.clone(),
            token: request.token.clone(),
        };
        if let Some(fence) = self.space.try_take(&request) {
            return Ok(Some(Acquired {
                hold: hold(),
                fencing_token: fence,
                requested_at,
                lease: request.ttl,
                session: 0,
            }));
        }
        if !request.wait {
            return Ok(None);
        }
        let waiter = Arc::new(Waiter {
            id: self.space.next_waiter.fetch_add(1, Ordering::Relaxed),
            token: request.token.clone(),
            ttl: request.ttl,
            fence_at_least: request.fence_at_least,
            value: candidate_value(request.kind),
            grant: Mutex::new(None),
            notify: Notify::new(),
        });
        let mut queued = QueuedWaiter {
            space: &self.space,
            name: request.name,
            waiter: Arc::clone(&waiter),
            done: false,
        };
        {
            let mut slots = self.space.slots();
            let slot = slots.entry(request.name.clone()).or_default();
            slot.queue.push_back(Arc::clone(&waiter));
            slot.settle(Instant::now());
        }
        self.space.touch();
        loop {
            let recheck_at = {
                let now = Instant::now();
                let mut slots = self.space.slots();
                let slot = slots.entry(request.name.clone()).or_default();
                slot.settle(now);
                if let Some((fence, granted_at)) = *lock_unpoisoned(&waiter.grant) {
                    queued.done = true;
                    return Ok(Some(Acquired {
                        hold: hold(),
                        fencing_token: fence,
                        requested_at: granted_at,
                        lease: request.ttl,
                        session: 0,
                    }));
                }
                let expiry = slot.holder.as_ref().map_or(now, |h| h.expires_at);
                expiry.min(now + self.recheck)
            };
            tokio::select! {
                _ = waiter.notify.notified() => {}
                _ = sleep_until(recheck_at) => {}
            }
            self.reachable().await;
        }
    }

    async fn renew(&self, items: &[RenewItem<'_, MemoryHold>]) -> Result<Vec<RenewOutcome>> {
        self.reachable().await;
        let now = Instant::now();
        let mut slots = self.space.slots();
        Ok(items
            .iter()
            .map(|item| {
                let Some(slot) = slots.get_mut(&item.hold.name) else {
                    return RenewOutcome::Lost(LostReason::Vanished);
                };
                if let Some(reason) = slot.not_owner(&item.hold.token, now) {
                    slot.settle(now);
                    return RenewOutcome::Lost(reason);
                }
                if let Some(holder) = slot.holder.as_mut() {
                    holder.expires_at = now + item.ttl;
                }
                RenewOutcome::Renewed { lease: item.ttl }
            })
            .collect())
    }

    async fn release(&self, hold: &MemoryHold) -> Result<BackendRelease> {
        self.reachable().await;
        let now = Instant::now();
        let mut slots = self.space.slots();
        let Some(slot) = slots.get_mut(&hold.name) else {
            return Ok(BackendRelease::NotOwner(LostReason::Vanished));
        };
        let outcome = match slot.not_owner(&hold.token, now) {
            Some(reason) => BackendRelease::NotOwner(reason),
            None => {
                slot.holder = None;
                BackendRelease::Released
            }
        };
        slot.settle(now);
        drop(slots);
        self.space.touch();
        Ok(outcome)
    }
}
