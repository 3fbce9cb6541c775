//! The shared lease machinery, observed through a wrapper around the memory backend that
//! counts renewal requests and lets the test drive session health.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::memory::{MemoryBackend, MemorySpace};
use lock_core::raw::backend::LeaseClient;
use lock_core::raw::backend::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionHealth,
    SessionStatus,
};
use lock_core::{
    AcquireOptions, Capabilities, DistributedLock, DistributedLockExt, LockName, LockOptions,
    LockState, LostReason, ReleaseOutcome, Result,
};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

/// The backend under test: a shared handle on [`Instrumented`].
#[derive(Debug, Clone)]
struct Probe(Arc<Instrumented>);

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Memory backend plus renewal counters and a test-driven session.
struct Instrumented {
    inner: lock_core::memory::MemoryLock,
    renew_calls: AtomicUsize,
    renewed_items: AtomicUsize,
    session: watch::Sender<SessionStatus>,
    /// The renewals of the holds under `stalled/` (their own renewal group) never answer.
    stalled: AtomicBool,
}

impl fmt::Debug for Instrumented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Instrumented")
    }
}

impl fmt::Display for Instrumented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instrumented {}", self.inner)
    }
}

#[async_trait]
impl Backend for Probe {
    type Hold = <MemoryBackend as Backend>::Hold;

    fn capabilities(&self) -> Capabilities {
        self.0.inner.backend().capabilities()
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<Self::Hold>>> {
        let mut acquired = self.0.inner.backend().acquire(request).await?;
        if let Some(acquired) = acquired.as_mut() {
            acquired.session = self.0.session.borrow().epoch;
        }
        Ok(acquired)
    }

    async fn renew(&self, items: &[RenewItem<'_, Self::Hold>]) -> Result<Vec<RenewOutcome>> {
        self.0.renew_calls.fetch_add(1, Ordering::SeqCst);
        self.0
            .renewed_items
            .fetch_add(items.len(), Ordering::SeqCst);
        if self.0.stalled.load(Ordering::SeqCst) && items.iter().any(|i| stalled(i.hold)) {
            std::future::pending::<()>().await;
        }
        self.0.inner.backend().renew(items).await
    }

    fn renewal_group(&self, hold: &Self::Hold) -> u64 {
        u64::from(stalled(hold))
    }

    async fn release(&self, hold: &Self::Hold) -> Result<BackendRelease> {
        self.0.inner.backend().release(hold).await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.0.session.subscribe())
    }
}

/// Whether `hold` is one whose renewal a stall holds up (see [`Instrumented::stalled`]).
fn stalled(hold: &<MemoryBackend as Backend>::Hold) -> bool {
    hold.name().as_str().starts_with("stalled/")
}

fn instrumented(ttl: Duration) -> (LeaseClient<Probe>, Arc<Instrumented>) {
    let space = MemorySpace::named(&format!("lease-{}", uuid::Uuid::new_v4()));
    let mut options = LockOptions::default();
    options.ttl = ttl;
    let inner = MemoryBackend::client(space, options.clone()).expect("memory client");
    let (session, _) = watch::channel(SessionStatus {
        epoch: 1,
        health: SessionHealth::Connected,
    });
    let probe = Arc::new(Instrumented {
        inner,
        renew_calls: AtomicUsize::new(0),
        renewed_items: AtomicUsize::new(0),
        session,
        stalled: AtomicBool::new(false),
    });
    let client = LeaseClient::new(Probe(Arc::clone(&probe)), options).expect("client");
    (client, probe)
}

/// Renewal cost does not grow with the number of held locks: one request per interval
/// carries every hold of the client.
#[tokio::test]
async fn renewal_is_batched_per_client() {
    const LOCKS: usize = 200;
    let ttl = Duration::from_millis(600);
    let (client, probe) = instrumented(ttl);
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        let guard = client.try_lock(&format!("batch/{i}")).await.unwrap();
        guards.push(guard.expect("free lock"));
    }
    let started = Instant::now();
    sleep(ttl * 3).await;
    let elapsed = started.elapsed();
    let calls = probe.renew_calls.load(Ordering::SeqCst);
    let items = probe.renewed_items.load(Ordering::SeqCst);
    let intervals = usize::try_from(elapsed.as_millis() / (ttl / 3).as_millis() + 1).unwrap();
    assert!(calls >= 3, "renewals happened: {calls}");
    assert!(
        calls <= 2 * intervals + 2,
        "{calls} renewal requests in {intervals} intervals for {LOCKS} locks"
    );
    assert!(
        items / calls >= LOCKS / 2,
        "each request carries many holds: {items} items in {calls} calls"
    );
    for guard in guards {
        assert_eq!(guard.state(), LockState::Held);
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
}

/// Each renewal group is renewed by calls of its own: while one group's renewal gets no
/// answer, the holds of the other group are renewed and stay Held, and the silent
/// group's holds are Lost at their deadline.
#[tokio::test]
async fn a_silent_renewal_group_delays_only_its_own_holds() {
    let ttl = Duration::from_millis(300);
    let (client, probe) = instrumented(ttl);
    let answered = client.try_lock("answered/a").await.unwrap().expect("free");
    let silent = client.try_lock("stalled/b").await.unwrap().expect("free");
    probe.stalled.store(true, Ordering::SeqCst);
    let started = Instant::now();
    while started.elapsed() < ttl * 4 {
        let state = answered.state();
        assert_eq!(state, LockState::Held, "+{:?}", started.elapsed());
        sleep(Duration::from_millis(5)).await;
    }
    assert!(silent.state().is_lost(), "{:?}", silent.state());
    probe.stalled.store(false, Ordering::SeqCst);
    assert_eq!(answered.release().await.unwrap(), ReleaseOutcome::Released);
    let _ = silent.release().await;
}

/// Session health drives the state: suspended → Suspect, reconnected → Held, expired →
/// Lost; holds of an older epoch are lost when a new session replaces it; a grant on a
/// session that already ended is never returned as held.
#[tokio::test]
async fn session_health_drives_hold_state() {
    let (client, probe) = instrumented(Duration::from_secs(30));
    let guard = client.lock("session/a").await.unwrap();
    let mut watch = guard.watch();
    let set = |epoch, health| probe.session.send_replace(SessionStatus { epoch, health });

    set(1, SessionHealth::Suspended);
    assert_eq!(
        timeout(Duration::from_secs(1), watch.changed())
            .await
            .unwrap(),
        LockState::Suspect
    );
    set(1, SessionHealth::Connected);
    assert_eq!(
        timeout(Duration::from_secs(1), watch.changed())
            .await
            .unwrap(),
        LockState::Held
    );
    set(1, SessionHealth::Expired);
    assert_eq!(
        timeout(Duration::from_secs(1), watch.lost()).await.unwrap(),
        LostReason::SessionExpired
    );
    assert_eq!(
        guard.release().await.unwrap(),
        ReleaseOutcome::AlreadyLost(LostReason::SessionExpired)
    );

    // A grant on the expired session (epoch 1) is refused: its guard would say Held.
    let refused = client.try_lock("session/b").await.unwrap_err();
    assert!(
        matches!(
            refused,
            lock_core::Error::Lost {
                reason: LostReason::SessionExpired,
                ..
            }
        ),
        "{refused:?}"
    );

    set(2, SessionHealth::Connected);
    let old = client.lock("session/b").await.unwrap();
    set(3, SessionHealth::Connected);
    assert_eq!(
        timeout(Duration::from_secs(1), old.lost()).await.unwrap(),
        LostReason::SessionExpired
    );
    let fresh = client.lock("session/c").await.unwrap();
    sleep(Duration::from_millis(50)).await;
    assert_eq!(fresh.state(), LockState::Held);
    drop(old);
    fresh.release().await.unwrap();
}

/// The validity deadline is measured from before the request and shortened by the drift
/// margin; renewals move it forward.
#[tokio::test]
async fn validity_deadline_is_conservative() {
    let ttl = Duration::from_millis(900);
    let (client, _probe) = instrumented(ttl);
    let before = Instant::now();
    let guard = client.lock("deadline").await.unwrap();
    let after = Instant::now();
    let deadline = guard.valid_until();
    assert!(deadline <= after + ttl - lock_core::raw::backend::drift_margin(ttl));
    assert!(deadline >= before + ttl - lock_core::raw::backend::drift_margin(ttl));
    sleep(ttl / 2).await;
    assert!(guard.valid_until() > deadline, "renewed at TTL/3");
    guard.release().await.unwrap();
}

/// Reentrant acquisitions of one owner on one client are serialized, share one hold and
/// never deadlock each other.
#[tokio::test]
async fn concurrent_reentrant_acquires_share_one_hold() {
    let (client, _probe) = instrumented(Duration::from_secs(30));
    let client = Arc::new(client);
    let name = lock_core::LockName::new("reentrant/concurrent").unwrap();
    let options = lock_core::AcquireOptions::forever().reentrant("owner-1");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (client, name, options) = (Arc::clone(&client), name.clone(), options.clone());
            tokio::spawn(async move {
                use lock_core::DistributedLock;
                client.acquire(&name, &options).await.unwrap().unwrap()
            })
        })
        .collect();
    let mut guards = Vec::new();
    for task in tasks {
        guards.push(
            timeout(Duration::from_secs(2), task)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let token = guards[0].fencing_token();
    assert!(guards.iter().all(|g| g.fencing_token() == token));
    assert_eq!(client.tracked_holds(), 1);
    for guard in guards {
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(client.tracked_holds(), 0);
    assert!(client
        .try_lock("reentrant/concurrent")
        .await
        .unwrap()
        .is_some());
}

/// A hold that needs the watchdog sooner than the holds already tracked (a shorter TTL, a
/// nearer hold cap) is renewed, or capped, on its own schedule, not theirs.
#[tokio::test]
async fn a_sooner_hold_is_watched_on_its_own_schedule() {
    let (client, probe) = instrumented(Duration::from_secs(30));
    let long = client.try_lock("sooner/long").await.unwrap().expect("free");
    // The watchdog has planned its next look a third of 30 s away.
    sleep(Duration::from_millis(50)).await;
    let ttl = Duration::from_millis(150);
    let short = client
        .acquire(
            &LockName::new("sooner/short").unwrap(),
            &AcquireOptions::try_once().with_ttl(ttl),
        )
        .await
        .unwrap()
        .expect("free");
    let capped = client
        .acquire(
            &LockName::new("sooner/capped").unwrap(),
            &AcquireOptions::try_once().with_max_hold(Duration::from_millis(200)),
        )
        .await
        .unwrap()
        .expect("free");
    let first_deadline = short.valid_until();
    let mut capped_watch = capped.watch();
    let reason = timeout(Duration::from_secs(5), capped_watch.lost())
        .await
        .expect("the hold cap ends the capped hold");
    assert_eq!(reason, LostReason::HoldCapReached);
    sleep(ttl * 3).await;
    assert_eq!(short.state(), LockState::Held);
    assert!(
        short.valid_until() > first_deadline,
        "the short hold was renewed"
    );
    assert!(probe.renew_calls.load(Ordering::SeqCst) >= 2);
    assert_eq!(long.state(), LockState::Held);
    for guard in [long, short] {
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
    drop(capped);
}
