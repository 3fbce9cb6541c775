//! Interleavings of the lease machinery with a real backend that are too narrow or too
//! rare to hit by chance, opened deterministically: an acquire attempt that fails after
//! the server granted it, a renewal reply that arrives late, the release of an ended hold
//! lost on a broken link.
//!
//! The window is too narrow to hit through the network by chance (the cleanup of a
//! failed attempt and the retry race on one connection), so [`LateCleanup`] opens it
//! deterministically around a real backend on a real server: the first attempt wins on
//! the server, its caller sees a retryable connection error instead (as if the reply
//! were lost), and the cleanup of that attempt runs only after a delay, keyed on that
//! attempt's owner token, as the backends' own cleanups of abandoned attempts are.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use lock_core::raw::backend::LeaseClient;
use lock_core::raw::backend::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionStatus,
};
use lock_core::{
    Capabilities, DistributedLock, DistributedLockExt, Error, LockName, LockOptions, OwnerToken,
    RenewalMode, Result,
};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::chaos::ChaosTarget;
use conformance::factory::Factory;

/// What removes an abandoned attempt on the server, given that attempt's lock name,
/// owner token and (when the grant reached the backend) hold. The default releases the
/// hold, which compares the owner token on the server.
pub type Cleanup<H> =
    Arc<dyn Fn(LockName, OwnerToken, Arc<H>) -> BoxFuture<'static, ()> + Send + Sync>;

/// A backend whose first acquire attempt is granted on the server but reported to the
/// caller as a lost reply; that attempt's cleanup runs `delay` later.
pub struct LateCleanup<B: Backend> {
    inner: Arc<B>,
    delay: Duration,
    armed: AtomicBool,
    cleanup: Cleanup<B::Hold>,
    cleaned: Arc<Notify>,
}

impl<B: Backend> LateCleanup<B> {
    /// Wraps `inner`; the first attempt's cleanup releases its hold after `delay`.
    pub fn new(inner: B, delay: Duration) -> Self {
        let inner = Arc::new(inner);
        let releaser = Arc::clone(&inner);
        let cleanup: Cleanup<B::Hold> = Arc::new(move |_, _, hold| {
            let releaser = Arc::clone(&releaser);
            Box::pin(async move {
                let _ = timeout(Duration::from_secs(5), releaser.release(&hold)).await;
            })
        });
        LateCleanup {
            inner,
            delay,
            armed: AtomicBool::new(true),
            cleanup,
            cleaned: Arc::new(Notify::new()),
        }
    }

    /// Replaces the cleanup with one that acts as the backend's own cleanup of an
    /// abandoned attempt does (e.g. by the owner token's marker, not by the hold).
    pub fn with_cleanup(mut self, cleanup: Cleanup<B::Hold>) -> Self {
        self.cleanup = cleanup;
        self
    }

    /// Completes once the late cleanup has run.
    pub fn cleaned(&self) -> Arc<Notify> {
        Arc::clone(&self.cleaned)
    }
}

impl<B: Backend> fmt::Debug for LateCleanup<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LateCleanup")
            .field("inner", &self.inner)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> fmt::Display for LateCleanup<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (first attempt's cleanup lands late)", self.inner)
    }
}

#[async_trait]
impl<B: Backend> Backend for LateCleanup<B> {
    type Hold = B::Hold;

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<B::Hold>>> {
        if !self.armed.swap(false, Ordering::SeqCst) {
            return self.inner.acquire(request).await;
        }
        let Some(acquired) = self.inner.acquire(request).await? else {
            return Ok(None);
        };
        let (cleanup, delay, cleaned) = (
            Arc::clone(&self.cleanup),
            self.delay,
            Arc::clone(&self.cleaned),
        );
        let (name, token, hold) = (
            request.name.clone(),
            request.token.clone(),
            Arc::new(acquired.hold),
        );
        tokio::spawn(async move {
            sleep(delay).await;
            cleanup(name, token, hold).await;
            cleaned.notify_one();
        });
        Err(Error::Connection {
            backend: self.inner.capabilities().backend,
            message: "the acquire reply was lost (injected)".into(),
            source: None,
        })
    }

    async fn renew(&self, items: &[RenewItem<'_, B::Hold>]) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(items).await
    }

    async fn release(&self, hold: &B::Hold) -> Result<BackendRelease> {
        self.inner.release(hold).await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        self.inner.session()
    }
}

/// The retry of an acquisition whose first attempt was granted on the server but
/// reported lost must survive that attempt's late cleanup: while the retry's guard is
/// valid, `other` (an independent client) never gets the lock.
///
/// `flaky` wraps a fresh backend in [`LateCleanup`] with `delay`; `options` are its
/// client options (a TTL long against `delay`, so that renewal cannot hide a vanished
/// hold in time).
pub async fn retry_survives_late_cleanup<B: Backend>(
    flaky: LateCleanup<B>,
    options: LockOptions,
    other: Arc<dyn DistributedLock>,
    name: &str,
) {
    let delay = flaky.delay;
    let cleaned = flaky.cleaned();
    let client = LeaseClient::new(flaky, options).expect("client");
    let started = Instant::now();
    let guard = client
        .lock_timeout(name, delay * 4 + Duration::from_secs(10))
        .await
        .expect("the retried acquire is granted");
    let granted_after = started.elapsed();
    timeout(delay * 4 + Duration::from_secs(10), cleaned.notified())
        .await
        .expect("the late cleanup ran");
    // The cleanup has landed. The retry's guard is still valid; nobody else may get in.
    let contender = other
        .lock_timeout(name, delay.max(Duration::from_millis(500)))
        .await;
    match contender {
        Err(err) if err.kind() == lock_core::ErrorKind::Timeout => {}
        Ok(second) => {
            let first_state = guard.state();
            let first_valid = guard
                .valid_until()
                .saturating_duration_since(Instant::now());
            drop(second);
            assert!(
                !guard.is_held() && first_valid.is_zero(),
                "two holders: the retried guard (granted after {granted_after:?}) is {first_state:?} \
                 and valid for {first_valid:?} more, yet another client was granted the lock after \
                 the first attempt's cleanup ran"
            );
        }
        Err(err) => panic!("the contender failed: {err}"),
    }
    assert!(guard.is_held(), "the retried guard is {:?}", guard.state());
    guard.release().await.expect("release");
    // The lock is free for the contender now.
    let next = other
        .lock_timeout(name, Duration::from_secs(10))
        .await
        .expect("the lock is free after the release");
    drop(next);
}

/// A backend whose renewals asking for `slow_ttl` are applied on the server at once
/// but answered `delay` later, as a reply stuck behind a slow link would be.
pub struct SlowRenewalReply<B: Backend> {
    inner: B,
    slow_ttl: Duration,
    delay: Duration,
}

impl<B: Backend> SlowRenewalReply<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, slow_ttl: Duration, delay: Duration) -> Self {
        SlowRenewalReply {
            inner,
            slow_ttl,
            delay,
        }
    }
}

impl<B: Backend> fmt::Debug for SlowRenewalReply<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlowRenewalReply")
            .field("inner", &self.inner)
            .field("slow_ttl", &self.slow_ttl)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> fmt::Display for SlowRenewalReply<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (slow renewal replies)", self.inner)
    }
}

#[async_trait]
impl<B: Backend> Backend for SlowRenewalReply<B> {
    type Hold = B::Hold;

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<B::Hold>>> {
        self.inner.acquire(request).await
    }

    async fn renew(&self, items: &[RenewItem<'_, B::Hold>]) -> Result<Vec<RenewOutcome>> {
        let outcomes = self.inner.renew(items).await;
        if items.iter().any(|item| item.ttl == self.slow_ttl) {
            sleep(self.delay).await;
        }
        outcomes
    }

    async fn release(&self, hold: &B::Hold) -> Result<BackendRelease> {
        self.inner.release(hold).await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        self.inner.session()
    }
}

/// Two extensions of one hold in flight at once: the server keeps the one it applied
/// last, and so must the guard's validity deadline. `slow` answers the extension to
/// `long` 500 ms late, after a second extension to `short` was sent; a manual-mode hold
/// must then be valid for about `short`, never `long`; once `short` has run out on the
/// server, `other` gets the lock while the guard says it is no longer valid.
pub async fn last_applied_extension_wins<B: Backend>(
    slow: SlowRenewalReply<B>,
    options: LockOptions,
    other: Arc<dyn DistributedLock>,
    name: &str,
) {
    let (long, delay) = (slow.slow_ttl, slow.delay);
    let short = options.ttl;
    let mut options = options;
    options.renewal = RenewalMode::Manual;
    let client = LeaseClient::new(slow, options).expect("client");
    let guard = client
        .lock_timeout(name, Duration::from_secs(10))
        .await
        .expect("acquire");
    let (first, second) = tokio::join!(guard.extend_for(long), async {
        sleep(delay / 5).await;
        guard.extend_for(short).await
    });
    first.expect("the long extension");
    let sent_short = Instant::now();
    second.expect("the short extension");
    let left = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    assert!(
        left <= short,
        "the guard is valid for {left:?} more, but the server applied the {short:?} extension last"
    );
    let taken = other
        .lock_timeout(name, long)
        .await
        .expect("the lock is free once the last extension ran out");
    let now = Instant::now();
    assert!(
        guard.valid_until() <= now,
        "two holders: another client got the lock {:?} after the last extension while the \
         guard is valid for {:?} more",
        now - sent_short,
        guard.valid_until() - now
    );
    drop(taken);
}

/// `extend_for` with a lease shorter than the hold's TTL: the watchdog plans the next
/// renewal from the lease just granted, so an auto-renewed hold outlives it. Backends
/// with one session-wide lease refuse another TTL with [`ErrorKind::Unsupported`].
///
/// [`ErrorKind::Unsupported`]: lock_core::ErrorKind::Unsupported
pub async fn extend_for_keeps_an_auto_renewed_hold(factory: &dyn Factory) {
    let short = factory.short_ttl();
    let mut options = LockOptions::default();
    options.ttl = short * 4;
    let client = factory.client(options).await;
    let other = factory.client(LockOptions::default()).await;
    let name = format!("extend-for/{}", uuid::Uuid::new_v4().simple());
    let guard = client
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("acquire");
    if !client.capabilities().per_lock_ttl {
        let err = guard.extend_for(short).await.expect_err("another ttl");
        assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
        guard.release().await.expect("release");
        return;
    }
    let valid_until = guard.extend_for(short).await.expect("extend_for");
    assert!(valid_until <= Instant::now() + short);
    sleep(short * 2).await;
    assert!(
        guard.is_held(),
        "an auto-renewed hold extended for {short:?} is {:?} {:?} later",
        guard.state(),
        short * 2
    );
    assert!(
        other.try_lock(&name).await.expect("try").is_none(),
        "another client got a lock that is still held"
    );
    assert_eq!(
        guard.release().await.expect("release"),
        lock_core::ReleaseOutcome::Released
    );
}

/// A hold that ended on the client (its deadline passed in manual mode) is removed on
/// the server even when the first delete is lost on a broken link: backends whose holds
/// live with a session (which survives the short cut) would otherwise keep it for the
/// life of the client.
pub async fn ended_hold_released_despite_a_broken_link(target: &dyn ChaosTarget) {
    let ttl = target.short_ttl() * 2;
    let mut options = conformance::with_ttl(ttl);
    options.renewal = RenewalMode::Manual;
    options.request_timeout = ttl / 5;
    let (client, link) = target.linked_client(options.clone()).await;
    let name = format!("ended-hold/{}", uuid::Uuid::new_v4().simple());
    let guard = client
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("acquire");
    // Cut the link just before the deadline, so the release of the ended hold is lost,
    // and heal it well within the session timeout (the TTL).
    sleep_until(guard.valid_until() - ttl / 10).await;
    link.cut();
    sleep_until(guard.valid_until() + options.request_timeout + ttl / 10).await;
    link.heal();
    assert!(guard.state().is_lost(), "the guard is {:?}", guard.state());
    let other = target.client(LockOptions::default()).await;
    let taken = other.lock_timeout(&name, ttl * 3).await;
    assert!(
        taken.is_ok(),
        "the ended hold stayed on the server: another client waited {:?} in vain ({:?})",
        ttl * 3,
        taken.err()
    );
    drop((guard, client));
}

/// A waiting acquire whose session (ZooKeeper) or lease (etcd) runs out while it waits,
/// because its client was cut off for longer than the TTL, goes on waiting with a new one
/// once the link heals, and gets the lock when the holder lets go. Nothing was granted
/// to it, so the loss of its queue entry is no reason to fail.
pub async fn waiter_outlives_its_session(target: &dyn ChaosTarget) {
    let ttl = target.short_ttl() * 2;
    let mut options = conformance::with_ttl(ttl);
    options.request_timeout = ttl / 4;
    let holder = target.client(options.clone()).await;
    let (waiter, link) = target.linked_client(options).await;
    let name = format!("waiter-session/{}", uuid::Uuid::new_v4().simple());
    let held = holder
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("acquire");
    let waiting = tokio::spawn({
        let name = name.clone();
        async move { waiter.lock_timeout(&name, ttl * 8).await }
    });
    sleep(ttl / 4).await;
    link.cut();
    sleep(ttl * 2).await;
    link.heal();
    sleep(ttl).await;
    assert!(
        !waiting.is_finished(),
        "the waiter ended while the lock was held: {:?}",
        waiting.await
    );
    held.release().await.expect("release");
    let granted = waiting.await.expect("waiter task");
    assert!(
        granted.is_ok(),
        "a waiter whose session ran out while it waited failed instead of waiting on: {:?}",
        granted.err()
    );
}
