//! Connections: one multiplexed connection per server, with a deadline on every call and
//! reconnection with backoff; and the client's wake-up subscriptions (one pub/sub
//! connection per server, shared by every waiter of the client).

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use lock_core::{Error, Result};
use redis::aio::{MultiplexedConnection, PubSubSink};
use redis::{AsyncConnectionConfig, FromRedisValue, ScriptInvocation};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout, timeout_at, Instant};

use crate::config::{twice_listed, RedisNode};
use crate::error;

/// First pause before reconnecting after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often an idle subscription connection is checked with `PING`.
const SUBSCRIBER_PING: Duration = Duration::from_secs(5);

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn backoff(failures: u32) -> Duration {
    MIN_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(10))
        .min(MAX_BACKOFF)
}

/// Rejects RedLock servers that resolve to a common address (`localhost:6379` and
/// `127.0.0.1:6379` are one server, which would cast several votes). A name that does not
/// resolve by `deadline` is left to the connection, which counts it as a server down.
///
/// # Errors
/// [`Error::InvalidConfig`] naming two servers and the address they share.
pub(crate) async fn reject_aliases(nodes: &[RedisNode], deadline: Instant) -> Result<()> {
    let resolved = futures::future::join_all(nodes.iter().map(|node| async move {
        match timeout_at(
            deadline,
            tokio::net::lookup_host((node.host.as_str(), node.port)),
        )
        .await
        {
            Ok(Ok(addrs)) => addrs
                .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
                .collect(),
            _ => Vec::new(),
        }
    }))
    .await;
    let mut owner: HashMap<SocketAddr, usize> = HashMap::new();
    for (i, addrs) in resolved.into_iter().enumerate() {
        for addr in addrs {
            match owner.get(&addr) {
                Some(&j) if j != i => return Err(twice_listed(&nodes[j], &nodes[i], Some(addr))),
                _ => {
                    owner.insert(addr, i);
                }
            }
        }
    }
    Ok(())
}

/// The current connection of a node and its reconnection state.
#[derive(Default)]
struct Slot {
    conn: Option<(u64, MultiplexedConnection)>,
    generation: u64,
    failures: u32,
    retry_at: Option<Instant>,
}

/// One Redis server: a lazily (re)connected multiplexed connection.
pub(crate) struct Node {
    backend: &'static str,
    /// `host:port`, for messages (never credentials).
    pub(crate) label: String,
    client: redis::Client,
    connect_timeout: Duration,
    slot: Mutex<Slot>,
    /// Serializes connection attempts.
    connecting: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node").field("label", &self.label).finish()
    }
}

impl Node {
    pub(crate) fn new(
        backend: &'static str,
        label: String,
        client: redis::Client,
        connect_timeout: Duration,
    ) -> Self {
        Node {
            backend,
            label,
            client,
            connect_timeout,
            slot: Mutex::new(Slot::default()),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The current connection, connecting first if there is none (unless a recent failure
    /// asks to wait: then the call fails at once rather than hammering a dead server).
    async fn connection(&self, deadline: Instant) -> Result<(u64, MultiplexedConnection)> {
        if let Some(conn) = locked(&self.slot).conn.clone() {
            return Ok(conn);
        }
        let _serial = timeout_at(deadline, self.connecting.lock())
            .await
            .map_err(|_| self.deadline_error("connect", deadline))?;
        {
            let slot = locked(&self.slot);
            if let Some(conn) = slot.conn.clone() {
                return Ok(conn);
            }
            if let Some(at) = slot.retry_at.filter(|at| *at > Instant::now()) {
                return Err(Error::Connection {
                    backend: self.backend,
                    message: format!(
                        "{} is unreachable ({} failed connection attempts); next attempt in {:?}",
                        self.label,
                        slot.failures,
                        at - Instant::now()
                    ),
                    source: None,
                });
            }
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        let attempt = self
            .client
            .get_multiplexed_async_connection_with_config(&config);
        let outcome = timeout_at(deadline, attempt).await;
        let mut slot = locked(&self.slot);
        match outcome {
            Ok(Ok(conn)) => {
                slot.generation += 1;
                slot.failures = 0;
                slot.retry_at = None;
                let entry = (slot.generation, conn);
                slot.conn = Some(entry.clone());
                Ok(entry)
            }
            Ok(Err(err)) => {
                slot.failures += 1;
                slot.retry_at = Some(Instant::now() + backoff(slot.failures));
                Err(error::map(self.backend, "connect", &self.label, err))
            }
            Err(_) => {
                slot.failures += 1;
                slot.retry_at = Some(Instant::now() + backoff(slot.failures));
                Err(self.deadline_error("connect", deadline))
            }
        }
    }

    /// Forgets connection `generation` so that the next call reconnects.
    fn invalidate(&self, generation: u64) {
        let mut slot = locked(&self.slot);
        if slot.conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            slot.conn = None;
        }
    }

    fn deadline_error(&self, what: &str, deadline: Instant) -> Error {
        let limit = deadline.saturating_duration_since(Instant::now());
        error::deadline(
            self.backend,
            what,
            &self.label,
            limit.max(Duration::from_millis(1)),
        )
    }

    /// Runs a script (EVALSHA, loading it on `NOSCRIPT`) with a deadline.
    ///
    /// A connection that turns out broken (the server restarted, the network reset it)
    /// is replaced and the script is sent once more on the new one, within the same
    /// deadline. Every script of this crate may safely run twice: acquire recognizes
    /// its own token, renew and release compare it.
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        what: &str,
        deadline: Instant,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let started = Instant::now();
        let mut retried = false;
        loop {
            let (generation, mut conn) = self.connection(deadline).await?;
            match timeout_at(deadline, invocation.invoke_async::<T>(&mut conn)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) => {
                    if error::breaks_connection(&err) {
                        self.invalidate(generation);
                        if !retried && err.is_connection_dropped() {
                            retried = true;
                            continue;
                        }
                    }
                    return Err(error::map(self.backend, what, &self.label, err));
                }
                Err(_) => {
                    // A reply may still arrive, or be lost for good: a fresh connection
                    // keeps later replies from being paired with the wrong request.
                    self.invalidate(generation);
                    return Err(error::deadline(
                        self.backend,
                        what,
                        &self.label,
                        deadline.saturating_duration_since(started),
                    ));
                }
            }
        }
    }

    /// Connects now (if not connected) to check that the server answers.
    pub(crate) async fn ping(&self, deadline: Instant) -> Result<()> {
        let (generation, mut conn) = self.connection(deadline).await?;
        let reply = timeout_at(
            deadline,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => {
                self.invalidate(generation);
                Err(error::map(self.backend, "PING", &self.label, err))
            }
            Err(_) => {
                self.invalidate(generation);
                Err(self.deadline_error("PING", deadline))
            }
        }
    }
}

/// A change to the set of channels a subscriber task listens to.
#[derive(Debug)]
enum SubCommand {
    Subscribe(String),
    Unsubscribe(String),
}

struct Channel {
    waiters: usize,
    bell: watch::Sender<u64>,
}

struct Registry {
    channels: HashMap<String, Channel>,
    /// One command queue per subscriber task (one per server), started on first use.
    tasks: Option<Vec<mpsc::UnboundedSender<SubCommand>>>,
}

/// The wake-up subscriptions of one client: waiters join a channel; one subscriber task
/// per server listens on one pub/sub connection for all of them and rings the channel's
/// bell on each message (and after every (re)subscription, as a message may have been
/// missed meanwhile).
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
}

struct Shared {
    backend: &'static str,
    nodes: Vec<(String, redis::Client)>,
    request_timeout: Duration,
    registry: Mutex<Registry>,
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let channels = locked(&self.shared.registry).channels.len();
        f.debug_struct("Wakeups")
            .field("channels", &channels)
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    pub(crate) fn new(
        backend: &'static str,
        nodes: Vec<(String, redis::Client)>,
        request_timeout: Duration,
    ) -> Self {
        Wakeups {
            shared: Arc::new(Shared {
                backend,
                nodes,
                request_timeout,
                registry: Mutex::new(Registry {
                    channels: HashMap::new(),
                    tasks: None,
                }),
            }),
        }
    }

    /// Joins `channel` until the returned subscription is dropped. Must be called inside
    /// a tokio runtime (it starts the subscriber tasks on first use).
    pub(crate) fn join(&self, channel: &str) -> Subscription {
        let mut registry = locked(&self.shared.registry);
        if registry.tasks.is_none() {
            let senders = self
                .shared
                .nodes
                .iter()
                .enumerate()
                .map(|(index, _)| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    tokio::spawn(run_subscriber(
                        Arc::downgrade(&self.shared),
                        index,
                        receiver,
                    ));
                    sender
                })
                .collect();
            registry.tasks = Some(senders);
        }
        let bell = match registry.channels.get_mut(channel) {
            Some(entry) => {
                entry.waiters += 1;
                entry.bell.subscribe()
            }
            None => {
                let (bell, receiver) = watch::channel(0);
                registry
                    .channels
                    .insert(channel.to_owned(), Channel { waiters: 1, bell });
                registry.send(|| SubCommand::Subscribe(channel.to_owned()));
                receiver
            }
        };
        Subscription {
            shared: Arc::clone(&self.shared),
            channel: channel.to_owned(),
            bell,
        }
    }

    /// Channels with at least one waiter (for tests and diagnostics).
    pub(crate) fn active_channels(&self) -> usize {
        locked(&self.shared.registry).channels.len()
    }
}

impl Registry {
    fn send(&self, command: impl Fn() -> SubCommand) {
        for sender in self.tasks.iter().flatten() {
            // Fails only when the task ended, i.e. the client is going away.
            let _ = sender.send(command());
        }
    }
}

impl Shared {
    fn ring(&self, channel: &str) {
        if let Some(entry) = locked(&self.registry).channels.get(channel) {
            entry.bell.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn ring_all(&self) {
        for entry in locked(&self.registry).channels.values() {
            entry.bell.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn channel_names(&self) -> Vec<String> {
        locked(&self.registry).channels.keys().cloned().collect()
    }

    fn leave(&self, channel: &str) {
        let mut registry = locked(&self.registry);
        let Some(entry) = registry.channels.get_mut(channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters == 0 {
            registry.channels.remove(channel);
            registry.send(|| SubCommand::Unsubscribe(channel.to_owned()));
        }
    }
}

/// A waiter's membership in a wake-up channel; leaving happens on drop.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    bell: watch::Receiver<u64>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Forgets the rings so far: [`Subscription::rung`] waits for the next one.
    pub(crate) fn mark(&mut self) {
        self.bell.borrow_and_update();
    }

    /// Waits for a ring after the last [`Subscription::mark`].
    pub(crate) async fn rung(&mut self) {
        if self.bell.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.leave(&self.channel);
    }
}

/// Why a subscriber connection was given up.
enum Broken {
    /// The client is gone: stop.
    Stop,
    /// The connection failed: reconnect.
    Reconnect,
}

/// Keeps one pub/sub connection to server `index` subscribed to the registry's channels.
async fn run_subscriber(
    shared: Weak<Shared>,
    index: usize,
    mut commands: mpsc::UnboundedReceiver<SubCommand>,
) {
    let mut failures = 0u32;
    loop {
        match subscriber_session(&shared, index, &mut commands, &mut failures).await {
            Broken::Stop => return,
            Broken::Reconnect => {
                failures = failures.saturating_add(1);
                let pause = sleep(backoff(failures));
                tokio::pin!(pause);
                // Keep draining commands while waiting: the registry is re-read on connect.
                loop {
                    tokio::select! {
                        () = &mut pause => break,
                        command = commands.recv() => if command.is_none() { return },
                    }
                }
            }
        }
    }
}

async fn subscriber_session(
    shared: &Weak<Shared>,
    index: usize,
    commands: &mut mpsc::UnboundedReceiver<SubCommand>,
    failures: &mut u32,
) -> Broken {
    let (backend, label, client, limit) = match shared.upgrade() {
        Some(s) => (
            s.backend,
            s.nodes[index].0.clone(),
            s.nodes[index].1.clone(),
            s.request_timeout,
        ),
        None => return Broken::Stop,
    };
    let pubsub = match timeout(limit, client.get_async_pubsub()).await {
        Ok(Ok(pubsub)) => pubsub,
        Ok(Err(err)) => {
            tracing::debug!(backend, node = %label, error = %err, "wake-up subscription: connect failed");
            return Broken::Reconnect;
        }
        Err(_) => return Broken::Reconnect,
    };
    let (mut sink, mut stream) = pubsub.split();
    let channels = match shared.upgrade() {
        Some(s) => s.channel_names(),
        None => return Broken::Stop,
    };
    if !channels.is_empty() && !call(limit, sink.subscribe(&channels)).await {
        return Broken::Reconnect;
    }
    *failures = 0;
    match shared.upgrade() {
        // Anything published while we were not subscribed is lost: everyone re-checks.
        Some(s) => s.ring_all(),
        None => return Broken::Stop,
    }
    let mut ping = tokio::time::interval(SUBSCRIBER_PING);
    ping.tick().await;
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return Broken::Stop,
                Some(SubCommand::Subscribe(channel)) => {
                    if !call(limit, sink.subscribe(&channel)).await {
                        return Broken::Reconnect;
                    }
                    match shared.upgrade() {
                        Some(s) => s.ring(&channel),
                        None => return Broken::Stop,
                    }
                }
                Some(SubCommand::Unsubscribe(channel)) => {
                    if !call(limit, sink.unsubscribe(&channel)).await {
                        return Broken::Reconnect;
                    }
                }
            },
            message = stream.next() => match (message, shared.upgrade()) {
                (Some(message), Some(s)) => s.ring(message.get_channel_name()),
                (None, _) => return Broken::Reconnect,
                (_, None) => return Broken::Stop,
            },
            _ = ping.tick() => {
                if !ping_ok(limit, &mut sink).await {
                    return Broken::Reconnect;
                }
            }
        }
    }
}

async fn call(
    limit: Duration,
    request: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> bool {
    matches!(timeout(limit, request).await, Ok(Ok(())))
}

async fn ping_ok(limit: Duration, sink: &mut PubSubSink) -> bool {
    matches!(timeout(limit, sink.ping::<String>()).await, Ok(Ok(_)))
}
