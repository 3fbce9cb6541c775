//! The client's wake-up subscriptions: one pub/sub connection per server, shared by every
//! waiter of the client, reconnected with backoff.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use lock_core::raw::{lock_unpoisoned, Backoff};
use redis::aio::PubSubSink;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout};

use super::reconnect_backoff;

/// How often an idle subscription connection is checked with `PING`.
const SUBSCRIBER_PING: Duration = Duration::from_secs(5);

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
        let channels = lock_unpoisoned(&self.shared.registry).channels.len();
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
        let mut registry = lock_unpoisoned(&self.shared.registry);
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
        lock_unpoisoned(&self.shared.registry).channels.len()
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
        if let Some(entry) = lock_unpoisoned(&self.registry).channels.get(channel) {
            entry.bell.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn ring_all(&self) {
        for entry in lock_unpoisoned(&self.registry).channels.values() {
            entry.bell.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn channel_names(&self) -> Vec<String> {
        lock_unpoisoned(&self.registry)
            .channels
            .keys()
            .cloned()
            .collect()
    }

    fn leave(&self, channel: &str) {
        let mut registry = lock_unpoisoned(&self.registry);
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
    let mut backoff = reconnect_backoff();
    loop {
        match subscriber_session(&shared, index, &mut commands, &mut backoff).await {
            Broken::Stop => return,
            Broken::Reconnect => {
                let pause = sleep(backoff.next_pause());
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
    backoff: &mut Backoff,
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
    backoff.reset();
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
