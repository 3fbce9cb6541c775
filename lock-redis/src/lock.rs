//! The Redis protocol: acquire (single server and RedLock), release, key layout.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use lock_core::raw::{escape, validity_deadline, Connect, LockUrl};
use lock_core::raw::{AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome};
use lock_core::LockOptions;
use lock_core::{Capabilities, Error, FencingSource, FencingToken, LockName, LostReason, Result};
use rand::Rng;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, Script, TlsCertificates};
use tokio::time::{sleep, Instant};

use crate::client::{Node, Subscription, Wakeups};
use crate::config::RedisConfig;
use crate::error;
use crate::lease::RedisHold;

/// Shortest TTL accepted on one server.
const MIN_TTL_SINGLE: Duration = Duration::from_millis(10);
/// Shortest TTL accepted by RedLock (it must cover several round trips and the drift).
const MIN_TTL_REDLOCK: Duration = Duration::from_millis(100);

/// How lock names map onto Redis keys.
///
/// - lock key: `<prefix><name>`, a plain string holding the owner token, with `%`, `{`
///   and `}` of the name percent-escaped (so a lock key never holds a hash tag and two
///   names never share a key);
/// - fencing counter: `<prefix>{<lock key>}:fence`, never deleted (tokens must keep
///   increasing);
/// - wake-up channel: `<prefix>{<lock key>}:released`.
///
/// The side names carry the whole lock key as their hash tag, so all three share one
/// hash slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// The layout for key prefix `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        KeyLayout {
            prefix: prefix.into(),
        }
    }

    /// The key that holds the owner token of `name`.
    pub fn lock_key(&self, name: &LockName) -> String {
        format!("{}{}", self.prefix, escape(name.as_str(), &['{', '}']))
    }

    /// The fencing counter of `name`.
    pub fn fence_key(&self, name: &LockName) -> String {
        format!("{}{{{}}}:fence", self.prefix, self.lock_key(name))
    }

    /// The channel on which a release of `name` is published.
    pub fn wakeup_channel(&self, name: &LockName) -> String {
        format!("{}{{{}}}:released", self.prefix, self.lock_key(name))
    }
}

/// The Lua scripts (sent as EVALSHA, loaded again on `NOSCRIPT`).
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    pub(crate) fence_write: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("scripts/acquire.lua")),
            release: Script::new(include_str!("scripts/release.lua")),
            renew: Script::new(include_str!("scripts/renew.lua")),
            fence_write: Script::new(include_str!("scripts/fence_write.lua")),
        }
    }
}

/// State shared by the backend and its background tasks.
pub(crate) struct Inner {
    pub(crate) backend: &'static str,
    pub(crate) config: RedisConfig,
    pub(crate) nodes: Vec<Node>,
    pub(crate) quorum: usize,
    pub(crate) keys: KeyLayout,
    pub(crate) scripts: Scripts,
    pub(crate) wakeups: Wakeups,
}

/// The protocol half of a Redis lock client, for one server (`redis://`, `rediss://`) or
/// RedLock over several independent servers (`redlock://`). Wrap it in
/// [`lock_core::raw::LeaseClient`] ([`RedisLock`]); [`RedisBackend::connect`] does.
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

/// A single server must answer at open; RedLock needs a majority of its servers to answer
/// then (the others are retried in the background of each call). Open fails with
/// [`Error::InvalidConfig`] for a bad configuration, RedLock servers that resolve to the
/// same address (checked before any connection is opened), an unreadable CA file or
/// rejected credentials; [`Error::Connection`] when the server does not answer;
/// [`Error::Unavailable`] when fewer than a majority of RedLock servers answer.
#[async_trait]
impl Connect for RedisBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = RedisConfig;

    fn config_from_url(url: &LockUrl) -> Result<RedisConfig> {
        RedisConfig::from_url(url)
    }

    fn lock_options(config: &RedisConfig) -> &LockOptions {
        &config.lock
    }

    async fn open(config: RedisConfig) -> Result<RedisBackend> {
        config.validate()?;
        if config.redlock {
            let deadline = Instant::now() + config.lock.request_timeout;
            crate::client::reject_aliases(&config.nodes, deadline).await?;
        }
        let backend: &'static str = if config.redlock { "redlock" } else { "redis" };
        let ca = match &config.tls_ca {
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
        if config.tls {
            // Several rustls providers may be compiled in; pick one explicitly (a no-op
            // when the process already chose).
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut nodes = Vec::with_capacity(config.nodes.len());
        for node in &config.nodes {
            let client = redis_client(&config, node, ca.as_deref())
                .map_err(|err| error::map(backend, "configure", &node.to_string(), err))?;
            nodes.push(Node::new(
                backend,
                node.to_string(),
                client,
                config.lock.request_timeout,
            ));
        }
        let wakeups = Wakeups::new(
            backend,
            nodes
                .iter()
                .map(|n| (n.label.clone(), n.client().clone()))
                .collect(),
            config.lock.request_timeout,
        );
        let inner = Inner {
            backend,
            quorum: config.quorum(),
            keys: KeyLayout::new(config.prefix.clone()),
            scripts: Scripts::new(),
            wakeups,
            nodes,
            config,
        };
        let deadline = Instant::now() + inner.config.lock.request_timeout;
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
                (n, err) => Err(Error::Unavailable {
                    backend,
                    message: format!(
                        "only {answered} of {n} servers answered; RedLock needs {}",
                        inner.quorum
                    ),
                    source: err.map(|e| Box::new(e) as lock_core::BoxError),
                }),
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

    /// How many wake-up channels this client listens to right now (one per lock name
    /// with a waiter, on one shared subscription connection per server).
    pub fn wakeup_channels(&self) -> usize {
        self.inner.wakeups.active_channels()
    }

    fn hold(&self, request: &AcquireRequest<'_>) -> RedisHold {
        let keys = &self.inner.keys;
        RedisHold {
            name: request.name.clone(),
            key: keys.lock_key(request.name),
            fence_key: keys.fence_key(request.name),
            channel: keys.wakeup_channel(request.name),
            token: request.token.clone(),
        }
    }
}

fn redis_client(
    config: &RedisConfig,
    node: &crate::RedisNode,
    ca: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    let addr = if config.tls {
        ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(node.host.clone(), node.port)
    };
    let mut settings = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password);
    }
    let info = addr.into_connection_info()?.set_redis_settings(settings);
    match ca {
        Some(pem) => redis::Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        None => redis::Client::open(info),
    }
}

/// TTL in whole milliseconds (at least 1), as Redis takes it.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The outcome of one acquire attempt.
enum Attempt {
    Won(Acquired<RedisHold>),
    /// Held by someone else: try again after at most this long.
    Held(Duration),
}

/// Releases what an acquire may have taken on the servers if its future is dropped (or
/// fails) while a request is in flight, or a failed RedLock round could not undo; the
/// release runs in a background task.
struct Pending {
    inner: Arc<Inner>,
    /// Holds (one per owner token) that may exist on some server.
    dirty: Vec<RedisHold>,
}

impl Pending {
    fn arm(&mut self, hold: &RedisHold) {
        if !self.dirty.iter().any(|h| h.token == hold.token) {
            self.dirty.push(hold.clone());
        }
    }

    fn disarm(&mut self, hold: &RedisHold) {
        self.dirty.retain(|h| h.token != hold.token);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let holds = std::mem::take(&mut self.dirty);
        let inner = Arc::clone(&self.inner);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for hold in holds {
                    let deadline = inner.request_deadline();
                    if let Err(err) = inner.release_all(&hold, deadline).await {
                        tracing::debug!(backend = inner.backend, lock = %hold.name, error = %err,
                            "cleanup of an abandoned acquire failed; the TTL ends it");
                    }
                }
            });
        }
    }
}

impl Inner {
    fn capabilities(&self) -> Capabilities {
        let base = Capabilities::new(self.backend)
            .fair(false)
            .push_wakeup(true)
            .durable(false);
        if self.config.redlock {
            base.min_ttl(MIN_TTL_REDLOCK)
                .fencing(FencingSource::QuorumCounter)
        } else {
            base.min_ttl(MIN_TTL_SINGLE).fencing(FencingSource::Counter)
        }
    }

    fn request_deadline(&self) -> Instant {
        Instant::now() + self.config.lock.request_timeout
    }

    /// The acquire script for `hold`: with `count` it takes the next fencing token on a
    /// grant, `max(counter + 1, server clock in µs)`, and stores it (single server);
    /// without, it only reads `max(counter, server clock in µs)` (RedLock, which writes
    /// the token back through a majority).
    fn acquire_invocation(
        &self,
        hold: &RedisHold,
        ttl_ms: u64,
        count: bool,
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.acquire.prepare_invoke();
        invocation
            .key(&hold.key)
            .key(&hold.fence_key)
            .arg(hold.token.as_str())
            .arg(ttl_ms)
            .arg(u8::from(count));
        invocation
    }

    /// One attempt on a single server.
    async fn attempt_single(
        &self,
        hold: &RedisHold,
        ttl: Duration,
        pending: &mut Pending,
    ) -> Result<Attempt> {
        let ttl_ms = ttl_millis(ttl);
        let invocation = self.acquire_invocation(hold, ttl_ms, true);
        let requested_at = Instant::now();
        pending.arm(hold);
        let (won, value): (i64, i64) = self.nodes[0]
            .script("acquire", self.request_deadline(), &invocation)
            .await?;
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
        pending.disarm(hold);
        Ok(Attempt::Held(pttl_wait(value)))
    }

    /// One RedLock round, in two parallel round trips:
    /// 1. acquire on every server; each reply also carries that server's reading
    ///    `max(fencing counter, server clock in µs)`, taken in the same atomic script as
    ///    the `SET`;
    /// 2. once a majority granted, write back the maximum reading + 1 on every server
    ///    (set if greater, only where the lock is still ours) and wait for a majority.
    ///
    /// The lock is granted when both rounds reached a majority and the validity, counted
    /// from before round 1, is still positive; otherwise everything this round took is
    /// undone before returning.
    ///
    /// Why the tokens strictly increase across successive holders: any two majorities
    /// intersect. The previous holder stored its token on a majority, each time while its
    /// key was on that server (fence_write.lua checks); this round's grants form another
    /// majority, and each grant read the counter atomically with the `SET` that found the
    /// key free, so after the previous holder's key had left that server (released, or
    /// expired, which under the bounded-drift assumption is after its validity ended). At
    /// least one server is in both majorities, and its reading already holds the previous
    /// token: max + 1 is above it. Readings of servers that refused (held by another) only
    /// raise the maximum. Where the shared servers lost that token (restored stale,
    /// restarted empty), the clock in their readings keeps max + 1 above it, as long as
    /// the servers' clocks do not go back and agree to within the time between grants.
    async fn attempt_redlock(
        &self,
        hold: &RedisHold,
        ttl: Duration,
        wait: bool,
        pending: &mut Pending,
    ) -> Result<Attempt> {
        let n = self.nodes.len();
        let ttl_ms = ttl_millis(ttl);
        let lease = Duration::from_millis(ttl_ms);
        let node_timeout = self.config.node_timeout_for(ttl);
        let invocation = self.acquire_invocation(hold, ttl_ms, false);
        // The validity is counted from here, before round 1, so it covers both rounds.
        let requested_at = Instant::now();
        let deadline = requested_at + node_timeout;
        // From here until the grant (or the undo below), a drop of this future leaves the
        // cleanup of every server to a background task.
        pending.arm(hold);
        // Round 1. Once a majority granted, slower servers are not waited for (whatever
        // they do with this token later is covered by renewal and release on every
        // server); the granting majority's readings are all the fence needs.
        let quorum = self.quorum;
        let replies = gather(
            self.nodes
                .iter()
                .map(|node| node.script::<(i64, i64, u64)>("acquire", deadline, &invocation)),
            |replies| {
                replies
                    .iter()
                    .filter(|r| matches!(r, Ok((1, _, _))))
                    .count()
                    >= quorum
            },
        )
        .await;
        let mut won = 0;
        let mut held_for: Option<Duration> = None;
        let mut answered = 0;
        let mut highest_reading = 0u64;
        let mut first_error = None;
        for reply in replies {
            match reply {
                Ok((1, _, reading)) => {
                    won += 1;
                    answered += 1;
                    highest_reading = highest_reading.max(reading);
                }
                Ok((_, pttl, reading)) => {
                    answered += 1;
                    highest_reading = highest_reading.max(reading);
                    let retry = pttl_wait(pttl);
                    held_for = Some(held_for.map_or(retry, |w| w.min(retry)));
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        let mut outcome = None;
        if won >= self.quorum {
            // Round 2.
            let fence = highest_reading.saturating_add(1);
            match self.write_fence(hold, fence, node_timeout).await {
                Ok(true) if validity_deadline(requested_at, lease) > Instant::now() => {
                    outcome = Some(Ok(Attempt::Won(Acquired {
                        hold: hold.clone(),
                        fencing_token: FencingToken(fence),
                        requested_at,
                        lease,
                        session: 0,
                    })));
                }
                Ok(true) if !wait => {
                    outcome = Some(Err(Error::Unavailable {
                        backend: self.backend,
                        message: format!(
                            "the servers answered too slowly: the {lease:?} lease on `{}` ran out \
                             while it was being acquired",
                            hold.name
                        ),
                        source: None,
                    }));
                }
                Ok(_) => outcome = Some(Ok(Attempt::Held(Duration::ZERO))),
                Err(err) => outcome = Some(Err(err)),
            }
        } else if answered < self.quorum {
            outcome = Some(Err(Error::Unavailable {
                backend: self.backend,
                message: format!(
                    "only {answered} of {n} servers answered the acquire of `{}`; RedLock needs {}",
                    hold.name, self.quorum
                ),
                source: first_error.map(|e| Box::new(e) as lock_core::BoxError),
            }));
        }
        if let Some(Ok(Attempt::Won(acquired))) = outcome {
            return Ok(Attempt::Won(acquired));
        }
        // Not granted: undo what this round took on every server (what cannot be undone
        // now is retried in the background when the acquire ends; the next round uses a
        // new token).
        let undo = self.release_each(hold, Instant::now() + node_timeout).await;
        if undo.iter().all(Result::is_ok) {
            pending.disarm(hold);
        }
        match outcome {
            Some(result) => result,
            None => Ok(Attempt::Held(held_for.unwrap_or(Duration::ZERO))),
        }
    }

    /// RedLock round 2: stores fencing token `fence` on every server where the lock is
    /// still ours and the counter is below it (set if greater), and returns once a
    /// majority stored it. `Ok(false)`: a majority answered but refused (the lock was lost
    /// meanwhile).
    async fn write_fence(
        &self,
        hold: &RedisHold,
        fence: u64,
        node_timeout: Duration,
    ) -> Result<bool> {
        let n = self.nodes.len();
        let quorum = self.quorum;
        let mut write = self.scripts.fence_write.prepare_invoke();
        write
            .key(&hold.key)
            .key(&hold.fence_key)
            .arg(hold.token.as_str())
            .arg(fence);
        let deadline = Instant::now() + node_timeout;
        let acks = gather(
            self.nodes
                .iter()
                .map(|node| node.script::<i64>("write the fencing counter", deadline, &write)),
            |acks| acks.iter().filter(|a| matches!(a, Ok(1))).count() >= quorum,
        )
        .await;
        let stored = acks.iter().filter(|a| matches!(a, Ok(1))).count();
        let answered = acks.iter().filter(|a| a.is_ok()).count();
        if stored >= quorum {
            Ok(true)
        } else if answered >= quorum {
            Ok(false)
        } else {
            let first_error = acks.into_iter().find_map(Result::err);
            Err(Error::Unavailable {
                backend: self.backend,
                message: format!(
                    "only {answered} of {n} servers answered the fencing write of `{}`; RedLock needs {quorum}",
                    hold.name
                ),
                source: first_error.map(|e| Box::new(e) as lock_core::BoxError),
            })
        }
    }

    /// Runs the release script for `hold` on every server: 1 released, 0 gone, -1 held
    /// by another owner.
    async fn release_each(&self, hold: &RedisHold, deadline: Instant) -> Vec<Result<i64>> {
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(&hold.key)
            .arg(hold.token.as_str())
            .arg(&hold.channel);
        join_all(
            self.nodes
                .iter()
                .map(|node| node.script::<i64>("release", deadline, &invocation)),
        )
        .await
    }

    /// Releases `hold` on every server (compare-and-delete, then a wake-up publish).
    pub(crate) async fn release_all(
        &self,
        hold: &RedisHold,
        deadline: Instant,
    ) -> Result<BackendRelease> {
        let mut released = 0;
        let mut taken = 0;
        let mut answered = 0;
        let mut first_error = None;
        for reply in self.release_each(hold, deadline).await {
            match reply {
                Ok(status) => {
                    answered += 1;
                    match status {
                        1 => released += 1,
                        0 => {}
                        _ => taken += 1,
                    }
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        let reason = if taken > 0 {
            LostReason::Taken
        } else {
            LostReason::Vanished
        };
        if released >= self.quorum {
            Ok(BackendRelease::Released)
        } else if answered >= self.quorum {
            Ok(BackendRelease::NotOwner(reason))
        } else if self.nodes.len() == 1 {
            Err(first_error.unwrap_or_else(|| error::protocol(self.backend, "no reply".into())))
        } else {
            Err(Error::Unavailable {
                backend: self.backend,
                message: format!(
                    "only {answered} of {} servers answered the release of `{}`",
                    self.nodes.len(),
                    hold.name
                ),
                source: first_error.map(|e| Box::new(e) as lock_core::BoxError),
            })
        }
    }
}

/// Runs `calls` concurrently and collects their results as they finish, until `enough`
/// says the outcome is decided or all are done; the calls still running are dropped.
async fn gather<T, F>(
    calls: impl IntoIterator<Item = F>,
    enough: impl Fn(&[Result<T>]) -> bool,
) -> Vec<Result<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    let mut running: FuturesUnordered<F> = calls.into_iter().collect();
    let mut done = Vec::with_capacity(running.len());
    while let Some(result) = running.next().await {
        done.push(result);
        if enough(&done) {
            break;
        }
    }
    done
}

/// How long to wait before retrying a lock whose holder's key expires in `pttl` ms.
fn pttl_wait(pttl: i64) -> Duration {
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
    /// When this future is dropped while an acquire request is in flight (or after a
    /// RedLock round took some servers), a background task releases whatever it may
    /// have taken (compare-and-delete on the owner token, so nothing else is touched);
    /// the subscription to the wake-up channel is left at once.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<RedisHold>>> {
        let inner = &self.inner;
        let first = self.hold(&request);
        let mut pending = Pending {
            inner: Arc::clone(inner),
            dirty: Vec::new(),
        };
        let recheck = inner.config.lock.recheck;
        let mut subscription: Option<Subscription> = None;
        let mut round = 0u64;
        loop {
            if let Some(subscription) = subscription.as_mut() {
                subscription.mark();
            }
            let attempt = if inner.config.redlock {
                // Each RedLock round has its own owner token, so that a late undo of an
                // earlier round can never remove what a later round took.
                let hold = first.for_round(round);
                inner
                    .attempt_redlock(&hold, request.ttl, request.wait, &mut pending)
                    .await?
            } else {
                inner
                    .attempt_single(&first, request.ttl, &mut pending)
                    .await?
            };
            round += 1;
            let retry_in = match attempt {
                Attempt::Won(acquired) => {
                    pending.disarm(&acquired.hold);
                    return Ok(Some(acquired));
                }
                Attempt::Held(_) if !request.wait => return Ok(None),
                Attempt::Held(retry_in) => retry_in,
            };
            let mut nap = retry_in.min(recheck).max(Duration::from_millis(1));
            if inner.config.redlock {
                // Contenders that split the servers between them must not retry in step.
                let spread =
                    (request.ttl / 50).clamp(Duration::from_millis(2), Duration::from_millis(25));
                nap += rand::rng().random_range(Duration::ZERO..spread);
            }
            match subscription.as_mut() {
                Some(subscription) => {
                    tokio::select! {
                        () = subscription.rung() => {}
                        () = sleep(nap) => {}
                    }
                }
                // Subscribing rings the bell once confirmed, so the next attempt comes
                // after the subscription is live and no release is missed in between.
                None => subscription = Some(inner.wakeups.join(&first.channel)),
            }
        }
    }

    async fn renew(&self, items: &[RenewItem<'_, RedisHold>]) -> Result<Vec<RenewOutcome>> {
        crate::lease::renew(&self.inner, items).await
    }

    async fn release(&self, hold: &RedisHold) -> Result<BackendRelease> {
        self.inner
            .release_all(hold, self.inner.request_deadline())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_hash_tags_and_share_a_slot() {
        let keys = KeyLayout::new("distlock:");
        let name = LockName::new("{jobs}/50%").unwrap();
        let lock = keys.lock_key(&name);
        assert_eq!(lock, "distlock:%7Bjobs%7D/50%25");
        assert_eq!(keys.fence_key(&name), format!("distlock:{{{lock}}}:fence"));
        assert_eq!(
            keys.wakeup_channel(&name),
            format!("distlock:{{{lock}}}:released")
        );
        let plain = KeyLayout::new("");
        assert_eq!(plain.lock_key(&LockName::new("jobs").unwrap()), "jobs");
        assert_ne!(
            keys.lock_key(&LockName::new("a{b").unwrap()),
            keys.lock_key(&LockName::new("a%7Bb").unwrap())
        );
    }

    #[test]
    fn waits_follow_the_holders_expiry() {
        assert_eq!(pttl_wait(250), Duration::from_millis(251));
        assert_eq!(pttl_wait(-1), Duration::MAX);
        assert_eq!(pttl_wait(-2), Duration::ZERO);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 1);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
    }
}
