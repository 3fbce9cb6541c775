//! The `zk://` backend: [`ZkBackend`] opens a session and runs acquisitions (the queue in
//! [`crate::queue`]), renewals and releases (in [`crate::hold`]) on it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    backend::{
        AcquireRequest, Acquired, Amended, Amendment, Backend, BackendRelease, ChangeFeed,
        HoldKind, RenewItem, RenewOutcome, SemaphoreResize, SessionStatus,
    },
    driver::Connect,
    plumbing::CleanupOnDrop,
    url::LockUrl,
};
use lock_core::{
    Capabilities, FencingSource, LockName, LockOptions, Occupancy, Participant, Result,
};
use tokio::sync::watch;

use crate::config::ZkConfig;
use crate::error::BACKEND;
use crate::hold::{self, ZkHold};
use crate::layout::{lock_dir, node_marker, semaphore_dirs, NodeKind, DOWNGRADED};
use crate::operator;
use crate::queue::{PermitNodes, Queue, QueuedNode, Step};
use crate::session::Session;

/// New sessions an acquire waits through before failing.
const RESTARTS: usize = 5;

/// The protocol half of a ZooKeeper lock client. See the crate docs.
pub struct ZkBackend {
    session: Arc<Session>,
}

/// Opened with one session: fails with [`lock_core::Error::InvalidConfig`] for a bad
/// configuration and [`lock_core::Error::Connection`] when no session is established
/// within the shorter of `connect_timeout` and `request_timeout`.
#[async_trait]
impl Connect for ZkBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = ZkConfig;

    fn config_from_url(url: &LockUrl) -> Result<ZkConfig> {
        ZkConfig::from_url(url)
    }

    fn validate(config: &ZkConfig) -> Result<()> {
        config.validate()
    }

    fn lock_options(config: &ZkConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: ZkConfig) -> Result<ZkBackend> {
        let session = Session::connect(config).await?;
        Ok(ZkBackend { session })
    }
}

impl ZkBackend {
    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        self.session.config()
    }

    /// The directory of lock `name` (relative to the chroot, if any).
    pub fn lock_dir(&self, name: &LockName) -> String {
        lock_dir(&self.config().prefix, name)
    }

    /// The id of the live session, `None` while none is established.
    pub fn session_id(&self) -> Option<i64> {
        self.session.live().ok().map(|live| live.session_id())
    }

    /// The negotiated session timeout of the live session.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.session
            .live()
            .ok()
            .map(|live| live.client.session_timeout())
    }

    /// The epoch of the newest session: 1 for the first, +1 for each replacement.
    pub fn session_epoch(&self) -> u64 {
        self.session.epoch()
    }

    /// One upgrade step of `hold`: its node marked upgraded ([`hold::mark_upgraded`]), then
    /// `Done` once it holds alone ([`Queue::upgraded_alone`]), else `Pending`.
    async fn upgrade_step(&self, hold: &ZkHold) -> Result<Amended> {
        let live = match hold::mark_upgraded(&self.session, hold).await? {
            Ok(live) => live,
            Err(reason) => return Ok(Amended::NotOwner(reason)),
        };
        let (dir, name) = hold.path.rsplit_once('/').unwrap_or(("", &hold.path));
        match Queue::new(&self.session)
            .upgraded_alone(&live, dir, name)
            .await
        {
            Ok(true) => Ok(Amended::Done),
            Ok(false) => Ok(Amended::Pending),
            Err(Step::Restart(_)) => Ok(Amended::NotOwner(
                hold::gone_reason(&self.session, &live, hold).await?,
            )),
            Err(step) => Err(step.into_error()),
        }
    }
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", self.config())
            .field("epoch", &self.session.epoch())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.config().endpoint())
    }
}

/// What every client of this backend offers (known without a server).
pub const CAPABILITIES: Capabilities = Capabilities::new(BACKEND)
    .fair(true)
    .per_lock_ttl(false)
    .min_ttl(Duration::from_secs(1))
    .durable(true)
    .fencing(FencingSource::CreateRevision)
    .election(true)
    .semaphore(true)
    .rwlock(true)
    .upgradeable(true);

#[async_trait]
impl Backend for ZkBackend {
    type Hold = ZkHold;

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<ZkHold>>> {
        let dir = self.lock_dir(request.name);
        let marker = node_marker(request.token, NodeKind::of(request.kind)?);
        let lock_marker = node_marker(request.token, NodeKind::Lock);
        let mut restarts = 0;
        loop {
            let outcome = match self.session.live() {
                Ok(live) => {
                    let queue = Queue::new(&self.session);
                    let pending = |dir: &str, marker: &str| {
                        CleanupOnDrop::new(QueuedNode::new(&self.session, dir, marker, live.epoch))
                            .tracked_by(self.session.background())
                    };
                    if let HoldKind::Permit { permits, .. } = *request.kind {
                        let (locks, leases) = semaphore_dirs(&dir);
                        let mut nodes = PermitNodes {
                            lock: pending(&locks, &lock_marker),
                            lease: pending(&leases, &marker),
                        };
                        let markers = (lock_marker.as_str(), marker.as_str());
                        queue
                            .permit(&live, &dir, markers, permits, &request, &mut nodes)
                            .await
                    } else {
                        let mut node = pending(&dir, &marker);
                        queue
                            .attempt(&live, &dir, &marker, &request, &mut node)
                            .await
                    }
                }
                Err(err) => Err(Step::Restart(err)),
            };
            match outcome {
                Ok(acquired) => return Ok(acquired),
                Err(Step::Restart(err)) if request.wait && restarts < RESTARTS => {
                    restarts += 1;
                    let epoch = self.session.epoch();
                    tracing::debug!(lock = %request.name, error = %err, epoch, restarts, "acquire starts over on a new session");
                    self.session
                        .wait_usable(epoch, self.config().connect_timeout)
                        .await;
                }
                Err(step) => return Err(step.into_error()),
            }
        }
    }

    async fn renew(&self, items: &[RenewItem<'_, ZkHold>]) -> Result<Vec<RenewOutcome>> {
        hold::renew(&self.session, items).await
    }

    async fn release(&self, hold: &ZkHold) -> Result<BackendRelease> {
        hold::release(&self.session, hold).await
    }

    /// The lock nodes in queue order, and the floor of the next fencing token.
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        operator::inspect(&self.session, &self.lock_dir(name)).await
    }

    /// The directories under the prefix with a lock node (crate docs, *Operating*).
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        operator::list(&self.session, &self.config().prefix, prefix).await
    }

    /// Refused: Curator's `InterProcessSemaphoreV2` layout, which this backend keeps, has
    /// no number of permits on the server (each client counts with its own), so a Curator
    /// participant would go on granting by its old number.
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        let _ = resize;
        Err(lock_core::Error::unsupported(
            BACKEND,
            format!(
                "resizing the semaphore `{name}`: in Curator's InterProcessSemaphoreV2 layout \
                 every client counts the lease nodes with its own number of permits, none is \
                 kept on the server, so a Curator participant would go on granting by the old \
                 one"
            ),
        ))
    }

    /// Deletes the first lock node and marks its owner broken (crate docs, *Operating*).
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        operator::force_release(&self.session, &self.lock_dir(name)).await
    }

    /// Writes the candidate node's data (crate docs, *Leader election*), marks a writer's
    /// node downgraded, or takes an upgrade step (crate docs, *Read-write lock*).
    async fn amend(&self, hold: &ZkHold, amendment: Amendment<'_>) -> Result<Amended> {
        match amendment {
            Amendment::Proclaim(value) => hold::set_data(&self.session, hold, value).await,
            Amendment::Downgrade if hold.node_kind() == Some(NodeKind::Write) => {
                hold::set_data(&self.session, hold, DOWNGRADED).await
            }
            Amendment::Upgrade if hold.node_kind() == Some(NodeKind::Write) => {
                self.upgrade_step(hold).await
            }
            other => Err(other.unsupported(self.capabilities().backend)),
        }
    }

    /// A persistent recursive watch on the name's directory, followed by a task.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        operator::changes(&self.session, self.lock_dir(name)).await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.session.subscribe())
    }

    /// Waits for the cleanups of abandoned acquires, then closes the session: ZooKeeper
    /// removes its ephemeral nodes at once (each wait at most the request timeout).
    async fn close(&self) -> Result<()> {
        let limit = self.config().options.request_timeout;
        self.session.background().settle(limit).await;
        self.session.close(limit).await;
        Ok(())
    }
}
