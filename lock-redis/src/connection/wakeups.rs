//! The client's wake-up subscriptions: one pub/sub connection per server, shared by every
//! waiter of the client, reconnected with backoff. Queued waiters hear their wake-ups on
//! the client's own channel (a release names the waiter it wakes); without the queue,
//! waiters listen to the channel of the name they wait for.
//!
//! On Redis Cluster the channels are sharded (`SSUBSCRIBE`; the scripts `SPUBLISH`): each
//! lives on the primary serving its hash slot, a queued waiter's on its client's channel
//! for the name (see [`KeyLayout`](crate::KeyLayout)), so a client subscribes on the
//! primaries that serve the names it waits for, one connection each. When a slot moves
//! (the server ends the subscription, or answers `MOVED`) or a primary fails (the
//! connection drops and the reloaded map names another), the channel is subscribed again
//! where the map says, and its waiters re-check.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use lock_core::raw::{lock_unpoisoned, Backoff};
use redis::aio::{MultiplexedConnection, PubSubSink};
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::cluster::{redirect, slot_of};
use super::{reconnect_backoff, Shards, Target};

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
    /// A client's channel for a name (Redis Cluster, queue): its messages name the waiter.
    inbox: bool,
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
    /// The command queue of each server's subscriber task, started on first use (Redis
    /// Cluster: of each node seen, as [`Shards`] numbers them).
    tasks: Vec<Option<mpsc::UnboundedSender<SubCommand>>>,
    /// Redis Cluster: the node each channel is subscribed on.
    placed: HashMap<String, usize>,
    /// Redis Cluster: the channels whose subscription was refused, by refusals in a row.
    refusals: HashMap<String, u32>,
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
    /// Redis Cluster: where each channel lives.
    shards: Option<Arc<Shards>>,
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
    /// Wake-ups from `nodes` (on Redis Cluster: from the primaries of `shards`);
    /// `client_channel` is the client's own channel.
    pub(crate) fn new(
        backend: &'static str,
        nodes: Vec<(String, Target)>,
        shards: Option<Arc<Shards>>,
        request_timeout: Duration,
        client_channel: String,
    ) -> Self {
        let servers = nodes.len();
        Wakeups {
            shared: Arc::new(Shared {
                backend,
                nodes,
                shards,
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
                    placed: HashMap::new(),
                    refusals: HashMap::new(),
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
    ///
    /// On Redis Cluster `channel` is the client's channel for the name: it is joined (and
    /// subscribed on the name's shard if needed) for as long as the waiter stays, and the
    /// bell rings once it is live.
    pub(crate) fn enlist(
        &self,
        token: &str,
        node: usize,
        epoch: u64,
        channel: Option<&str>,
    ) -> Subscription {
        let mut registry = lock_unpoisoned(&self.shared.registry);
        if let Some(channel) = channel {
            let (bell, receiver) = watch::channel(Rings::default());
            claim(&mut registry.inbox, token, &bell);
            registry.inbox.bells.insert(token.to_owned(), bell);
            drop(self.member(&mut registry, channel, true));
            return Subscription {
                shared: Arc::clone(&self.shared),
                membership: Membership::Inbox(token.to_owned(), Some(channel.to_owned())),
                seen: Rings::default(),
                bell: receiver,
            };
        }
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
        claim(&mut registry.inbox, token, &bell);
        registry.inbox.bells.insert(token.to_owned(), bell);
        Subscription {
            shared: Arc::clone(&self.shared),
            membership: Membership::Inbox(token.to_owned(), None),
            seen: Rings::default(),
            bell: receiver,
        }
    }

    /// Starts the subscriber task of server `index`, if not yet.
    fn start(&self, registry: &mut Registry, index: usize) {
        start(&self.shared, registry, index);
    }

    /// One more waiter on `channel`: the receiver of its bell. A new channel is
    /// subscribed on every server (Redis Cluster: on the node its slot's primary).
    fn member(
        &self,
        registry: &mut Registry,
        channel: &str,
        inbox: bool,
    ) -> watch::Receiver<Rings> {
        if let Some(entry) = registry.channels.get_mut(channel) {
            entry.waiters += 1;
            return entry.bell.subscribe();
        }
        let (bell, receiver) = watch::channel(Rings::default());
        registry.channels.insert(
            channel.to_owned(),
            Channel {
                waiters: 1,
                bell,
                inbox,
            },
        );
        if self.shared.shards.is_some() {
            self.shared.place(registry, channel);
        } else {
            for index in 0..self.shared.nodes.len() {
                self.start(registry, index);
            }
            registry.send(|| SubCommand::Subscribe(channel.to_owned()));
        }
        receiver
    }

    /// Joins the channel of a name (without the queue) until the returned subscription is
    /// dropped; it rings once the subscription is live. Must be called inside a tokio
    /// runtime (it starts the subscriber tasks on first use).
    pub(crate) fn join(&self, channel: &str) -> Subscription {
        let mut registry = lock_unpoisoned(&self.shared.registry);
        let bell = self.member(&mut registry, channel, false);
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

/// Starts the subscriber task of server `index` (Redis Cluster: node), if not yet.
fn start(shared: &Arc<Shared>, registry: &mut Registry, index: usize) {
    if registry.tasks.len() <= index {
        registry.tasks.resize_with(index + 1, || None);
    }
    if registry.tasks[index].is_none() {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run_subscriber(Arc::downgrade(shared), index, receiver));
        registry.tasks[index] = Some(sender);
    }
}

/// Rings `bell` with the messages kept for `token` before it had a bell.
fn claim(inbox: &mut Inbox, token: &str, bell: &watch::Sender<Rings>) {
    inbox.unclaimed.retain(|(for_token, what)| {
        let mine = for_token == token;
        if mine {
            ring(bell, *what);
        }
        !mine
    });
}

/// Rings the bell of `channel`, and for a client's channel for a name every bell of the
/// client's queued waiters (which of them it serves is not known here: all look).
fn ring_channel(registry: &Registry, channel: &str) {
    if let Some(entry) = registry.channels.get(channel) {
        ring(&entry.bell, Ring::Wake);
        if entry.inbox {
            for bell in registry.inbox.bells.values() {
                ring(bell, Ring::Wake);
            }
        }
    }
}

impl Shared {
    /// Redis Cluster: subscribes `channel` on the node of its slot's primary as the map
    /// says now (any node seen while the map names none: its answer corrects the map).
    fn place(self: &Arc<Self>, registry: &mut Registry, channel: &str) {
        let Some(shards) = &self.shards else {
            return;
        };
        let index = shards.owner_index(slot_of(channel.as_bytes())).unwrap_or(0);
        if registry.placed.get(channel) == Some(&index) {
            return;
        }
        registry.placed.insert(channel.to_owned(), index);
        start(self, registry, index);
        if let Some(task) = &registry.tasks[index] {
            let _ = task.send(SubCommand::Subscribe(channel.to_owned()));
        }
    }

    /// Redis Cluster: subscribes `channel` again where the map says now (it was
    /// subscribed on node `from`, which no longer serves it). Its waiters re-check.
    fn replace(self: &Arc<Self>, from: usize, channel: &str) {
        let mut registry = lock_unpoisoned(&self.registry);
        if !registry.channels.contains_key(channel) {
            return;
        }
        if registry.placed.get(channel) == Some(&from) {
            registry.placed.remove(channel);
        }
        self.place(&mut registry, channel);
    }

    /// A message arrived on `channel`.
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let mut registry = lock_unpoisoned(&self.registry);
        let inbox = channel == registry.inbox.channel
            || registry.channels.get(channel).is_some_and(|c| c.inbox);
        if inbox {
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
        } else {
            registry.refusals.remove(channel);
            ring_channel(&registry, channel);
        }
    }

    /// Redis Cluster: node `index` refused to subscribe `channel` (a permission, the
    /// cluster down, a redirection to an address that cannot be read): its waiters
    /// re-check now, and it is placed again where the map says after a pause that grows
    /// with each refusal in a row.
    fn refused(self: &Arc<Self>, index: usize, channel: &str) {
        let pause = {
            let mut registry = lock_unpoisoned(&self.registry);
            if registry.placed.get(channel) == Some(&index) {
                registry.placed.remove(channel);
            }
            let refusals = registry.refusals.entry(channel.to_owned()).or_insert(0);
            *refusals = refusals.saturating_add(1);
            let pause = reconnect_backoff().after(*refusals);
            ring_channel(&registry, channel);
            pause
        };
        let (shared, channel) = (Arc::downgrade(self), channel.to_owned());
        tokio::spawn(async move {
            sleep(pause).await;
            let Some(s) = shared.upgrade() else {
                return;
            };
            let mut registry = lock_unpoisoned(&s.registry);
            if registry.channels.contains_key(&channel) {
                s.place(&mut registry, &channel);
            } else {
                registry.refusals.remove(&channel);
            }
        });
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
        if let Some(live) = lock_unpoisoned(&self.registry).inbox.live.get_mut(index) {
            *live = false;
        }
    }

    /// Redis Cluster: node `index`'s connection failed (the node may have failed over):
    /// reloads the slot map and subscribes its channels where it says now.
    async fn replace_all(self: &Arc<Self>, index: usize) {
        let Some(shards) = &self.shards else {
            return;
        };
        let deadline = Instant::now() + self.request_timeout;
        if let Err(err) = shards.reload(shards.version(), deadline).await {
            tracing::debug!(backend = self.backend, error = %err,
                "wake-up subscriptions: reloading the slot map failed");
        }
        for channel in self.channel_names(index) {
            self.replace(index, &channel);
        }
    }

    /// The channels server `index`'s subscriber listens to.
    fn channel_names(&self, index: usize) -> Vec<String> {
        let registry = lock_unpoisoned(&self.registry);
        if self.shards.is_some() {
            return registry
                .placed
                .iter()
                .filter(|(_, at)| **at == index)
                .map(|(channel, _)| channel.clone())
                .collect();
        }
        let mut names: Vec<String> = registry.channels.keys().cloned().collect();
        if registry.inbox.requested == Some(index) {
            names.push(registry.inbox.channel.clone());
        }
        names
    }

    fn leave(&self, membership: &Membership) {
        let mut registry = lock_unpoisoned(&self.registry);
        let channel = match membership {
            Membership::Inbox(token, channel) => {
                registry.inbox.bells.remove(token);
                match channel {
                    Some(channel) => channel,
                    None => return,
                }
            }
            Membership::Channel(channel) => channel,
        };
        let Some(entry) = registry.channels.get_mut(channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters == 0 {
            registry.channels.remove(channel);
            if self.shards.is_some() {
                let task = registry
                    .placed
                    .remove(channel)
                    .and_then(|at| registry.tasks.get(at)?.as_ref());
                if let Some(task) = task {
                    let _ = task.send(SubCommand::Unsubscribe(channel.to_owned()));
                }
            } else {
                registry.send(|| SubCommand::Unsubscribe(channel.to_owned()));
            }
        }
    }
}

/// What a subscription listens to.
#[derive(Debug)]
enum Membership {
    /// The channel of a name.
    Channel(String),
    /// The client's channel, for the queued waiter with this owner token (on Redis
    /// Cluster its channel for the name, joined as long as the waiter stays).
    Inbox(String, Option<String>),
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
    let sharded = shared.upgrade().is_some_and(|s| s.shards.is_some());
    loop {
        let outcome = if sharded {
            sharded_session(&shared, index, &mut commands, &mut backoff).await
        } else {
            subscriber_session(&shared, index, &mut commands, &mut backoff).await
        };
        match shared.upgrade() {
            Some(s) => {
                s.disconnected(index);
                if sharded {
                    s.replace_all(index).await;
                }
            }
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
    let Some(mut ping) = now_live(shared, index, backoff).await else {
        return Broken::Stop;
    };
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

/// Keeps one RESP3 connection to cluster node `index` subscribed (`SSUBSCRIBE`) to the
/// channels placed on it; a channel the node no longer serves (`MOVED`, or the server
/// ends its subscription when its slot moves) is placed again where the map says.
async fn sharded_session(
    shared: &Weak<Shared>,
    index: usize,
    commands: &mut mpsc::UnboundedReceiver<SubCommand>,
    backoff: &mut Backoff,
) -> Broken {
    let Some(s) = shared.upgrade() else {
        return Broken::Stop;
    };
    let (backend, limit) = (s.backend, s.request_timeout);
    let Some(shards) = s.shards.clone() else {
        return Broken::Stop;
    };
    drop(s);
    // A node with no channel placed on it (any more: its slots moved, it failed over) is
    // not connected to until one is. (The client is not kept alive meanwhile.)
    loop {
        match shared.upgrade() {
            None => return Broken::Stop,
            Some(s) if !s.channel_names(index).is_empty() => break,
            Some(_) => {}
        }
        if commands.recv().await.is_none() {
            return Broken::Stop;
        }
    }
    let (label, client) = match shards.pubsub_client(index) {
        Ok(found) => found,
        Err(err) => {
            tracing::debug!(backend, error = %err, "wake-up subscription: no client");
            return Broken::Reconnect;
        }
    };
    let (pushes, mut received) = mpsc::unbounded_channel::<PushInfo>();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_push_sender(pushes);
    let mut conn = match timeout(
        limit,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(err)) => {
            tracing::debug!(backend, node = %label, error = %err,
                "wake-up subscription: connect failed");
            return Broken::Reconnect;
        }
        Err(_) => return Broken::Reconnect,
    };
    let channels = match shared.upgrade() {
        Some(s) => s.channel_names(index),
        None => return Broken::Stop,
    };
    for channel in &channels {
        if !ssubscribe(shared, &shards, index, limit, &mut conn, channel).await {
            return Broken::Reconnect;
        }
    }
    let Some(mut ping) = now_live(shared, index, backoff).await else {
        return Broken::Stop;
    };
    // Channels this client asked to leave: their `sunsubscribe` is no displacement.
    let mut leaving: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return Broken::Stop,
                Some(SubCommand::Subscribe(channel)) => {
                    if !ssubscribe(shared, &shards, index, limit, &mut conn, &channel).await {
                        return Broken::Reconnect;
                    }
                }
                Some(SubCommand::Unsubscribe(channel)) => {
                    let mut cmd = redis::cmd("SUNSUBSCRIBE");
                    cmd.arg(&channel);
                    leaving.push(channel);
                    if !matches!(timeout(limit, cmd.query_async::<Value>(&mut conn)).await, Ok(Ok(_))) {
                        return Broken::Reconnect;
                    }
                }
            },
            push = received.recv() => {
                let Some(push) = push else {
                    return Broken::Reconnect;
                };
                let Some(s) = shared.upgrade() else {
                    return Broken::Stop;
                };
                let text = |i: usize| match push.data.get(i) {
                    Some(Value::BulkString(bytes)) => Some(bytes.clone()),
                    Some(Value::SimpleString(text)) => Some(text.clone().into_bytes()),
                    _ => None,
                };
                match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        if let (Some(channel), Some(payload)) = (text(0), text(1)) {
                            s.deliver(&String::from_utf8_lossy(&channel), &payload);
                        }
                    }
                    PushKind::SUnsubscribe => {
                        let Some(channel) = text(0) else { continue };
                        let channel = String::from_utf8_lossy(&channel).into_owned();
                        if let Some(i) = leaving.iter().position(|c| *c == channel) {
                            leaving.swap_remove(i);
                            continue;
                        }
                        // The server ended it: the slot moved. Reload and go where it is,
                        // aside, so that the other channels' messages keep coming.
                        let shards = Arc::clone(&shards);
                        tokio::spawn(async move {
                            let deadline = Instant::now() + limit;
                            let _ = shards.reload(shards.version(), deadline).await;
                            s.replace(index, &channel);
                        });
                    }
                    PushKind::Disconnection => return Broken::Reconnect,
                    _ => {}
                }
            }
            _ = ping.tick() => {
                let pong = timeout(limit, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return Broken::Reconnect;
                }
            }
        }
    }
}

/// `SSUBSCRIBE channel` on node `index`'s connection: `false` when the connection failed.
/// A `MOVED` reply updates the map and places the channel where it now says; once
/// subscribed, its waiters re-check; any other refusal is tried again after a pause
/// ([`Shared::refused`]).
async fn ssubscribe(
    shared: &Weak<Shared>,
    shards: &Shards,
    index: usize,
    limit: Duration,
    conn: &mut MultiplexedConnection,
    channel: &str,
) -> bool {
    let mut cmd = redis::cmd("SSUBSCRIBE");
    cmd.arg(channel);
    let reply = timeout(limit, cmd.query_async::<Value>(conn)).await;
    let Some(s) = shared.upgrade() else {
        return true;
    };
    match reply {
        Ok(Ok(_)) => {
            s.subscribed(index, channel);
            true
        }
        Ok(Err(err))
            if redirect(&err)
                .is_some_and(|addr| shards.moved(slot_of(channel.as_bytes()), &addr).is_ok()) =>
        {
            s.replace(index, channel);
            true
        }
        Ok(Err(err)) => {
            tracing::debug!(backend = s.backend, error = %err, channel,
                "wake-up subscription refused; tried again after a pause");
            s.refused(index, channel);
            !err.is_io_error() && !err.is_connection_dropped()
        }
        Err(_) => false,
    }
}

/// Server `index`'s connection subscribes every channel again: resets the backoff, has
/// every waiter re-check, and returns the keep-alive ticker (`None` when the client is
/// gone).
async fn now_live(
    shared: &Weak<Shared>,
    index: usize,
    backoff: &mut Backoff,
) -> Option<tokio::time::Interval> {
    backoff.reset();
    shared.upgrade()?.resubscribed(index);
    let mut ping = tokio::time::interval(SUBSCRIBER_PING);
    ping.tick().await;
    Some(ping)
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
