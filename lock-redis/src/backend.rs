//! The Redis backend: [`RedisBackend`], how it opens ([`Connect`]) and how it acquires,
//! renews and releases ([`Backend`]) on one server or, through [`crate::redlock`], on a
//! majority of several.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use lock_core::raw::{
    AcquireRequest, Acquired, Backend, BackendRelease, Background, Cleanup, CleanupOnDrop, Connect,
    LockUrl, RenewItem, RenewOutcome,
};
use lock_core::{
    Capabilities, Error, FencingSource, FencingToken, LockName, LockOptions, Occupancy,
    Participant, Result,
};
use rand::Rng;
use redis::Script;
use tokio::time::{sleep, Instant};

use crate::config::RedisConfig;
use crate::connection::{
    reconnect_backoff, redis_client, slot_of, Node, Route, Sentinels, Shards, Subscription, Target,
    Wakeups,
};
use crate::error;
use crate::hold::{floor_arg, ttl_millis, HoldKeys, RedisHold, WakeKeys};
use crate::layout::{self, KeyLayout};
use crate::queue::QueueTimes;

/// Shortest TTL accepted on one server.
const MIN_TTL_SINGLE: Duration = Duration::from_millis(10);
/// Shortest TTL accepted by RedLock (it must cover several round trips and the drift).
const MIN_TTL_REDLOCK: Duration = Duration::from_millis(100);
/// How long the cleanup of an abandoned acquire keeps trying while the servers do not
/// answer (see [`Abandoned`]).
const CLEANUP_PATIENCE: Duration = Duration::from_secs(60);

/// The Lua scripts (sent as EVALSHA, loaded again on `NOSCRIPT`). Shared helpers are
/// prepended: `tokens.lua` to the acquire scripts, `queue.lua` to the queue scripts, the
/// inspection and the force release, `broken.lua` to renewal and release; and to every
/// script that may wake waiters, the command it publishes with (`PUBLISH`).
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) acquire_q: Script,
    pub(crate) release_q: Script,
    pub(crate) renew: Script,
    pub(crate) fence_write: Script,
    pub(crate) inspect: Script,
    pub(crate) force_release: Script,
}

impl Scripts {
    /// The scripts for one server or RedLock, or for Redis Cluster (`cluster`): there every
    /// wake-up is published on the shard of its name (`SPUBLISH`, to a channel in the
    /// name's hash slot), and renewal covers the holds of many slots in one call
    /// (`allow-cross-slot-keys`).
    fn new(cluster: bool) -> Self {
        let publish = if cluster {
            "local PUBLISH = 'SPUBLISH'\n"
        } else {
            "local PUBLISH = 'PUBLISH'\n"
        };
        let script = |parts: &[&str]| Script::new(&parts.concat());
        let tokens = include_str!("scripts/tokens.lua");
        let queue = include_str!("scripts/queue.lua");
        let broken = include_str!("scripts/broken.lua");
        Scripts {
            acquire: script(&[tokens, include_str!("scripts/acquire.lua")]),
            release: script(&[publish, broken, include_str!("scripts/release.lua")]),
            acquire_q: script(&[
                publish,
                tokens,
                queue,
                include_str!("scripts/acquire_q.lua"),
            ]),
            release_q: script(&[
                publish,
                queue,
                broken,
                include_str!("scripts/release_q.lua"),
            ]),
            renew: script(&[
                if cluster {
                    "#!lua flags=allow-cross-slot-keys\n"
                } else {
                    ""
                },
                broken,
                include_str!("scripts/renew.lua"),
            ]),
            fence_write: script(&[include_str!("scripts/fence_write.lua")]),
            inspect: script(&[publish, queue, include_str!("scripts/inspect.lua")]),
            force_release: script(&[publish, queue, include_str!("scripts/break.lua")]),
        }
    }
}

/// State shared by the backend and its background tasks.
pub(crate) struct Inner {
    pub(crate) backend: &'static str,
    pub(crate) config: RedisConfig,
    /// The servers; none on Redis Cluster, whose primaries [`Inner::shards`] knows.
    pub(crate) nodes: Vec<Node>,
    /// Redis Cluster: the slot map and a node per primary.
    pub(crate) shards: Option<Arc<Shards>>,
    pub(crate) quorum: usize,
    pub(crate) keys: KeyLayout,
    pub(crate) scripts: Scripts,
    pub(crate) wakeups: Wakeups,
    /// The server whose queue orders the waiters: the only one, or on RedLock the first
    /// in sorted order (every client of the servers agrees on it).
    pub(crate) arbiter: usize,
    pub(crate) queue_times: QueueTimes,
    /// This client's id in waiter ids and its wake-up channel's name.
    pub(crate) client_id: String,
    /// What precedes a client id in a wake-up channel's name.
    pub(crate) channel_prefix: String,
    /// The cleanups of abandoned acquires, which closing the client waits for.
    pub(crate) background: Background,
}

/// The protocol half of a Redis lock client, for one server (`redis://`, `rediss://`), the
/// primary that Sentinels name (`redis+sentinel://`, `rediss+sentinel://`), Redis Cluster
/// (`redis+cluster://`, `rediss+cluster://`: each name on the primary serving its hash
/// slot) or RedLock over several independent servers (`redlock://`). [`RedisLock`](crate::RedisLock)
/// wraps it in [`LeaseClient`](lock_core::raw::LeaseClient); its `connect` and `from_url`
/// open it.
///
/// `Debug` and `Display` name the servers, never the credentials.
pub struct RedisBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.inner.config.endpoint())
            .field("prefix", &self.inner.config.prefix)
            .field("quorum", &self.inner.quorum)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.config.endpoint())
    }
}

/// A single server (behind Sentinels: the primary a Sentinel names, checked with `ROLE`)
/// must answer at open; RedLock needs a majority of its servers to answer then (the
/// others are retried in the background of each call). Open fails with
/// [`Error::InvalidConfig`] for a bad configuration, RedLock servers that resolve to the
/// same address (checked before any connection is opened), an unreadable CA file or
/// rejected credentials; [`Error::Connection`] when the server (or every Sentinel) does
/// not answer; [`Error::Unavailable`] when fewer than a majority of RedLock servers answer,
/// when no Sentinel knows the master name, or when the server named is not a primary. On
/// Redis Cluster a seed must answer `CLUSTER SLOTS` at open (one that is no cluster node
/// is [`Error::InvalidConfig`]).
#[async_trait]
impl Connect for RedisBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = RedisConfig;

    fn config_from_url(url: &LockUrl) -> Result<RedisConfig> {
        RedisConfig::parse_url(url)
    }

    fn validate(config: &RedisConfig) -> Result<()> {
        config.validate()
    }

    fn lock_options(config: &RedisConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: RedisConfig) -> Result<RedisBackend> {
        if config.redlock {
            let deadline = Instant::now() + config.options.request_timeout;
            crate::redlock::reject_aliases(&config.endpoints, deadline).await?;
        }
        let backend: &'static str = if config.redlock { "redlock" } else { "redis" };
        let ca = match &config.ca_file {
            Some(path) => {
                Some(
                    tokio::fs::read(path)
                        .await
                        .map_err(|err| Error::InvalidConfig {
                            message: format!("cannot read the TLS CA file {}", path.display()),
                            source: Some(Box::new(err)),
                        })?,
                )
            }
            None => None,
        };
        let shards = if config.cluster {
            Some(Arc::new(Shards::new(backend, &config, ca.as_deref())?))
        } else {
            None
        };
        // What each node connects to: the primary the Sentinels name, or each server (on
        // Redis Cluster, the nodes are the cluster's own).
        let targets: Vec<(String, Target)> = if shards.is_some() {
            Vec::new()
        } else if config.sentinel_master.is_some() {
            let sentinels = Sentinels::new(backend, &config, ca.as_deref()).map_err(|err| {
                error::from_client(
                    backend,
                    format_args!("configure {}", config.endpoint()),
                    err,
                )
            })?;
            vec![(sentinels.label(), Target::Primary(Arc::new(sentinels)))]
        } else {
            let mut targets = Vec::with_capacity(config.endpoints.len());
            for node in &config.endpoints {
                let client = redis_client(&config, node, ca.as_deref()).map_err(|err| {
                    error::from_client(backend, format_args!("configure on {node}"), err)
                })?;
                targets.push((node.to_string(), Target::Server(Box::new(client))));
            }
            targets
        };
        let nodes: Vec<Node> = targets
            .into_iter()
            .map(|(label, target)| {
                Node::new(backend, label, target, config.options.request_timeout)
            })
            .collect();
        let keys = KeyLayout::new(config.prefix.clone());
        let client_id = uuid::Uuid::new_v4().simple().to_string();
        let channel_prefix = keys.client_channel_prefix();
        let wakeups = Wakeups::new(
            backend,
            nodes
                .iter()
                .map(|n| (n.label.clone(), n.target().clone()))
                .collect(),
            shards.clone(),
            config.options.request_timeout,
            format!("{channel_prefix}{client_id}"),
        );
        let inner = Inner {
            backend,
            quorum: config.quorum(),
            keys,
            scripts: Scripts::new(config.cluster),
            wakeups,
            nodes,
            shards,
            arbiter: if config.sentinel_master.is_some() || config.cluster {
                0
            } else {
                arbiter_of(&config.endpoints)
            },
            queue_times: QueueTimes::new(config.options.recheck, config.options.request_timeout),
            client_id,
            channel_prefix,
            config,
            background: Background::new(),
        };
        let deadline = Instant::now() + inner.config.options.request_timeout;
        if let Some(shards) = &inner.shards {
            // A seed must answer CLUSTER SLOTS with a formed cluster.
            shards.reload(0, deadline).await?;
            return Ok(RedisBackend {
                inner: Arc::new(inner),
            });
        }
        let pings = join_all(inner.nodes.iter().map(|n| n.ping(deadline))).await;
        let mut answered = 0;
        let mut first_error = None;
        for ping in pings {
            match ping {
                Ok(()) => answered += 1,
                Err(err) if err.kind() == lock_core::ErrorKind::InvalidConfig => return Err(err),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if answered < inner.quorum {
            return match (inner.nodes.len(), first_error) {
                (1, Some(err)) => Err(err),
                (n, err) => Err(error::no_majority(
                    backend,
                    format!(
                        "only {answered} of {n} servers answered; RedLock needs {}",
                        inner.quorum
                    ),
                    err,
                )),
            };
        }
        Ok(RedisBackend {
            inner: Arc::new(inner),
        })
    }
}

impl RedisBackend {
    /// The key layout of this client.
    pub fn keys(&self) -> &KeyLayout {
        &self.inner.keys
    }

    /// The configuration of this client.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// How many wake-up channels this client listens to right now, on one shared
    /// subscription connection per server: its own once a waiter queued, and, without the
    /// queue, one per lock name with a waiter.
    pub fn wakeup_channels(&self) -> usize {
        self.inner.wakeups.active_channels()
    }

    /// How many of this client's acquires wait in a queue right now.
    pub fn queued_waiters(&self) -> usize {
        self.inner.wakeups.queued_waiters()
    }

    fn hold(&self, request: &AcquireRequest<'_>) -> RedisHold {
        let keys = &self.inner.keys;
        let key = keys.lock_key(request.name);
        let wake = if self.inner.config.queue {
            WakeKeys::Queue {
                queue: keys.side_key(&key, layout::QUEUE),
                live: keys.side_key(&key, layout::QUEUE_LIVE),
                waiter: format!("{}/{}", self.inner.client_id, request.token),
            }
        } else {
            WakeKeys::Channel(keys.side_key(&key, layout::RELEASED))
        };
        RedisHold {
            name: request.name.clone(),
            keys: Arc::new(HoldKeys {
                fence_key: keys.side_key(&key, layout::FENCE),
                broken: keys.side_key(&key, layout::BROKEN),
                key,
                wake,
            }),
            token: request.token.clone(),
        }
    }
}

/// The index of the first of `endpoints` in sorted order (`host:port`, ignoring case).
fn arbiter_of(endpoints: &[crate::RedisNode]) -> usize {
    (0..endpoints.len())
        .min_by_key(|&i| endpoints[i].to_string().to_ascii_lowercase())
        .unwrap_or(0)
}

/// The outcome of one acquire attempt.
pub(crate) enum Attempt {
    Won(Acquired<RedisHold>),
    /// Held by someone else: try again after at most this long.
    Held(Duration),
    /// Queued on the server that orders the waiters: try again when woken or after at most
    /// this long.
    Queued(Duration),
}

/// What an acquire may have left on the servers if its future is dropped (or fails)
/// while a request is in flight, or a failed RedLock round could not undo: released by
/// [`CleanupOnDrop`] in a background task.
///
/// The cleanup is tried again with backoff while it fails in a retryable way, for up to
/// [`CLEANUP_PATIENCE`]: a request that timed out may still run on the server later (one
/// that was stopped, or slow, runs what it had received once it goes on), granting the
/// lock to nobody or renewing a queue entry nobody waits behind, which would keep the
/// waiters queued behind that entry from a free lock until it expires.
pub(crate) struct Abandoned {
    inner: Arc<Inner>,
    /// Holds (one per owner token) that may exist on some server.
    dirty: Vec<RedisHold>,
}

impl Abandoned {
    /// `hold` may exist on some server from now on.
    pub(crate) fn arm(&mut self, hold: &RedisHold) {
        if !self.dirty.iter().any(|h| h.token == hold.token) {
            self.dirty.push(hold.clone());
        }
    }

    /// `hold` is granted or known to be gone everywhere.
    pub(crate) fn disarm(&mut self, hold: &RedisHold) {
        self.dirty.retain(|h| h.token != hold.token);
    }
}

impl Cleanup for Abandoned {
    async fn cleanup(self) {
        let give_up = Instant::now() + CLEANUP_PATIENCE;
        for hold in self.dirty {
            let mut backoff = reconnect_backoff();
            loop {
                let deadline = self.inner.request_deadline();
                let Err(err) = self.inner.release_all(&hold, true, deadline).await else {
                    break;
                };
                let pause = backoff.next_pause();
                if !err.is_retryable() || Instant::now() + pause >= give_up {
                    tracing::debug!(backend = self.inner.backend, lock = %hold.name, error = %err,
                        "cleanup of an abandoned acquire failed; the TTL ends it");
                    break;
                }
                sleep(pause).await;
            }
        }
    }

    fn is_needed(&self) -> bool {
        !self.dirty.is_empty()
    }
}

impl Inner {
    fn capabilities(&self) -> Capabilities {
        let base = Capabilities::new(self.backend)
            .fair(self.config.queue)
            .push_wakeup(true)
            .durable(false)
            .fence_at_least(true);
        if self.config.redlock {
            base.min_ttl(MIN_TTL_REDLOCK)
                .fencing(FencingSource::QuorumCounter)
        } else {
            base.min_ttl(MIN_TTL_SINGLE).fencing(FencingSource::Counter)
        }
    }

    pub(crate) fn request_deadline(&self) -> Instant {
        Instant::now() + self.config.options.request_timeout
    }

    /// What precedes a client id in the wake-up channel of a queued waiter of lock key
    /// `key`: the client's own channel, or on Redis Cluster its channel for this name, in
    /// the name's hash slot (a sharded channel lives on one shard).
    pub(crate) fn channel_prefix_for(&self, key: &str) -> String {
        if self.shards.is_some() {
            self.keys.side_key(key, layout::CLIENT)
        } else {
            self.channel_prefix.clone()
        }
    }

    /// Where the requests for lock key `key` go: every server (RedLock), the one server,
    /// or on Redis Cluster the primary serving the key's hash slot.
    pub(crate) fn routes(&self, key: &str) -> Vec<Route<'_>> {
        match &self.shards {
            Some(shards) => vec![Route::Slot(shards, slot_of(key.as_bytes()))],
            None => self.nodes.iter().map(Route::Node).collect(),
        }
    }

    /// The acquire script for `hold`: with `count` it takes the next fencing token on a
    /// grant, `max(counter + 1, server clock in µs)`, and stores it (single server);
    /// without, it only reads `max(counter, server clock in µs)` (RedLock, which writes
    /// the token back through a majority). With a `floor`, the floor takes the place of
    /// the clock (see `tokens.lua`).
    pub(crate) fn acquire_invocation(
        &self,
        hold: &RedisHold,
        ttl_ms: u64,
        count: bool,
        floor: Option<FencingToken>,
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.acquire.prepare_invoke();
        invocation
            .key(&hold.keys.key)
            .key(&hold.keys.fence_key)
            .arg(hold.token.as_str())
            .arg(ttl_ms)
            .arg(u8::from(count))
            .arg(floor_arg(floor));
        invocation
    }

    /// Runs an acquire script on the one server (behind Sentinels: the primary). With
    /// `wait_replicas`, a grant waits on the same connection until that many replicas
    /// acknowledged it (`WAIT`, at most `wait_timeout`); with fewer it is given back
    /// (compare-and-delete) and the attempt fails with [`Error::Unavailable`].
    pub(crate) async fn acquire_on_server(
        &self,
        hold: &RedisHold,
        invocation: &redis::ScriptInvocation<'_>,
        pending: &mut CleanupOnDrop<Abandoned>,
    ) -> Result<Vec<i64>> {
        let wanted = self.config.wait_replicas;
        let wait = (wanted > 0).then_some((wanted, self.config.wait_timeout));
        let (reply, acked) = self.routes(&hold.keys.key)[0]
            .acquire_script(self.request_deadline(), invocation, wait)
            .await?;
        match acked {
            Some(acked) if acked < i64::from(wanted) => {
                if self
                    .release_all(hold, true, self.request_deadline())
                    .await
                    .is_ok()
                {
                    pending.state_mut().disarm(hold);
                }
                Err(Error::Unavailable {
                    backend: self.backend,
                    message: format!(
                        "only {acked} of the {wanted} replicas asked for acknowledged the \
                         grant of `{}` within {:?}; it was given back",
                        hold.name, self.config.wait_timeout
                    ),
                    source: None,
                })
            }
            _ => Ok(reply),
        }
    }

    /// One attempt on a single server.
    async fn attempt_single(
        &self,
        hold: &RedisHold,
        request: &AcquireRequest<'_>,
        pending: &mut CleanupOnDrop<Abandoned>,
    ) -> Result<Attempt> {
        let ttl_ms = ttl_millis(request.ttl);
        let invocation = self.acquire_invocation(hold, ttl_ms, true, request.fence_at_least);
        let requested_at = Instant::now();
        pending.state_mut().arm(hold);
        let reply = self.acquire_on_server(hold, &invocation, pending).await?;
        let (won, value) = match *reply {
            [won, value] => (won, value),
            _ => {
                return Err(error::protocol(
                    self.backend,
                    format!("unexpected reply of the acquire: {reply:?}"),
                ))
            }
        };
        if won == 1 {
            let fence = u64::try_from(value).map_err(|_| {
                error::protocol(self.backend, format!("negative fencing token {value}"))
            })?;
            return Ok(Attempt::Won(Acquired {
                hold: hold.clone(),
                fencing_token: FencingToken(fence),
                requested_at,
                lease: Duration::from_millis(ttl_ms),
                session: 0,
            }));
        }
        pending.state_mut().disarm(hold);
        Ok(Attempt::Held(pttl_wait(value)))
    }
}

/// How long to wait before retrying a lock whose holder's key expires in `pttl` ms.
pub(crate) fn pttl_wait(pttl: i64) -> Duration {
    match u64::try_from(pttl) {
        // Wait until just past the expiry.
        Ok(ms) => Duration::from_millis(ms.saturating_add(1)),
        // -1: a key without expiry (written by someone else); -2: gone already.
        Err(_) if pttl == -1 => Duration::MAX,
        Err(_) => Duration::ZERO,
    }
}

#[async_trait]
impl Backend for RedisBackend {
    type Hold = RedisHold;

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// # Cancellation
    /// When this future is dropped while an acquire request is in flight, while it waits
    /// in the queue, or after a RedLock round took some servers, a background task
    /// releases whatever it may have taken and takes its waiter out of the queue
    /// (compare-and-delete on the owner token, so nothing else is touched); the bell or the
    /// subscription to the wake-up channel is left at once.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<RedisHold>>> {
        let inner = &self.inner;
        let first = self.hold(&request);
        let mut pending = CleanupOnDrop::new(Abandoned {
            inner: Arc::clone(inner),
            dirty: Vec::new(),
        })
        .tracked_by(&inner.background);
        let recheck = inner.config.options.recheck;
        let mut bell: Option<Subscription> = None;
        let epoch = inner.wakeups.epoch();
        let mut round = 0u64;
        loop {
            if let Some(bell) = bell.as_mut() {
                bell.mark();
            }
            let attempt = if inner.config.redlock {
                // Each RedLock round has its own owner token, so that a late undo of an
                // earlier round can never remove what a later round took.
                let hold = first.for_round(round);
                inner.attempt_redlock(&hold, &request, &mut pending).await?
            } else if inner.config.queue {
                inner.attempt_queued(&first, &request, &mut pending).await?
            } else {
                inner.attempt_single(&first, &request, &mut pending).await?
            };
            round += 1;
            let nap = match attempt {
                Attempt::Won(acquired) => {
                    pending.state_mut().disarm(&acquired.hold);
                    return Ok(Some(acquired));
                }
                Attempt::Held(_) | Attempt::Queued(_) if !request.wait => return Ok(None),
                Attempt::Queued(nap) => nap,
                Attempt::Held(retry_in) if inner.config.redlock => {
                    // Not queued: contenders that split the servers between them must not
                    // retry in step.
                    let spread = (request.ttl / 50)
                        .clamp(Duration::from_millis(2), Duration::from_millis(25));
                    retry_in.min(recheck).max(Duration::from_millis(1))
                        + rand::rng().random_range(Duration::ZERO..spread)
                }
                Attempt::Held(retry_in) => retry_in.min(recheck).max(Duration::from_millis(1)),
            };
            match (bell.as_mut(), &first.keys.wake) {
                (Some(bell), _) => bell.wait(nap, inner.queue_times.window).await,
                // Queued: the bell also rings with what came for this waiter before it.
                (None, WakeKeys::Queue { .. }) => {
                    let token = first.token.as_str();
                    let channel = inner.shards.as_ref().map(|_| {
                        let prefix = inner.channel_prefix_for(&first.keys.key);
                        format!("{prefix}{}", inner.client_id)
                    });
                    let enlisted =
                        inner
                            .wakeups
                            .enlist(token, inner.arbiter, epoch, channel.as_deref());
                    let queued = bell.insert(enlisted);
                    queued.wait(nap, inner.queue_times.window).await;
                }
                // The bell rings once the subscription is live; the next attempt right
                // away covers a release published before.
                (None, WakeKeys::Channel(channel)) => bell = Some(inner.wakeups.join(channel)),
            }
        }
    }

    async fn renew(&self, items: &[RenewItem<'_, RedisHold>]) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(items).await
    }

    /// On Redis Cluster, the primary that serves the hold's slot (in the slot map as it
    /// is): each primary's holds are renewed by calls of their own, so a slow or stopped
    /// primary delays only its holds. One group elsewhere: one server, or RedLock, whose
    /// every hold needs the same majority of servers.
    fn renewal_group(&self, hold: &RedisHold) -> u64 {
        self.inner.renewal_group(hold)
    }

    async fn release(&self, hold: &RedisHold) -> Result<BackendRelease> {
        self.inner
            .release_all(hold, false, self.inner.request_deadline())
            .await
    }

    /// One script call per server (within `request_timeout`): the holder is the lock
    /// key's value, the waiters the live entries of the queue, the token floor the
    /// fencing counter (RedLock: the holder found on the most servers, shown with its
    /// acquisition's owner token as its guard has it, the highest counter, the queue of
    /// the server that orders the waiters first).
    ///
    /// # Errors
    /// When fewer than a majority of servers answered.
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        self.inner.inspect(name).await
    }

    /// `SCAN` over the lock keys under the escaped prefix on every server (RedLock: the
    /// names held on a majority of them).
    ///
    /// # Errors
    /// When fewer than a majority of servers answered.
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        self.inner.list(prefix).await
    }

    /// One script call per server (RedLock: every server, a majority must answer):
    /// deletes the lock key whoever holds it (a plain `SET NX` holder too), remembers the
    /// owner token in the name's break mark (see [`KeyLayout`]) and wakes the next waiter
    /// as a release does. The holder returned shows its owner token and lease left.
    /// A removed holder of this crate finds the mark at its next renewal or release and
    /// reports [`LostReason::Broken`](lock_core::LostReason::Broken) (RedLock: when any
    /// server that answered says so and the hold is lost).
    ///
    /// # Errors
    /// When fewer than a majority of servers answered; the hold may then be removed from
    /// some of them.
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        self.inner.force_release(name).await
    }

    /// Waits (at most the request timeout) for the cleanups of abandoned acquires: Redis
    /// has no session whose end would remove what they left.
    async fn close(&self) -> Result<()> {
        let limit = self.inner.config.options.request_timeout;
        if !self.inner.background.settle(limit).await {
            tracing::warn!(backend = self.inner.backend, "closing: cleanups of abandoned acquires still under way; the queue's liveness deadlines and the key TTLs end what they leave");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_the_holders_expiry() {
        assert_eq!(pttl_wait(250), Duration::from_millis(251));
        assert_eq!(pttl_wait(-1), Duration::MAX);
        assert_eq!(pttl_wait(-2), Duration::ZERO);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 1);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
    }
}
