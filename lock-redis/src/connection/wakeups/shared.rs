//! What both wake-up transports share: the registry of channels and bells (its data in
//! `registry.rs`), the waiters' subscriptions, and the subscriber task that runs a
//! transport's session per server.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lock_core::raw::plumbing::{lock_unpoisoned, Backoff};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, Instant};

use super::bells::{parse, ring, Bell, Grant, Ring, Rings};
use super::registry::{claim, ring_channel, Channel, Inbox, Registry, SubCommand, UNCLAIMED};
use crate::connection::cluster::slot_of;
use crate::connection::{reconnect_backoff, Shards, Target};

/// How often an idle subscription connection is checked with `PING`.
const SUBSCRIBER_PING: Duration = Duration::from_secs(5);

/// How long a client's channel for a name (Redis Cluster, queue) stays subscribed after
/// its last waiter left. A client that queues on the name again meanwhile (a holder that
/// released and wants it back, a hot name) finds it live: no subscription round trip, and
/// no re-check when it goes live.
pub(super) const LINGER: Duration = Duration::from_millis(500);

/// What a transport's session works with: the registry (weakly: the client may go
/// meanwhile), the index of its server (Redis Cluster: node), the commands for its
/// subscriber task and the reconnection backoff.
pub(super) struct Task<'a>(
    pub(super) &'a Weak<Shared>,
    pub(super) usize,
    pub(super) &'a mut mpsc::UnboundedReceiver<SubCommand>,
    pub(super) &'a mut Backoff,
);

/// One connection's life in a transport: connects, subscribes what the registry lists for
/// the task's server, delivers messages and follows the task's commands until the
/// connection fails or the client is gone.
pub(super) type Session = for<'a> fn(Task<'a>) -> Pin<Box<dyn Future<Output = Broken> + Send + 'a>>;

pub(super) struct Shared {
    pub(super) backend: &'static str,
    pub(super) nodes: Vec<(String, Target)>,
    /// Redis Cluster: where each channel lives.
    pub(super) shards: Option<Arc<Shards>>,
    pub(super) request_timeout: Duration,
    registry: Mutex<Registry>,
    /// How often the client's channel was (re)subscribed.
    inbox_epoch: AtomicU64,
    /// The transport each subscriber task runs.
    session: Session,
}

impl Shared {
    /// The registry of wake-ups from `nodes` (on Redis Cluster: from the primaries of
    /// `shards`), each connection run by `session`; `client_channel` is the client's own
    /// channel.
    pub(super) fn new(
        backend: &'static str,
        nodes: Vec<(String, Target)>,
        shards: Option<Arc<Shards>>,
        request_timeout: Duration,
        client_channel: String,
        session: Session,
    ) -> Arc<Self> {
        let servers = nodes.len();
        Arc::new(Shared {
            backend,
            nodes,
            shards,
            request_timeout,
            session,
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
        })
    }

    /// The client channel's subscription count: taken before a queued attempt and handed
    /// to [`Shared::enlist`] after it.
    pub(super) fn epoch(&self) -> u64 {
        self.inbox_epoch.load(Ordering::Acquire)
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
    pub(super) fn enlist(
        self: &Arc<Self>,
        token: &str,
        node: usize,
        epoch: u64,
        channel: Option<&str>,
    ) -> Subscription {
        let mut registry = lock_unpoisoned(&self.registry);
        if let Some(channel) = channel {
            let (bell, receiver) = watch::channel(Rings::default());
            claim(&mut registry.inbox, token, &bell);
            registry.inbox.bells.insert(token.to_owned(), bell);
            drop(self.member(&mut registry, channel, true));
            return Subscription {
                shared: Arc::clone(self),
                membership: Membership::Inbox(token.to_owned(), Some(channel.to_owned())),
                bell: Bell::new(receiver),
            };
        }
        if registry.inbox.requested.is_none() {
            start(self, &mut registry, node);
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
            shared: Arc::clone(self),
            membership: Membership::Inbox(token.to_owned(), None),
            bell: Bell::new(receiver),
        }
    }

    /// One more waiter on `channel`: the receiver of its bell. A new channel is
    /// subscribed on every server (Redis Cluster: on the node its slot's primary).
    fn member(
        self: &Arc<Self>,
        registry: &mut Registry,
        channel: &str,
        inbox: bool,
    ) -> watch::Receiver<Rings> {
        if let Some(entry) = registry.channels.get_mut(channel) {
            entry.waiters += 1;
            entry.idle_since = None;
            return entry.bell.subscribe();
        }
        let (bell, receiver) = watch::channel(Rings::default());
        registry.channels.insert(
            channel.to_owned(),
            Channel {
                waiters: 1,
                bell,
                inbox,
                idle_since: None,
            },
        );
        if self.shards.is_some() {
            self.place(registry, channel);
        } else {
            for index in 0..self.nodes.len() {
                start(self, registry, index);
            }
            registry.send(|| SubCommand::Subscribe(channel.to_owned()));
        }
        receiver
    }

    /// Joins the channel of a name (without the queue) until the returned subscription is
    /// dropped; it rings once the subscription is live. Must be called inside a tokio
    /// runtime (it starts the subscriber tasks on first use).
    pub(super) fn join(self: &Arc<Self>, channel: &str) -> Subscription {
        let mut registry = lock_unpoisoned(&self.registry);
        let bell = self.member(&mut registry, channel, false);
        Subscription {
            shared: Arc::clone(self),
            membership: Membership::Channel(channel.to_owned()),
            bell: Bell::new(bell),
        }
    }

    /// Channels this client listens to right now (for tests and diagnostics): its own
    /// once a waiter queued, and the names' channels that have a waiter without the queue.
    pub(super) fn active_channels(&self) -> usize {
        let registry = lock_unpoisoned(&self.registry);
        registry.channels.len() + usize::from(registry.inbox.requested.is_some())
    }

    /// Queued waiters with a bell right now (for tests and diagnostics).
    pub(super) fn queued_waiters(&self) -> usize {
        lock_unpoisoned(&self.registry).inbox.bells.len()
    }

    /// Channels of names with a waiter right now.
    pub(super) fn channel_count(&self) -> usize {
        lock_unpoisoned(&self.registry).channels.len()
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
    pub(super) fn replace(self: &Arc<Self>, from: usize, channel: &str) {
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
    pub(super) fn deliver(&self, channel: &str, payload: &[u8]) {
        let mut registry = lock_unpoisoned(&self.registry);
        let inbox = channel == registry.inbox.channel
            || registry.channels.get(channel).is_some_and(|c| c.inbox);
        if inbox {
            let Some((what, token)) = std::str::from_utf8(payload).ok().and_then(parse) else {
                tracing::debug!(
                    backend = self.backend,
                    channel,
                    "wake-up message of an unknown form"
                );
                return;
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
    pub(super) fn subscribed(&self, index: usize, channel: &str) {
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
    pub(super) fn refused(self: &Arc<Self>, index: usize, channel: &str) {
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
    pub(super) fn resubscribed(&self, index: usize) {
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
    pub(super) fn disconnected(&self, index: usize) {
        if let Some(live) = lock_unpoisoned(&self.registry).inbox.live.get_mut(index) {
            *live = false;
        }
    }

    /// Redis Cluster: node `index`'s connection failed (the node may have failed over):
    /// reloads the slot map and subscribes its channels where it says now.
    pub(super) async fn replace_all(self: &Arc<Self>, index: usize) {
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
    pub(super) fn channel_names(&self, index: usize) -> Vec<String> {
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

    fn leave(self: &Arc<Self>, membership: &Membership) {
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
        if entry.waiters > 0 {
            return;
        }
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(runtime) if entry.inbox => {
                entry.idle_since = Some(Instant::now());
                let (shared, channel) = (Arc::downgrade(self), channel.to_owned());
                runtime.spawn(async move {
                    sleep(LINGER).await;
                    if let Some(s) = shared.upgrade() {
                        let mut registry = lock_unpoisoned(&s.registry);
                        let idle = registry.channels.get(&channel).and_then(|c| c.idle_since);
                        if idle.is_some_and(|since| since.elapsed() >= LINGER) {
                            s.unsubscribe(&mut registry, &channel);
                        }
                    }
                });
            }
            _ => self.unsubscribe(&mut registry, channel),
        }
    }

    /// Forgets `channel` and unsubscribes it.
    fn unsubscribe(&self, registry: &mut Registry, channel: &str) {
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
    bell: Bell,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Forgets the rings so far: the next wait is for a later one.
    pub(crate) fn mark(&mut self) {
        self.bell.mark();
    }

    /// See [`Bell::wait`].
    pub(crate) async fn wait(&mut self, nap: Duration, window: Duration) -> Option<Grant> {
        self.bell.wait(nap, window).await
    }

    /// Waits for the next ring: a message on the channel, its subscription made live
    /// (first, or again after a reconnect: a message may have been missed meanwhile).
    pub(crate) async fn rung(&mut self) {
        self.bell.rung().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.leave(&self.membership);
    }
}

/// Why a subscriber connection was given up.
pub(super) enum Broken {
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
    let Some((session, sharded)) = shared.upgrade().map(|s| (s.session, s.shards.is_some())) else {
        return;
    };
    loop {
        let outcome = session(Task(&shared, index, &mut commands, &mut backoff)).await;
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

/// Server `index`'s connection subscribes every channel again: resets the backoff, has
/// every waiter re-check, and returns the keep-alive ticker (`None` when the client is
/// gone).
pub(super) async fn now_live(
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
