//! A backend of the application's own, registered the documented way
//! (`distlock::raw::driver::register::<B>()`), is served by `distlock::connect` and passes the whole
//! conformance suite through it.
//!
//! The backend, `relay://SPACE`, relays to the in-memory reference backend: what is under
//! test is the way in (declaration, registration, the one process-wide registry), not a
//! new protocol. It offers no upgradeable readers, as a backend written before them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Crash, Factory};
use distlock::memory::{MemoryBackend, MemoryConfig, MemorySpace};
use distlock::raw::{
    backend::{
        AcquireRequest, Acquired, Amended, Amendment, Backend, BackendRelease, ChangeFeed,
        RenewItem, RenewOutcome, SemaphoreResize,
    },
    driver::Connect,
    plumbing::lock_unpoisoned,
    url::LockUrl,
};
use distlock::{
    Capabilities, DistributedLock, LockName, LockOptions, Occupancy, Participant, Result,
};

/// A backend defined outside the workspace's backends.
struct Relay(Arc<MemoryBackend>);

/// The last relay opened on each space, for [`RelayFactory::crashable_client`].
static OPENED: Mutex<Option<HashMap<String, Arc<MemoryBackend>>>> = Mutex::new(None);

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Relay").finish()
    }
}

impl fmt::Display for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "relay to {}", self.0)
    }
}

#[async_trait]
impl Backend for Relay {
    type Hold = <MemoryBackend as Backend>::Hold;

    /// The memory backend's, but upgradeable readers: a backend written before they
    /// existed, whose upgradeable acquires the lease client refuses with a typed
    /// `Unsupported` (the conformance rules check it).
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities().upgradeable(false)
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<Self::Hold>>> {
        self.0.acquire(request).await
    }

    async fn renew(&self, items: &[RenewItem<'_, Self::Hold>]) -> Result<Vec<RenewOutcome>> {
        self.0.renew(items).await
    }

    async fn release(&self, hold: &Self::Hold) -> Result<BackendRelease> {
        self.0.release(hold).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        self.0.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        self.0.list(prefix).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        self.0.force_release(name).await
    }

    async fn amend(&self, hold: &Self::Hold, amendment: Amendment<'_>) -> Result<Amended> {
        self.0.amend(hold, amendment).await
    }

    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        self.0.resize_semaphore(name, resize).await
    }

    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        self.0.changes(name).await
    }
}

#[async_trait]
impl Connect for Relay {
    const SCHEMES: &'static [&'static str] = &["relay"];
    type Config = (String, MemoryConfig);

    fn config_from_url(url: &LockUrl) -> Result<Self::Config> {
        let mut memory = url.clone();
        memory.scheme = "memory".to_owned();
        let space = url
            .hosts
            .first()
            .map(|h| h.host.clone())
            .unwrap_or_default();
        Ok((space, MemoryBackend::config_from_url(&memory)?))
    }

    fn lock_options(config: &Self::Config) -> &LockOptions {
        &config.1.options
    }

    fn validate(config: &Self::Config) -> Result<()> {
        MemoryBackend::validate(&config.1)
    }

    async fn open((space, config): Self::Config) -> Result<Self> {
        let backend = Arc::new(MemoryBackend::open(config).await?);
        lock_unpoisoned(&OPENED)
            .get_or_insert_with(HashMap::new)
            .insert(space, Arc::clone(&backend));
        Ok(Relay(backend))
    }
}

/// Clients of one private space, each made by `distlock::connect("relay://…")`.
struct RelayFactory {
    space: String,
    /// Serializes crashable connects, so that the relay [`OPENED`] last is the client's.
    crashable: tokio::sync::Mutex<()>,
}

impl RelayFactory {
    fn new() -> Self {
        distlock::raw::driver::register::<Relay>();
        RelayFactory {
            space: format!("relay-{}", uuid::Uuid::new_v4().simple()),
            crashable: tokio::sync::Mutex::new(()),
        }
    }

    fn memory(&self) -> Arc<MemorySpace> {
        MemorySpace::named(&self.space)
    }
}

struct RelayCrash(Arc<MemoryBackend>);

#[async_trait]
impl Crash for RelayCrash {
    async fn crash(&self) {
        self.0.crash();
    }
}

#[async_trait]
impl Factory for RelayFactory {
    fn label(&self) -> String {
        self.url()
    }

    fn url(&self) -> String {
        format!("relay://{}", self.space)
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_millis(600)
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        let url = format!("{}?{}", self.url(), options.to_query());
        distlock::connect(&url).await.expect("relay:// is served")
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let _one_at_a_time = self.crashable.lock().await;
        let client = self.client(options).await;
        let backend = lock_unpoisoned(&OPENED)
            .as_ref()
            .and_then(|opened| opened.get(&self.space).cloned())
            .expect("the relay just opened");
        (client, Box::new(RelayCrash(backend)))
    }

    async fn steal(&self, name: &LockName) {
        self.memory().steal(name);
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let space = self.memory();
        let mut left = Vec::new();
        for name in names {
            if let Some(holder) = space.holder(name) {
                left.push(format!("{name:?} held by {holder}"));
            }
            let waiters = space.waiters(name);
            if waiters > 0 {
                left.push(format!("{name:?} has {waiters} queued waiters"));
            }
        }
        left
    }
}

conformance::conformance_suite!(async { RelayFactory::new() });
