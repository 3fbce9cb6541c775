//! [`RedisBackend`]: how it opens on the [`Topology`] its configuration asks for
//! ([`Connect`]), and its acquire loop, renewal and release ([`Backend`]) through the
//! protocol pieces (`attempt.rs`, `redlock.rs`, `hold.rs`, `operator.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    backend::{
        AcquireRequest, Acquired, Amended, Amendment, Backend, BackendRelease, ChangeFeed,
        RenewItem, RenewOutcome, SemaphoreResize,
    },
    driver::Connect,
    plumbing::{Background, Cleanup, CleanupOnDrop},
    url::LockUrl,
};
use lock_core::{
    Capabilities, FencingToken, LockName, LockOptions, Occupancy, Participant, Result,
};
use rand::Rng;
use tokio::time::{sleep, Instant};

use crate::attempt::{self, Attempt, Dirty};
use crate::config::{RedisConfig, RedisDeployment};
use crate::connection::{read_ca, reconnect_backoff, Grant, Subscription, Wakeups};
use crate::hold::{self, RedisHold};
use crate::layout::{KeyLayout, WakeKeys};
use crate::operator;
use crate::redlock;
use crate::topology::{Servers, Topology};

/// How long the cleanup of an abandoned acquire keeps trying while the servers do not
/// answer (see [`Abandoned`]).
const CLEANUP_PATIENCE: Duration = Duration::from_secs(60);

/// The protocol half of a Redis lock client, for one server (`redis://`, `rediss://`), the
/// primary that Sentinels name (`redis+sentinel://`, `rediss+sentinel://`), Redis Cluster
/// (`redis+cluster://`, `rediss+cluster://`: each name on the primary serving its hash
/// slot) or RedLock over several independent servers (`redlock://`). [`RedisLock`](crate::RedisLock)
/// wraps it in [`LeaseClient`](lock_core::raw::backend::LeaseClient); its `connect` and `from_url`
/// open it.
///
/// `Debug` and `Display` name the servers, never the credentials.
pub struct RedisBackend {
    servers: Arc<Servers>,
    wakeups: Wakeups,
    /// The cleanups of abandoned acquires, which closing the client waits for.
    background: Background,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.servers.config.endpoint())
            .field("prefix", &self.servers.config.prefix)
            .field("quorum", &self.servers.quorum())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.servers.config.endpoint())
    }
}

/// A single server (behind Sentinels: the primary a Sentinel names, checked with `ROLE`) must
/// answer at open; RedLock needs a majority of its servers to answer then (the others are
/// retried in the background of each call). Open fails with
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) for a bad configuration, RedLock
/// servers that resolve to the same address (checked before any connection is opened), an
/// unreadable CA file or rejected credentials;
/// [`Error::Connection`](lock_core::Error::Connection) when the server (or every Sentinel) does
/// not answer; [`Error::Unavailable`](lock_core::Error::Unavailable) when fewer than a majority
/// of RedLock servers answer, when no Sentinel knows the master name, or when the server named
/// is not a primary. On Redis Cluster a seed must answer `CLUSTER SLOTS` at open (one that is
/// no cluster node is [`Error::InvalidConfig`](lock_core::Error::InvalidConfig)).
#[async_trait]
impl Connect for RedisBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = RedisConfig;

    fn config_from_url(url: &LockUrl) -> Result<RedisConfig> {
        RedisConfig::from_url(url)
    }

    fn validate(config: &RedisConfig) -> Result<()> {
        config.validate()
    }

    fn lock_options(config: &RedisConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: RedisConfig) -> Result<RedisBackend> {
        let deadline = Instant::now() + config.options.request_timeout;
        if let RedisDeployment::RedLock { nodes, .. } = &config.deployment {
            redlock::reject_aliases(nodes, deadline).await?;
        }
        let backend = config.backend();
        let ca = read_ca(&config).await?;
        let topology = Topology::new(backend, &config, ca.as_deref())?;
        let servers = Servers::new(backend, topology, config);
        let wakeups = Wakeups::new(
            backend,
            servers
                .topology
                .nodes()
                .iter()
                .map(|n| (n.label.clone(), n.target().clone()))
                .collect(),
            servers.topology.shards().cloned(),
            servers.config.options.request_timeout,
            format!("{}{}", servers.channel_prefix, servers.client_id),
        );
        let deadline = servers.request_deadline();
        servers.topology.check(backend, deadline).await?;
        Ok(RedisBackend {
            servers: Arc::new(servers),
            wakeups,
            background: Background::new(),
        })
    }
}

impl RedisBackend {
    /// The key layout of this client.
    pub fn keys(&self) -> &KeyLayout {
        &self.servers.keys
    }

    /// The configuration of this client.
    pub fn config(&self) -> &RedisConfig {
        &self.servers.config
    }

    /// How many wake-up channels this client listens to right now, on one shared
    /// subscription connection per server: its own once a waiter queued, and, without the
    /// queue, one per lock name with a waiter.
    pub fn wakeup_channels(&self) -> usize {
        self.wakeups.active_channels()
    }

    /// How many of this client's acquires wait in a queue right now.
    pub fn queued_waiters(&self) -> usize {
        self.wakeups.queued_waiters()
    }

    /// Whether this client grants the shared kinds ([`RedisConfig::grants_shared`]).
    fn grants_shared(&self) -> bool {
        self.servers.config.grants_shared()
    }

    /// One attempt of `request` for `first` (the hold of its first round), as the
    /// topology decides: RedLock's round `round` over every server, else the one server
    /// that owns the key.
    async fn attempt(
        &self,
        first: &RedisHold,
        request: &AcquireRequest<'_>,
        round: u64,
        dirty: &mut Dirty,
    ) -> Result<Attempt> {
        let servers = &self.servers;
        match servers.topology {
            Topology::RedLock { .. } => {
                redlock::attempt(servers, first, round, request, dirty).await
            }
            Topology::Single(_) | Topology::Sentinel(_) | Topology::Cluster(_) => {
                attempt::attempt(servers, first, request, round, dirty).await
            }
        }
    }

    /// The hold of a grant a release handed to the waiter of `first` (see `grant_head` in
    /// `queue.lua`) on the attempt `queued_at` left queued: its lease runs from that
    /// attempt's send time, which came before the grant. `None` (the next attempt finds
    /// the lock its own, renewed to the TTL) for a grant on an older round, or one with less
    /// than half its lease left.
    fn handed(
        &self,
        first: &RedisHold,
        request: &AcquireRequest<'_>,
        grant: Grant,
        queued_at: Option<(u64, Instant)>,
    ) -> Option<Acquired<RedisHold>> {
        let (_, sent) = queued_at.filter(|&(round, _)| round == grant.round)?;
        let lease = self.servers.queue_times.grant_for(request.ttl);
        (Instant::now() < sent + lease / 2).then(|| Acquired {
            hold: first.clone(),
            fencing_token: FencingToken(grant.fence),
            requested_at: sent,
            lease,
            session: 0,
        })
    }

    /// The bell of a waiter of `first` that has none yet: queued, the client's channel
    /// (which also rings with what came for this waiter before); without the queue, the
    /// name's channel, which rings once the subscription is live (the next attempt right
    /// away covers a release published before).
    fn bell(&self, first: &RedisHold, epoch: u64) -> Subscription {
        let servers = &self.servers;
        match &first.keys.wake {
            WakeKeys::Queue { .. } => {
                let channel = servers.topology.shards().map(|_| {
                    let prefix = servers.channel_prefix_for(&first.keys.key);
                    format!("{prefix}{}", servers.client_id)
                });
                let arbiter = servers.topology.arbiter();
                let token = first.token.as_str();
                self.wakeups
                    .enlist(token, arbiter, epoch, channel.as_deref())
            }
            WakeKeys::Channel(channel) => self.wakeups.join(channel),
        }
    }
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
struct Abandoned {
    servers: Arc<Servers>,
    dirty: Dirty,
}

impl Cleanup for Abandoned {
    async fn cleanup(self) {
        let give_up = Instant::now() + CLEANUP_PATIENCE;
        for hold in self.dirty.holds {
            let mut backoff = reconnect_backoff();
            loop {
                let deadline = self.servers.request_deadline();
                let Err(err) = hold::release_all(&self.servers, &hold, true, deadline).await else {
                    break;
                };
                let pause = backoff.next_pause();
                if !err.is_retryable() || Instant::now() + pause >= give_up {
                    tracing::debug!(backend = self.servers.backend, lock = %hold.name, error = %err,
                        "cleanup of an abandoned acquire failed; the TTL ends it");
                    break;
                }
                sleep(pause).await;
            }
        }
    }

    fn is_needed(&self) -> bool {
        !self.dirty.holds.is_empty()
    }
}

#[async_trait]
impl Backend for RedisBackend {
    type Hold = RedisHold;

    fn capabilities(&self) -> Capabilities {
        self.servers.config.capabilities()
    }

    /// # Cancellation
    /// When this future is dropped while an acquire request is in flight, while it waits
    /// in the queue, or after a RedLock round took some servers, a background task
    /// releases whatever it may have taken and takes its waiter out of the queue
    /// (compare-and-delete on the owner token, so nothing else is touched); the bell or the
    /// subscription to the wake-up channel is left at once.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<RedisHold>>> {
        let servers = &self.servers;
        let first = RedisHold::new(servers, &request);
        if first.keys.shared.is_some() && !self.grants_shared() {
            return Err(lock_core::Error::unsupported(
                servers.backend,
                format!(
                    "{} (RedLock and `queue=off` grant mutexes and elections only)",
                    request.kind.describe()
                ),
            ));
        }
        let mut pending = CleanupOnDrop::new(Abandoned {
            servers: Arc::clone(servers),
            dirty: Dirty::default(),
        })
        .tracked_by(&self.background);
        let recheck = servers.config.options.recheck;
        let window = servers.queue_times.window;
        let redlock = servers.topology.is_redlock();
        let mut bell: Option<Subscription> = None;
        let epoch = self.wakeups.epoch();
        let mut round = 0u64;
        // The round and send time of the last attempt that left this waiter queued: a
        // grant on that round came after it was sent.
        let mut queued_at: Option<(u64, Instant)> = None;
        loop {
            if let Some(bell) = bell.as_mut() {
                bell.mark();
            }
            let dirty = &mut pending.state_mut().dirty;
            let sent = Instant::now();
            let attempt = self.attempt(&first, &request, round, dirty).await?;
            let nap = match attempt {
                Attempt::Won(acquired) => {
                    pending.state_mut().dirty.disarm(&acquired.hold);
                    acquired.hold.granted(acquired.fencing_token);
                    return Ok(Some(acquired));
                }
                Attempt::Held(_) | Attempt::Queued(_) if !request.wait => return Ok(None),
                Attempt::Queued(nap) => {
                    queued_at = Some((round, sent));
                    nap
                }
                Attempt::Held(retry_in) if redlock => {
                    // Not queued: contenders that split the servers between them must not
                    // retry in step.
                    let spread = (request.ttl / 50)
                        .clamp(Duration::from_millis(2), Duration::from_millis(25));
                    retry_in.min(recheck).max(Duration::from_millis(1))
                        + rand::rng().random_range(Duration::ZERO..spread)
                }
                Attempt::Held(retry_in) => retry_in.min(recheck).max(Duration::from_millis(1)),
            };
            round += 1;
            let granted = match (bell.as_mut(), &first.keys.wake) {
                (Some(bell), _) => bell.wait(nap, window).await,
                // Queued: the bell also rings with what came for this waiter before it.
                (None, WakeKeys::Queue { .. }) => {
                    bell.insert(self.bell(&first, epoch))
                        .wait(nap, window)
                        .await
                }
                // The bell rings once the subscription is live; the next attempt right
                // away covers a release published before.
                (None, WakeKeys::Channel(_)) => {
                    bell = Some(self.bell(&first, epoch));
                    None
                }
            };
            if let Some(acquired) =
                granted.and_then(|grant| self.handed(&first, &request, grant, queued_at))
            {
                pending.state_mut().dirty.disarm(&acquired.hold);
                acquired.hold.granted(acquired.fencing_token);
                return Ok(Some(acquired));
            }
        }
    }

    async fn renew(&self, items: &[RenewItem<'_, RedisHold>]) -> Result<Vec<RenewOutcome>> {
        hold::renew(&self.servers, items).await
    }

    /// On Redis Cluster, the primary that serves the hold's slot (in the slot map as it
    /// is): each primary's holds are renewed by calls of their own, so a slow or stopped
    /// primary delays only its holds. One group elsewhere: one server, or RedLock, whose
    /// every hold needs the same majority of servers.
    fn renewal_group(&self, hold: &RedisHold) -> u64 {
        hold::renewal_group(&self.servers.topology, hold)
    }

    async fn release(&self, hold: &RedisHold) -> Result<BackendRelease> {
        let deadline = self.servers.request_deadline();
        hold::release_all(&self.servers, hold, false, deadline).await
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
        operator::inspect(&self.servers, name).await
    }

    /// `SCAN` over the lock keys under the escaped prefix on every server (RedLock: the
    /// names held on a majority of them).
    ///
    /// # Errors
    /// When fewer than a majority of servers answered.
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        operator::list(&self.servers, prefix).await
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
        operator::force_release(&self.servers, name).await
    }

    /// One script call (`resize.lua`): the holds' and waiters' entries in the holders'
    /// table get the new number, then the waiters that fit are granted.
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        operator::resize(&self.servers, name, resize).await
    }

    /// One owner-checked script call per server (RedLock: done on a majority). A proclaim:
    /// the value goes into the hold's leader entry with a version above the earlier
    /// proclaims', and is published on the election's change channel. A downgrade
    /// (`downgrade.lua`): the writer's entry in the holders' table becomes a reader's, and
    /// the readers queued behind it are granted, in the same script.
    ///
    /// # Errors
    /// When fewer than a majority of servers answered: the value may then be stored on
    /// some of them.
    async fn amend(&self, hold: &RedisHold, amendment: Amendment<'_>) -> Result<Amended> {
        match amendment {
            Amendment::Proclaim(value) => hold::proclaim(&self.servers, hold, value).await,
            Amendment::Downgrade | Amendment::Upgrade => {
                hold::rekind(&self.servers, hold, amendment).await
            }
            other => Err(other.unsupported(self.capabilities().backend)),
        }
    }

    /// The election's change channel (see [`KeyLayout`]), joined on the client's shared
    /// wake-up subscription (on every server; on Redis Cluster sharded, on the primary of
    /// the name's slot). Candidates' grants, releases, breaks and proclaims are published
    /// on it; an expiry is not (Redis tells nobody without keyspace notifications), so
    /// readers find it at their next `recheck`. The feed also fires each time the
    /// subscription is made again after a reconnect (a change may have been missed). The
    /// subscription is awaited (at most the request timeout) before this returns.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let channel = self.servers.keys.changes_channel(name);
        let mut subscription = self.wakeups.join(&channel);
        // Its first ring says it is live: from then on nothing published is missed.
        let limit = self.servers.config.options.request_timeout;
        let _ = tokio::time::timeout(limit, subscription.rung()).await;
        let stream = futures::stream::unfold(subscription, |mut subscription| async move {
            subscription.rung().await;
            Some(((), subscription))
        });
        Ok(ChangeFeed::from_stream(Box::pin(stream)))
    }

    /// Waits (at most the request timeout) for the cleanups of abandoned acquires: Redis
    /// has no session whose end would remove what they left.
    async fn close(&self) -> Result<()> {
        let limit = self.servers.config.options.request_timeout;
        if !self.background.settle(limit).await {
            tracing::warn!(backend = self.servers.backend, "closing: cleanups of abandoned acquires still under way; the queue's liveness deadlines and the key TTLs end what they leave");
        }
        Ok(())
    }
}
