//! Acquire attempts that fail after the server granted them, and whose cleanup lands
//! late: the interleaving in which a retry of the same acquisition must not be undone by
//! the cleanup of the attempt before it.
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
use lock_core::backend::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionStatus,
};
use lock_core::{
    Capabilities, DistributedLock, DistributedLockExt, Error, LeaseClient, LockName, LockOptions,
    OwnerToken, Result,
};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, timeout, Instant};

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
