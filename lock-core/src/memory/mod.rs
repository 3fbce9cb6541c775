//! `memory://`, the in-process reference backend: every rule of the contract (TTL expiry,
//! fencing, FIFO hand-off, lost signal, cancellation) with no server.
//!
//! Clients connected to the same space (`memory://SPACE`) share locks; `memory://` is
//! the process-wide default space.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{watch, Notify};
use tokio::time::{sleep_until, Instant};

use crate::backend::{
    AcquireRequest, Acquired, Amended, Backend, BackendRelease, RenewItem, RenewOutcome,
};
use crate::capabilities::{Capabilities, FencingSource};
use crate::changes::ChangeFeed;
use crate::driver::Connect;
use crate::error::{Error, Result};
use crate::kind::{Amendment, SemaphoreResize};
use crate::lease::LeaseClient;
use crate::lock_url::LockUrl;
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::LockOptions;
use crate::plumbing::lock_unpoisoned;
use crate::state::LostReason;
use crate::token::OwnerToken;

mod space;

pub use space::MemorySpace;
use space::Waiter;

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

/// What every in-process client offers.
pub const CAPABILITIES: Capabilities = Capabilities::new("memory")
    .fair(true)
    .election(true)
    .semaphore(true)
    .semaphore_many(true)
    .semaphore_resize(true)
    .rwlock(true)
    .upgradeable(true)
    .fencing(FencingSource::Counter)
    .fence_at_least(true);

#[async_trait]
impl Backend for MemoryBackend {
    type Hold = MemoryHold;

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
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

    async fn amend(&self, hold: &MemoryHold, amendment: Amendment<'_>) -> Result<Amended> {
        self.reachable().await;
        self.space.amend(hold, amendment)
    }

    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        self.reachable().await;
        self.space.resize(name, resize)
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
        if let Some(fence) = self.space.try_take(&request)? {
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
            kind: Mutex::new(request.kind.clone()),
            ttl: request.ttl,
            fence_at_least: request.fence_at_least,
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
            slot.check_kind(request.kind, request.name)?;
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
                let expiry = slot
                    .holders
                    .iter()
                    .map(|h| h.expires_at)
                    .min()
                    .unwrap_or(now);
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
                match slot.own(&item.hold.token, now) {
                    Ok(holder) => {
                        holder.expires_at = now + item.ttl;
                        RenewOutcome::Renewed { lease: item.ttl }
                    }
                    Err(reason) => {
                        slot.settle(now);
                        RenewOutcome::Lost(reason)
                    }
                }
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
        let outcome = match slot.own(&hold.token, now) {
            Ok(_) => {
                slot.drop_hold(&hold.token);
                BackendRelease::Released
            }
            Err(reason) => BackendRelease::NotOwner(reason),
        };
        slot.settle(now);
        drop(slots);
        self.space.touch();
        Ok(outcome)
    }
}
