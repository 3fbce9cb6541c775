//! The client's wake-up subscriptions: one pub/sub connection per server, shared by every
//! waiter of the client, reconnected with backoff. Queued waiters hear their wake-ups on
//! the client's own channel (a release names the waiter it wakes); without the queue,
//! waiters listen to the channel of the name they wait for.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use lock_core::raw::{lock_unpoisoned, Backoff};
use redis::aio::PubSubSink;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::{reconnect_backoff, Target};

/// How often an idle subscription connection is checked with `PING`.
const SUBSCRIBER_PING: Duration = Duration::from_secs(5);

/// A change to the set of channels a subscriber task listens to.
#[derive(Debug)]
enum SubCommand {
    Subscribe(String),
    Unsubscribe(String),
}

/// What a bell has rung so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Rings {
    wake: u64,
    standby: u64,
}

/// What a waiter was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ring {
    /// Try now.
    Wake,
    /// The waiter ahead was woken: try if it has not taken the lock within the hand-off
    /// window.
    Standby,
}

fn ring(bell: &watch::Sender<Rings>, what: Ring) {
    bell.send_modify(|rings| match what {
        Ring::Wake => rings.wake = rings.wake.wrapping_add(1),
        Ring::Standby => rings.standby = rings.standby.wrapping_add(1),
    });
}

struct Channel {
    waiters: usize,
    bell: watch::Sender<Rings>,
}

/// The client's own channel and the bells of its queued waiters.
struct Inbox {
    channel: String,
    /// The server on which its subscription was asked for (it then stays for the client's
    /// life): the one whose queue orders the waiters.
    requested: Option<usize>,
    /// Per server: the subscription is confirmed on the current connection.
    live: Vec<bool>,
    /// Bells by owner token.
    bells: HashMap<String, watch::Sender<Rings>>,
    /// The latest messages for waiters without a bell yet (a release can wake a waiter
    /// between its queued attempt and its bell), at most [`UNCLAIMED`].
    unclaimed: VecDeque<(String, Ring)>,
}

/// How many messages for waiters without a bell are kept.
const UNCLAIMED: usize = 256;

struct Registry {
    channels: HashMap<String, Channel>,
    inbox: Inbox,
    /// The command queue of each server's subscriber task, started on first use.
    tasks: Vec<Option<mpsc::UnboundedSender<SubCommand>>>,
}

/// The wake-up subscriptions of one client. One subscriber task per server listens on one
/// pub/sub connection for all waiters of the client and rings the bell of the waiter (queue)
/// or of the channel (without the queue) a message is for, and every bell after every
/// (re)subscription, as a message may have been missed meanwhile.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
}

struct Shared {
    backend: &'static str,
    nodes: Vec<(String, Target)>,
    request_timeout: Duration,
    registry: Mutex<Registry>,
    /// How often the client's channel was (re)subscribed.
    inbox_epoch: AtomicU64,
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
    /// Wake-ups from `nodes`; `client_channel` is the client's own channel.
    pub(crate) fn new(
        backend: &'static str,
        nodes: Vec<(String, Target)>,
        request_timeout: Duration,
        client_channel: String,
    ) -> Self {
        let servers = nodes.len();
        Wakeups {
            shared: Arc::new(Shared {
                backend,
                nodes,
                request_timeout,
                registry: Mutex::new(Registry {
                    channels: HashMap::new(),
                    inbox: Inbox {
                        channel: client_channel,
                        requested: None,
                        live: vec![false; servers],
                        bells: HashMap::new(),
                        unclaimed: VecDeque::new(),
                    },
                    tasks: (0..servers).map(|_| None).collect(),
                }),
                inbox_epoch: AtomicU64::new(0),
            }),
        }
    }

    /// The client channel's subscription count: taken before a queued attempt and handed
    /// to [`Wakeups::enlist`] after it.
    pub(crate) fn epoch(&self) -> u64 {
        self.shared.inbox_epoch.load(Ordering::Acquire)
    }

    /// The bell of queued waiter `token`, subscribing the client's channel on server `node`
    /// first if needed. It rings with the messages for `token` that came before it, and
    /// once more when the subscription was (re)made since `epoch` (a message may have been
    /// lost meanwhile) or is not live yet (then when it is). Must be called inside a tokio
    /// runtime (it starts the subscriber task on first use).
    pub(crate) fn enlist(&self, token: &str, node: usize, epoch: u64) -> Subscription {
        let mut registry = lock_unpoisoned(&self.shared.registry);
        if registry.inbox.requested.is_none() {
            self.start(&mut registry, node);
            registry.inbox.requested = Some(node);
            let channel = registry.inbox.channel.clone();
            if let Some(task) = &registry.tasks[node] {
                let _ = task.send(SubCommand::Subscribe(channel));
            }
        }
        let live = registry.inbox.live[node];
        let (bell, receiver) = watch::channel(Rings::default());
        if live && self.epoch() != epoch {
            ring(&bell, Ring::Wake);
        }
        let inbox = &mut registry.inbox;
        inbox.unclaimed.retain(|(for_token, what)| {
            let mine = for_token == token;
            if mine {
                ring(&bell, *what);
            }
            !mine
        });
        inbox.bells.insert(token.to_owned(), bell);
        Subscription {
            shared: Arc::clone(&self.shared),
            membership: Membership::Inbox(token.to_owned()),
            seen: Rings::default(),
            bell: receiver,
        }
    }

    /// Starts the subscriber task of server `index`, if not yet.
    fn start(&self, registry: &mut Registry, index: usize) {
        if registry.tasks[index].is_none() {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(run_subscriber(
                Arc::downgrade(&self.shared),
                index,
                receiver,
            ));
            registry.tasks[index] = Some(sender);
        }
    }

    /// Joins the channel of a name (without the queue) until the returned subscription is
    /// dropped; it rings once the subscription is live. Must be called inside a tokio
    /// runtime (it starts the subscriber tasks on first use).
    pub(crate) fn join(&self, channel: &str) -> Subscription {
        let mut registry = lock_unpoisoned(&self.shared.registry);
        for index in 0..self.shared.nodes.len() {
            self.start(&mut registry, index);
        }
        let bell = match registry.channels.get_mut(channel) {
            Some(entry) => {
                entry.waiters += 1;
                entry.bell.subscribe()
            }
            None => {
                let (bell, receiver) = watch::channel(Rings::default());
                registry
                    .channels
                    .insert(channel.to_owned(), Channel { waiters: 1, bell });
                registry.send(|| SubCommand::Subscribe(channel.to_owned()));
                receiver
            }
        };
        Subscription {
            shared: Arc::clone(&self.shared),
            membership: Membership::Channel(channel.to_owned()),
            seen: Rings::default(),
            bell,
        }
    }

    /// Channels this client listens to right now (for tests and diagnostics): its own
    /// once a waiter queued, and the names' channels that have a waiter without the queue.
    pub(crate) fn active_channels(&self) -> usize {
        let registry = lock_unpoisoned(&self.shared.registry);
        registry.channels.len() + usize::from(registry.inbox.requested.is_some())
    }

    /// Queued waiters with a bell right now (for tests and diagnostics).
    pub(crate) fn queued_waiters(&self) -> usize {
        lock_unpoisoned(&self.shared.registry).inbox.bells.len()
    }
}

impl Registry {
    /// Sends `command` to every started subscriber task.
    fn send(&self, command: impl Fn() -> SubCommand) {
        for sender in self.tasks.iter().flatten() {
            // Fails only when the task ended, i.e. the client is going away.
            let _ = sender.send(command());
        }
    }
}

impl Shared {
    /// A message arrived on `channel`.
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let mut registry = lock_unpoisoned(&self.registry);
        if channel == registry.inbox.channel {
            let (what, token) = match std::str::from_utf8(payload)
                .ok()
                .and_then(|p| p.split_once(' '))
            {
                Some(("wake", token)) => (Ring::Wake, token),
                Some(("standby", token)) => (Ring::Standby, token),
                _ => {
                    tracing::debug!(
                        backend = self.backend,
                        channel,
                        "wake-up message of an unknown form"
                    );
                    return;
                }
            };
            match registry.inbox.bells.get(token) {
                Some(bell) => ring(bell, what),
                None => {
                    let unclaimed = &mut registry.inbox.unclaimed;
                    if unclaimed.len() == UNCLAIMED {
                        unclaimed.pop_front();
                    }
                    unclaimed.push_back((token.to_owned(), what));
                }
            }
        } else if let Some(entry) = registry.channels.get(channel) {
            ring(&entry.bell, Ring::Wake);
        }
    }

    /// `channel` is subscribed on server `index`'s current connection.
    fn subscribed(&self, index: usize, channel: &str) {
        let mut registry = lock_unpoisoned(&self.registry);
        if channel == registry.inbox.channel {
            registry.inbox.live[index] = true;
            self.inbox_epoch.fetch_add(1, Ordering::AcqRel);
            for bell in registry.inbox.bells.values() {
                ring(bell, Ring::Wake);
            }
        } else if let Some(entry) = registry.channels.get(channel) {
            ring(&entry.bell, Ring::Wake);
        }
    }

    /// Every channel is subscribed on server `index`'s new connection: anything published
    /// while it was not is lost, so every waiter re-checks.
    fn resubscribed(&self, index: usize) {
        let mut registry = lock_unpoisoned(&self.registry);
        if registry.inbox.requested == Some(index) {
            registry.inbox.live[index] = true;
            self.inbox_epoch.fetch_add(1, Ordering::AcqRel);
        }
        let bells = registry.channels.values().map(|c| &c.bell);
        for bell in bells.chain(registry.inbox.bells.values()) {
            ring(bell, Ring::Wake);
        }
    }

    /// Server `index`'s subscriber connection is gone.
    fn disconnected(&self, index: usize) {
        lock_unpoisoned(&self.registry).inbox.live[index] = false;
    }

    /// The channels server `index`'s subscriber listens to.
    fn channel_names(&self, index: usize) -> Vec<String> {
        let registry = lock_unpoisoned(&self.registry);
        let mut names: Vec<String> = registry.channels.keys().cloned().collect();
        if registry.inbox.requested == Some(index) {
            names.push(registry.inbox.channel.clone());
        }
        names
    }

    fn leave(&self, membership: &Membership) {
        let mut registry = lock_unpoisoned(&self.registry);
        let channel = match membership {
            Membership::Inbox(token) => {
                registry.inbox.bells.remove(token);
                return;
            }
            Membership::Channel(channel) => channel,
        };
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

/// What a subscription listens to.
#[derive(Debug)]
enum Membership {
    /// The channel of a name.
    Channel(String),
    /// The client's channel, for the queued waiter with this owner token.
    Inbox(String),
}

/// A waiter's bell; leaving happens on drop.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    membership: Membership,
    /// The rings already acted on.
    seen: Rings,
    bell: watch::Receiver<Rings>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Forgets the rings so far: [`Subscription::rung`] waits for the next one.
    pub(crate) fn mark(&mut self) {
        self.seen = *self.bell.borrow_and_update();
    }

    /// Waits for a ring after the last one seen (wake-ups before stand-by notices).
    pub(crate) async fn rung(&mut self) -> Ring {
        loop {
            let now = *self.bell.borrow_and_update();
            let seen = std::mem::replace(&mut self.seen, now);
            if now.wake != seen.wake {
                return Ring::Wake;
            }
            if now.standby != seen.standby {
                return Ring::Standby;
            }
            if self.bell.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until woken or until `nap` has passed; a stand-by notice shortens the wait to
    /// `window` from the notice.
    pub(crate) async fn wait(&mut self, nap: Duration, window: Duration) {
        let mut until = Instant::now() + nap;
        loop {
            tokio::select! {
                ring = self.rung() => match ring {
                    Ring::Wake => return,
                    Ring::Standby => until = until.min(Instant::now() + window),
                },
                () = sleep_until(until) => return,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.leave(&self.membership);
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
        let outcome = subscriber_session(&shared, index, &mut commands, &mut backoff).await;
        match shared.upgrade() {
            Some(s) => s.disconnected(index),
            None => return,
        }
        match outcome {
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
    let (backend, label, target, limit) = match shared.upgrade() {
        Some(s) => (
            s.backend,
            s.nodes[index].0.clone(),
            s.nodes[index].1.clone(),
            s.request_timeout,
        ),
        None => return Broken::Stop,
    };
    // Behind Sentinels, each (re)connection goes to the primary they name then.
    let connect = async {
        let client = target.client(Instant::now() + limit).await.ok()?;
        Some(client.get_async_pubsub().await)
    };
    let pubsub = match timeout(limit, connect).await {
        Ok(Some(Ok(pubsub))) => pubsub,
        Ok(None) => return Broken::Reconnect,
        Ok(Some(Err(err))) => {
            tracing::debug!(backend, node = %label, error = %err, "wake-up subscription: connect failed");
            return Broken::Reconnect;
        }
        Err(_) => return Broken::Reconnect,
    };
    let (mut sink, mut stream) = pubsub.split();
    let channels = match shared.upgrade() {
        Some(s) => s.channel_names(index),
        None => return Broken::Stop,
    };
    if !channels.is_empty() && !call(limit, sink.subscribe(&channels)).await {
        return Broken::Reconnect;
    }
    backoff.reset();
    match shared.upgrade() {
        Some(s) => s.resubscribed(index),
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
                        Some(s) => s.subscribed(index, &channel),
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
                (Some(message), Some(s)) => {
                    s.deliver(message.get_channel_name(), message.get_payload_bytes());
                }
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
