//! The ZooKeeper session of one lock client: connects, reports its health to the lease
//! machinery, and replaces an expired session with a new one (a new epoch).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::raw::{
    backend::{SessionHealth, SessionStatus},
    plumbing::{lock_unpoisoned, Background, Backoff},
};
use lock_core::{Error, Result};
use tokio::sync::watch;
use tokio::time::timeout;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{from_client, is_connection_loss, is_session_gone, no_session, BACKEND};
use crate::tls::Tls;

/// First pause between attempts to establish a session (jittered, doubling up to
/// [`LONGEST_RECONNECT_PAUSE`]: a fleet cut off together does not come back together).
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// Longest pause between attempts to establish a session.
const LONGEST_RECONNECT_PAUSE: Duration = Duration::from_secs(2);

/// The pauses between attempts to establish a session.
fn reconnect_backoff() -> Backoff {
    Backoff::new(RECONNECT_PAUSE, LONGEST_RECONNECT_PAUSE)
}

/// A live session: the client and its epoch.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) client: zk::Client,
    pub(crate) epoch: u64,
}

impl Live {
    /// The session id, as ZooKeeper stores it in `ephemeralOwner`.
    pub(crate) fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Sends a barrier the leader orders with a quorum: a `multi` holding one `check` of
    /// `path` at any version, a transaction. A server answers it only once the leader has
    /// committed it, so neither a follower cut off from its leader (which serves reads
    /// from its own copy for up to `syncLimit` ticks) nor a leader cut off from its
    /// followers can confirm it; `sync` would not do (a cut-off leader answers it alone).
    /// ZooKeeper serves the requests of a session in order, so those sent after this call
    /// see at least the state committed with the barrier, and the session was alive at
    /// the leader when the barrier was committed.
    ///
    /// Resolves to `Ok` once committed, also when the check failed (no such node, no read
    /// permission: a failed transaction is committed all the same); to the error when the
    /// request failed or the session is gone.
    pub(crate) fn barrier(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<(), zk::Error>> + Send + '_ {
        let mut writer = self.client.new_multi_writer();
        let sent = writer.add_check_version(path, -1).map(|()| writer.commit());
        async move {
            match sent?.await {
                Ok(_) => Ok(()),
                Err(zk::MultiWriteError::OperationFailed { source, .. })
                    if !is_connection_loss(&source) && !is_session_gone(&source) =>
                {
                    Ok(())
                }
                Err(err) => Err(err.into()),
            }
        }
    }

    /// The reply to the request `send` sends, as of a point the leader ordered after this
    /// call: a [`Live::barrier`] on `anchor` sent first, then the request, both before
    /// either reply; the error of either if one fails.
    pub(crate) async fn behind_barrier<'a, T, F>(
        &'a self,
        anchor: &str,
        send: impl FnOnce(&'a zk::Client) -> F,
    ) -> Result<T, zk::Error>
    where
        F: Future<Output = Result<T, zk::Error>> + 'a,
    {
        let barrier = self.barrier(anchor);
        let reply = send(&self.client);
        let (barrier, reply) = tokio::join!(barrier, reply);
        barrier.and(reply)
    }
}

#[derive(Debug)]
struct Current {
    client: Option<zk::Client>,
    epoch: u64,
    /// Closed by the lock client: no session replaces the last one.
    closed: bool,
}

/// The session of one lock client, shared by the backend and its background tasks.
#[derive(Debug)]
pub(crate) struct Session {
    config: ZkConfig,
    current: Mutex<Current>,
    status: watch::Sender<SessionStatus>,
    /// A lock directory refused the `setData` of a counted create (no WRITE permission):
    /// creates are listed instead from then on.
    counting_refused: AtomicBool,
    /// The last create of a queue node found others queued: the next one is listed.
    queue_seen: AtomicBool,
    /// The cleanups of abandoned acquires, which closing waits for.
    background: Background,
}

impl Session {
    /// Establishes the first session (epoch 1) and starts watching it. Fails fast, like
    /// every backend: within the shorter of `connect_timeout` and `request_timeout`.
    pub(crate) async fn connect(config: ZkConfig) -> Result<Arc<Session>> {
        let limit = config.connect_timeout.min(config.options.request_timeout);
        let client = open(&config, limit).await?;
        let status = SessionStatus {
            epoch: 1,
            health: SessionHealth::Connected,
        };
        let session = Arc::new(Session {
            config,
            current: Mutex::new(Current {
                client: Some(client.clone()),
                epoch: 1,
                closed: false,
            }),
            status: watch::Sender::new(status),
            counting_refused: AtomicBool::new(false),
            queue_seen: AtomicBool::new(false),
            background: Background::new(),
        });
        let watched = Watched::of(&client, 1);
        tokio::spawn(monitor(Arc::downgrade(&session), watched));
        Ok(session)
    }

    /// The live session, or an error while none is established.
    pub(crate) fn live(&self) -> Result<Live> {
        let current = lock_unpoisoned(&self.current);
        match &current.client {
            Some(client) => Ok(Live {
                client: client.clone(),
                epoch: current.epoch,
            }),
            None => Err(no_session(current.epoch)),
        }
    }

    /// The epoch of the newest session (live or not).
    pub(crate) fn epoch(&self) -> u64 {
        lock_unpoisoned(&self.current).epoch
    }

    /// Session health changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        self.status.subscribe()
    }

    /// Whether a create may count the lock directory's children (see `Queue::create`).
    pub(crate) fn counts_children(&self) -> bool {
        !self.counting_refused.load(Ordering::Relaxed)
    }

    /// A lock directory refused to be counted: list after creates from now on.
    pub(crate) fn stop_counting(&self) {
        self.counting_refused.store(true, Ordering::Relaxed);
    }

    /// Whether the last create of a queue node on this session found others queued.
    pub(crate) fn queue_seen(&self) -> bool {
        self.queue_seen.load(Ordering::Relaxed)
    }

    /// Records whether a create of a queue node found others queued.
    pub(crate) fn saw_queue(&self, queued: bool) {
        self.queue_seen.store(queued, Ordering::Relaxed);
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &ZkConfig {
        &self.config
    }

    /// The cleanups of abandoned acquires.
    pub(crate) fn background(&self) -> &Background {
        &self.background
    }

    /// Closes the session for good: no new one replaces it, and ZooKeeper removes its
    /// ephemeral nodes once the server has the close, which is sent when the last request
    /// still using the session ends. Waits at most `limit` for the server to confirm.
    pub(crate) async fn close(&self, limit: Duration) {
        let (client, epoch) = {
            let mut current = lock_unpoisoned(&self.current);
            current.closed = true;
            (current.client.take(), current.epoch)
        };
        let Some(client) = client else {
            return;
        };
        let mut watcher = client.state_watcher();
        drop(client);
        let ended = timeout(limit, async {
            loop {
                if matches!(
                    watcher.changed().await,
                    zk::SessionState::Closed
                        | zk::SessionState::Expired
                        | zk::SessionState::AuthFailed
                ) {
                    return;
                }
            }
        })
        .await;
        if ended.is_err() {
            tracing::warn!(
                epoch,
                "closing: ZooKeeper did not confirm the session's close in time; its timeout ends it"
            );
        }
        self.publish(epoch, SessionHealth::Expired);
    }

    /// Runs one request with the configured request timeout.
    pub(crate) async fn call<F: Future>(&self, what: &str, request: F) -> Result<F::Output> {
        let limit = self.config.options.request_timeout;
        timeout(limit, request)
            .await
            .map_err(|_| Error::no_answer(BACKEND, what, limit))
    }

    /// Waits (at most `limit`) until the session epoch is newer than `epoch` or the
    /// session of `epoch` is connected again.
    pub(crate) async fn wait_usable(&self, epoch: u64, limit: Duration) {
        let mut status = self.subscribe();
        let _ = timeout(
            limit,
            status.wait_for(|s| {
                s.epoch > epoch || (s.epoch == epoch && s.health == SessionHealth::Connected)
            }),
        )
        .await;
    }

    fn publish(&self, epoch: u64, health: SessionHealth) {
        self.status.send_if_modified(|status| {
            let next = SessionStatus { epoch, health };
            if *status == next || status.epoch > epoch {
                return false;
            }
            *status = next;
            true
        });
    }

    fn expire(&self, epoch: u64) {
        let mut current = lock_unpoisoned(&self.current);
        if current.epoch == epoch {
            current.client = None;
        }
        drop(current);
        self.publish(epoch, SessionHealth::Expired);
    }

    /// Installs `client` as the next session; `None` (and the client dropped, which closes
    /// its session) when the lock client was closed meanwhile.
    fn install(&self, client: zk::Client) -> Option<u64> {
        let mut current = lock_unpoisoned(&self.current);
        if current.closed {
            return None;
        }
        current.epoch += 1;
        current.client = Some(client);
        let epoch = current.epoch;
        drop(current);
        self.publish(epoch, SessionHealth::Connected);
        Some(epoch)
    }

    pub(crate) fn is_closed(&self) -> bool {
        lock_unpoisoned(&self.current).closed
    }
}

/// Opens a session with the configured credentials (and TLS), waiting at most `limit`.
async fn open(config: &ZkConfig, limit: Duration) -> Result<zk::Client> {
    let mut connector = zk::Client::connector().with_session_timeout(config.options.ttl);
    if let (Some(user), Some(password)) = (&config.username, &config.password) {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    let tls = Tls::of(config).await?;
    let target = config.connect_string();
    let failed = |err| from_client(&format!("connect to {}", config.endpoints.join(",")), err);
    let connect = async {
        let Some(tls) = tls else {
            return connector.connect(&target).await.map_err(failed);
        };
        // One round over the servers at a time, so that a refused handshake is told at
        // once rather than retried until the limit.
        let connector = connector.with_tls(tls.options.clone()).with_fail_eagerly();
        let mut backoff = reconnect_backoff();
        loop {
            match connector.clone().secure_connect(&target).await {
                Err(zk::Error::NoHosts) => {
                    if let Some(refused) = tls.refusal(&config.endpoints).await {
                        return Err(refused);
                    }
                    tokio::time::sleep(backoff.next_pause()).await;
                }
                other => return other.map_err(failed),
            }
        }
    };
    let client = match timeout(limit, connect).await {
        Ok(connected) => connected?,
        Err(_) => {
            return Err(Error::no_answer(
                BACKEND,
                format!("establishing a session with {}", config.endpoints.join(",")),
                limit,
            ))
        }
    };
    if client.session_timeout() != config.options.ttl {
        tracing::warn!(
            requested = ?config.options.ttl,
            negotiated = ?client.session_timeout(),
            "ZooKeeper negotiated a different session timeout; leases follow the shorter of the two, a crashed holder blocks others for the negotiated one"
        );
    }
    Ok(client)
}

/// The session a monitor follows: its state, epoch and id (as the server logs it).
struct Watched {
    watcher: zk::StateWatcher,
    epoch: u64,
    id: String,
}

impl Watched {
    fn of(client: &zk::Client, epoch: u64) -> Watched {
        Watched {
            watcher: client.state_watcher(),
            epoch,
            id: format!("{:#x}", client.session_id().0),
        }
    }
}

/// Follows the health of a session; replaces it when it ends. Exits when the lock client
/// is gone.
async fn monitor(session: Weak<Session>, mut watched: Watched) {
    loop {
        let state = watched.watcher.changed().await;
        let (epoch, id) = (watched.epoch, watched.id.as_str());
        let Some(shared) = session.upgrade() else {
            return;
        };
        match state {
            zk::SessionState::Disconnected => {
                tracing::debug!(epoch, session = id, "ZooKeeper session disconnected");
                shared.publish(epoch, SessionHealth::Suspended);
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                tracing::debug!(epoch, session = id, ?state, "ZooKeeper session connected");
                shared.publish(epoch, SessionHealth::Connected);
            }
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
                if shared.is_closed() =>
            {
                return;
            }
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed => {
                tracing::warn!(
                    epoch,
                    session = id,
                    ?state,
                    "ZooKeeper session ended; establishing a new one"
                );
                shared.expire(epoch);
                drop(shared);
                let Some(next) = reopen(&session).await else {
                    return;
                };
                watched = next;
            }
        }
    }
}

/// Establishes a replacement session, retrying until it works or the client is gone.
async fn reopen(session: &Weak<Session>) -> Option<Watched> {
    let mut backoff = reconnect_backoff();
    loop {
        let shared = session.upgrade()?;
        if shared.is_closed() {
            return None;
        }
        let config = shared.config.clone();
        drop(shared);
        match open(&config, config.connect_timeout).await {
            Ok(client) => {
                let shared = session.upgrade()?;
                let id = format!("{:#x}", client.session_id().0);
                let watcher = client.state_watcher();
                let epoch = shared.install(client)?;
                tracing::info!(epoch, session = id, "new ZooKeeper session established");
                return Some(Watched { watcher, epoch, id });
            }
            Err(err) => {
                tracing::warn!(error = %err, "ZooKeeper session not re-established yet");
                tokio::time::sleep(backoff.next_pause()).await;
            }
        }
    }
}
