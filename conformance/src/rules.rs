//! One public async function per rule of the contract. Each takes a [`Factory`] and
//! panics with a message naming the rule when the backend breaks it.
//!
//! Rules use fresh random lock names, so they can share one server and run in parallel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockGuard, LockName,
    LockOptions, LockState, LostReason, ReleaseOutcome, RenewalMode, RunOutcome, MAX_NAME_BYTES,
};
use rand::Rng;
use tokio::time::{sleep, timeout, Instant};

use crate::factory::Factory;
use crate::fence::FencedResource;

/// Generous bound for "promptly": pushes, background releases and renewals must act
/// well within it, while a polling loop or a wait for the TTL would not.
const PROMPT: Duration = Duration::from_secs(3);

/// A fresh lock name for one rule.
pub fn unique_name(rule: &str) -> LockName {
    let name = format!("conformance/{rule}/{}", uuid::Uuid::new_v4().simple());
    LockName::new(name).expect("generated names are valid")
}

fn options_with_ttl(ttl: Duration) -> LockOptions {
    let mut options = LockOptions::default();
    options.ttl = ttl;
    options
}

/// Options whose recheck is long, so only a push can make a waiter act promptly.
fn push_only_options() -> LockOptions {
    let mut options = LockOptions::default();
    options.recheck = Duration::from_secs(20);
    options
}

async fn eventually_empty(factory: &dyn Factory, names: &[LockName], rule: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = factory.leftovers(names).await;
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "[{rule}] {}: state left on the server after 10 s: {left:?}",
            factory.label()
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// `try_lock` on a held name returns "not acquired" (not an error); a waiter gets the lock
/// after the holder releases it, promptly (pushed, not polled).
pub async fn try_on_held_is_not_acquired(factory: &dyn Factory) {
    let name = unique_name("try_on_held");
    let a = factory.client(push_only_options()).await;
    let b = factory.client(push_only_options()).await;
    let held = a.try_lock(name.as_str()).await.expect("first try_lock");
    let held = held.expect("a free lock is acquired by try_lock");
    let second = b
        .try_lock(name.as_str())
        .await
        .expect("try_lock on a held lock is no error");
    assert!(second.is_none(), "try_lock on a held lock must return None");

    let waiter = tokio::spawn({
        let b = Arc::clone(&b);
        let name = name.clone();
        async move {
            let guard = b.lock(name.as_str()).await.expect("waiter acquires");
            (Instant::now(), guard)
        }
    });
    sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let released_at = Instant::now();
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (acquired_at, guard) = timeout(PROMPT, waiter)
        .await
        .expect("waiter is woken by a push within 3 s (its recheck is 20 s)")
        .expect("waiter task");
    assert!(acquired_at >= released_at);
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    eventually_empty(factory, &[name], "try_on_held_is_not_acquired").await;
}

/// K clients x M iterations on one name: a non-atomic read-sleep-write counter loses no
/// update, and the fenced resource sees no overlapping sections and no token going back.
pub async fn mutual_exclusion(factory: &dyn Factory) {
    const CLIENTS: usize = 4;
    const ITERATIONS: usize = 20;
    let name = unique_name("mutual_exclusion");
    let resource = FencedResource::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = factory.client(LockOptions::default()).await;
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ITERATIONS {
                let guard = client
                    .lock_timeout(name.as_str(), Duration::from_secs(60))
                    .await
                    .expect("acquire under contention");
                // Read, pause, write back: overlapping holders would lose updates.
                let written = resource
                    .increment(guard.fencing_token(), sleep(Duration::from_millis(1)))
                    .await
                    .expect("a valid holder's token is never stale");
                assert!(written, "a valid holder's write is never stale");
                assert_eq!(
                    guard.release().await.expect("release"),
                    ReleaseOutcome::Released
                );
            }
        }));
    }
    for result in join_all(tasks).await {
        result.expect("contender task");
    }
    let report = resource.check();
    assert_eq!(
        report.counter,
        (CLIENTS * ITERATIONS) as u64,
        "lost updates: critical sections overlapped ({report:?})"
    );
    assert!(report.is_safe(), "fenced resource: {report:?}");
    assert_eq!(report.sections, CLIENTS * ITERATIONS);
    eventually_empty(factory, &[name], "mutual_exclusion").await;
}

/// Fencing tokens strictly increase across successive holders, also when a holder's
/// lease expired and another took over.
pub async fn fencing_tokens_increase(factory: &dyn Factory) {
    let name = unique_name("fencing");
    let ttl = factory.short_ttl();
    let a = factory.client(LockOptions::default()).await;
    let b = factory.client(LockOptions::default()).await;
    let mut last = None;
    for round in 0..6 {
        let client = if round % 2 == 0 { &a } else { &b };
        let guard = client.lock(name.as_str()).await.expect("acquire");
        let token = guard.fencing_token();
        if let Some(previous) = last {
            assert!(
                token > previous,
                "token {token} after {previous} is not greater"
            );
        }
        last = Some(token);
        guard.release().await.expect("release");
    }
    // A takeover after expiry: the crashed holder's token is below the next one.
    let (crashing, crash) = factory.crashable_client(options_with_ttl(ttl)).await;
    let doomed = crashing
        .lock(name.as_str())
        .await
        .expect("acquire before crash");
    assert!(Some(doomed.fencing_token()) > last);
    crash.crash().await;
    let next = a
        .lock_timeout(name.as_str(), ttl * 4 + PROMPT)
        .await
        .expect("takeover after expiry");
    assert!(
        next.fencing_token() > doomed.fencing_token(),
        "takeover token {} not above the expired holder's {}",
        next.fencing_token(),
        doomed.fencing_token()
    );
    next.release().await.expect("release");
    drop(doomed);
}

/// A holder that stops renewing and never releases (crash) blocks others at most TTL plus
/// a small bound, and its guard reports Lost before anyone else acquires.
pub async fn crashed_holder_blocks_at_most_ttl(factory: &dyn Factory) {
    let name = unique_name("crash");
    let ttl = factory.short_ttl();
    let (holder, crash) = factory.crashable_client(options_with_ttl(ttl)).await;
    let other = factory.client(options_with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let mut watch = guard.watch();
    crash.crash().await;
    let crashed_at = Instant::now();
    let next = other
        .lock_timeout(name.as_str(), ttl * 4 + PROMPT)
        .await
        .expect("another client takes over after the TTL");
    let waited = crashed_at.elapsed();
    assert!(
        waited <= ttl + PROMPT,
        "takeover took {waited:?}, more than TTL {ttl:?} + {PROMPT:?}"
    );
    assert!(
        watch.state().is_lost(),
        "the crashed holder's guard must be Lost before another client acquires, is {:?}",
        watch.state()
    );
    assert!(matches!(
        watch.lost().await,
        LostReason::Expired | LostReason::SessionExpired
    ));
    next.release().await.expect("release");
    drop(guard);
}

/// Auto-renewal keeps a lock for 3 x TTL with no other holder getting it.
pub async fn auto_renewal_keeps_lock(factory: &dyn Factory) {
    let name = unique_name("renewal");
    let ttl = factory.short_ttl();
    let holder = factory.client(options_with_ttl(ttl)).await;
    let other = factory.client(options_with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let first_deadline = guard.valid_until();
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        assert!(
            other.try_lock(name.as_str()).await.expect("try").is_none(),
            "another client acquired a renewed lock"
        );
        assert_eq!(guard.state(), LockState::Held);
        sleep(ttl / 4).await;
    }
    assert!(
        guard.valid_until() > first_deadline,
        "renewal moves the deadline"
    );
    assert!(guard.is_held());
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// With a hold cap, auto-renewal stops at the cap: the guard turns Lost (hold cap) and
/// another client gets the lock.
pub async fn hold_cap_ends_renewal(factory: &dyn Factory) {
    let name = unique_name("hold_cap");
    let ttl = factory.short_ttl();
    let holder = factory.client(options_with_ttl(ttl)).await;
    let other = factory.client(options_with_ttl(ttl)).await;
    let cap = ttl * 2;
    let started = Instant::now();
    let guard = holder
        .acquire(&name, &AcquireOptions::forever().with_max_hold(cap))
        .await
        .expect("acquire")
        .expect("acquired");
    let reason = timeout(cap + PROMPT, guard.lost())
        .await
        .expect("lost at the cap");
    assert_eq!(reason, LostReason::HoldCapReached);
    assert!(started.elapsed() >= cap - ttl / 10, "lost before the cap");
    let next = other
        .lock_timeout(name.as_str(), ttl + PROMPT)
        .await
        .expect("another client acquires after the cap");
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::HoldCapReached)
    ));
    assert!(
        other.try_lock(name.as_str()).await.expect("try").is_none() || next.is_held(),
        "the capped holder's release must not free the successor's lock"
    );
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Manual mode: extend while held works; without extend the lock is lost after its TTL;
/// extend after the loss says lost.
pub async fn manual_mode(factory: &dyn Factory) {
    let name = unique_name("manual");
    let ttl = factory.short_ttl();
    let mut options = options_with_ttl(ttl);
    options.renewal = RenewalMode::Manual;
    let holder = factory.client(options).await;
    let other = factory.client(options_with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let first = guard.valid_until();
    sleep(ttl / 2).await;
    let extended = guard.extend().await.expect("extend while held");
    assert!(extended > first, "extend moves the deadline");
    assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    let reason = timeout(ttl * 2 + PROMPT, guard.lost())
        .await
        .expect("lost without extend");
    assert_eq!(reason, LostReason::Expired);
    let err = guard.extend().await.expect_err("extend after loss");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let next = other
        .lock_timeout(name.as_str(), ttl + PROMPT)
        .await
        .expect("another client acquires the expired lock");
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    assert!(next.is_held());
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The lost signal fires when the lock is stolen behind its holder, and the holder's
/// release then reports "already lost" without touching the new holder's lock.
pub async fn lost_signal_on_steal(factory: &dyn Factory) {
    let name = unique_name("steal");
    let ttl = factory.short_ttl();
    let holder = factory.client(options_with_ttl(ttl)).await;
    let thief = factory.client(options_with_ttl(ttl)).await;
    let third = factory.client(options_with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    factory.steal(&name).await;
    let successor = thief
        .lock_timeout(name.as_str(), PROMPT)
        .await
        .expect("the stolen lock is free for others");
    let reason = timeout(ttl + PROMPT, guard.lost())
        .await
        .expect("the lost signal fires within the renewal interval");
    assert!(
        matches!(
            reason,
            LostReason::Taken | LostReason::Vanished | LostReason::Expired
        ),
        "unexpected reason {reason:?}"
    );
    assert!(matches!(
        guard.release().await.expect("release of a lost lock"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    assert!(
        third.try_lock(name.as_str()).await.expect("try").is_none(),
        "the old holder's release removed the successor's lock"
    );
    assert_eq!(
        successor.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A wait with a timeout fails with a timeout error close to its deadline.
pub async fn wait_timeout(factory: &dyn Factory) {
    let name = unique_name("wait_timeout");
    let holder = factory.client(LockOptions::default()).await;
    let waiter = factory.client(LockOptions::default()).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let limit = Duration::from_millis(700);
    let started = Instant::now();
    let err = waiter
        .lock_timeout(name.as_str(), limit)
        .await
        .expect_err("the lock stays held");
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.is_retryable());
    assert!(waited >= limit, "timed out early: {waited:?}");
    assert!(waited < limit + PROMPT, "timed out late: {waited:?}");
    guard.release().await.expect("release");
    eventually_empty(factory, &[name], "wait_timeout").await;
}

/// Acquire futures dropped at random points under contention leave no waiter entry, key,
/// node or lease behind, and the lock is acquirable right after.
pub async fn cancellation_leaves_nothing(factory: &dyn Factory) {
    const ROUNDS: usize = 40;
    let name = unique_name("cancel");
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(factory.client(LockOptions::default()).await);
    }
    let holder = clients[0].lock(name.as_str()).await.expect("acquire");
    let mut holder = Some(holder);
    let mut contenders = Vec::new();
    for round in 0..ROUNDS {
        let client = Arc::clone(&clients[round % clients.len()]);
        let name = name.clone();
        let cut_after = Duration::from_micros(rand::rng().random_range(0..30_000));
        contenders.push(tokio::spawn(async move {
            // Whatever happens, the future is dropped: at a random await point, or just
            // after it won the lock (the guard is then dropped too).
            let _ = timeout(cut_after, client.lock(name.as_str())).await;
        }));
        if round == ROUNDS / 2 {
            // Free the lock while contenders come and go, so some cancellations race a grant.
            if let Some(guard) = holder.take() {
                guard.release().await.expect("release");
            }
        }
        let pause = Duration::from_millis(rand::rng().random_range(0..5));
        sleep(pause).await;
    }
    for task in contenders {
        task.await.expect("contender task");
    }
    eventually_empty(
        factory,
        std::slice::from_ref(&name),
        "cancellation_leaves_nothing",
    )
    .await;
    let fresh = factory.client(LockOptions::default()).await;
    let guard = fresh
        .try_lock(name.as_str())
        .await
        .expect("try after cancellations")
        .expect("the lock is free right after the cancellations");
    guard.release().await.expect("release");
    eventually_empty(factory, &[name], "cancellation_leaves_nothing").await;
}

/// Dropping a guard without release frees the lock promptly (background release), not
/// only at the TTL.
pub async fn drop_releases_promptly(factory: &dyn Factory) {
    let name = unique_name("drop");
    let holder = factory.client(push_only_options()).await;
    let waiter = factory.client(push_only_options()).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let waiting = tokio::spawn({
        let name = name.clone();
        async move { waiter.lock(name.as_str()).await.expect("waiter acquires") }
    });
    sleep(Duration::from_millis(200)).await;
    drop(guard);
    let next = timeout(PROMPT, waiting)
        .await
        .expect("a dropped guard frees the lock within 3 s (TTL is 30 s)")
        .expect("waiter task");
    next.release().await.expect("release");
    eventually_empty(factory, &[name], "drop_releases_promptly").await;
}

/// Waiters are granted in arrival order where the backend claims fairness.
pub async fn fifo_when_fair(factory: &dyn Factory) {
    let name = unique_name("fifo");
    let holder = factory.client(LockOptions::default()).await;
    if !holder.capabilities().fair {
        eprintln!(
            "[fifo_when_fair] {} does not claim fairness: FIFO order not required",
            factory.label()
        );
        return;
    }
    const WAITERS: usize = 5;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = factory.client(LockOptions::default()).await;
        let (name, order) = (name.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let guard = client.lock(name.as_str()).await.expect("waiter acquires");
            order.lock().expect("order").push(i);
            sleep(Duration::from_millis(20)).await;
            guard.release().await.expect("release");
        }));
        // Let this waiter reach the queue before the next one arrives.
        sleep(Duration::from_millis(250)).await;
    }
    guard.release().await.expect("release");
    for task in tasks {
        timeout(Duration::from_secs(30), task)
            .await
            .expect("all waiters served")
            .expect("waiter task");
    }
    let order = order.lock().expect("order").clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "grant order");
    eventually_empty(factory, &[name], "fifo_when_fair").await;
}

/// Reentrancy by explicit owner id: the same owner re-acquires at once and shares the
/// hold; another owner is excluded; the lock is freed by the last release only.
pub async fn reentrancy_by_owner(factory: &dyn Factory) {
    let name = unique_name("reentrant");
    let client = factory.client(LockOptions::default()).await;
    let other = factory.client(LockOptions::default()).await;
    let (outer, inner) = reentrant_pair(&*client, &name).await;
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    let stranger = client
        .acquire(&name, &AcquireOptions::try_once().reentrant("job-7"))
        .await
        .expect("try by another owner");
    assert!(stranger.is_none(), "another owner id must be excluded");
    assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    assert_eq!(
        inner.release().await.expect("inner"),
        ReleaseOutcome::Released
    );
    assert!(outer.is_held(), "the outer hold survives the inner release");
    assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    assert_eq!(
        outer.release().await.expect("outer"),
        ReleaseOutcome::Released
    );
    let next = other
        .try_lock(name.as_str())
        .await
        .expect("try")
        .expect("free after the last release");
    next.release().await.expect("release");
}

/// Two guards of one hold: owner `job-42` acquires `name`, then acquires it again.
async fn reentrant_pair(client: &dyn DistributedLock, name: &LockName) -> (LockGuard, LockGuard) {
    let outer = client
        .acquire(name, &AcquireOptions::forever().reentrant("job-42"))
        .await
        .expect("acquire")
        .expect("acquired");
    let inner = client
        .acquire(name, &AcquireOptions::try_once().reentrant("job-42"))
        .await
        .expect("reentrant acquire")
        .expect("the same owner re-acquires without waiting");
    (outer, inner)
}

/// Reentrancy on a lost hold: releasing a guard that is not the last one of the hold
/// reports the loss (`AlreadyLost`), never `Released`.
pub async fn reentrant_release_reports_loss(factory: &dyn Factory) {
    let name = unique_name("reentrant-lost");
    let ttl = factory.short_ttl();
    let client = factory.client(options_with_ttl(ttl)).await;
    let (outer, inner) = reentrant_pair(&*client, &name).await;
    factory.steal(&name).await;
    let reason = timeout(ttl + PROMPT, outer.lost())
        .await
        .expect("the lost signal fires within the renewal interval");
    let inner_outcome = inner.release().await.expect("release of the inner guard");
    assert!(
        matches!(inner_outcome, ReleaseOutcome::AlreadyLost(_)),
        "the inner guard of a hold lost by {reason:?} reported {inner_outcome:?}"
    );
    assert!(matches!(
        outer.release().await.expect("release of the outer guard"),
        ReleaseOutcome::AlreadyLost(_)
    ));
}

/// Names: `jobs` and `jobs/daily` are independent, reserved characters are escaped, and
/// empty, oversized or invalid names get a clear error and leave nothing behind.
pub async fn names_are_independent_and_checked(factory: &dyn Factory) {
    let client = factory.client(LockOptions::default()).await;
    let base = unique_name("names");
    let variants = [
        "jobs",
        "jobs/daily",
        "jobs/",
        "jobs//daily",
        "{jobs}",
        "jobs%2Fdaily",
        "jobs daily",
        "jöbs",
        "jobs.",
        "..",
        ".",
        "_c_x-lock-0000000001",
        "*",
        "jobs:daily",
    ];
    let mut guards = Vec::new();
    let mut names = Vec::new();
    for v in variants {
        let name = LockName::new(format!("{base}/{v}")).expect("valid name");
        let guard = client
            .try_lock(name.as_str())
            .await
            .unwrap_or_else(|err| panic!("name {name:?}: {err}"));
        let guard = guard.unwrap_or_else(|| panic!("{name:?} collided with another name"));
        names.push(name);
        guards.push(guard);
    }
    // Bare names too (no shared prefix), including the two the contract names.
    for bare in ["jobs", "jobs/daily"] {
        let name =
            LockName::new(format!("{}-{bare}", uuid::Uuid::new_v4().simple())).expect("valid");
        let guard = client.try_lock(name.as_str()).await.expect("try");
        guards.push(guard.expect("bare name acquired"));
        names.push(name);
    }
    for guard in guards {
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let oversized = "x".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", oversized.as_str(), "a\0b", "a\nb"] {
        let err = client.try_lock(bad).await.expect_err("bad name");
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
        assert!(!err.is_retryable());
    }
    eventually_empty(factory, &names, "names_are_independent_and_checked").await;
}

/// One client holds 1,000 distinct locks at once, keeps them through renewals, and
/// releases them all.
pub async fn thousand_locks_one_client(factory: &dyn Factory) {
    const LOCKS: usize = 1000;
    let ttl = factory.short_ttl().max(Duration::from_secs(2));
    let client = factory.client(options_with_ttl(ttl)).await;
    let other = factory.client(options_with_ttl(ttl)).await;
    let base = unique_name("many");
    let names: Vec<LockName> = (0..LOCKS)
        .map(|i| LockName::new(format!("{base}/{i}")).expect("valid"))
        .collect();
    let mut guards = Vec::with_capacity(LOCKS);
    for chunk in names.chunks(100) {
        let acquired = join_all(chunk.iter().map(|n| client.try_lock(n.as_str()))).await;
        for (name, guard) in chunk.iter().zip(acquired) {
            guards.push(
                guard
                    .expect("try")
                    .unwrap_or_else(|| panic!("{name:?} not acquired")),
            );
        }
    }
    sleep(ttl + ttl / 2).await;
    for (i, guard) in guards.iter().enumerate() {
        assert_eq!(
            guard.state(),
            LockState::Held,
            "lock {i} not kept through renewal"
        );
    }
    for name in names.iter().step_by(97) {
        assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    }
    let outcomes = join_all(guards.into_iter().map(|g| g.release())).await;
    for outcome in outcomes {
        assert_eq!(outcome.expect("release"), ReleaseOutcome::Released);
    }
    eventually_empty(factory, &names, "thousand_locks_one_client").await;
}

/// Malformed URLs and options get clear typed errors, never a panic.
pub async fn bad_urls_and_options(factory: &dyn Factory) {
    let url = factory.url();
    let cases = [
        format!("{url}?ttl=abc"),
        format!("{url}?ttl=0s"),
        format!("{url}?renewal=sometimes"),
        format!("{url}?no_such_option=1"),
        format!("{url}?ttl=100000h"),
    ];
    for case in &cases {
        match lock_core::connect(case).await {
            Ok(client) => panic!("{case} was accepted: {client}"),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{case}: {err}");
                assert!(!err.is_retryable());
            }
        }
    }
    let client = factory.client(LockOptions::default()).await;
    let name = unique_name("bad_options");
    let min = client.capabilities().min_ttl;
    if min > Duration::from_nanos(1) {
        let err = client
            .acquire(&name, &AcquireOptions::try_once().with_ttl(min / 2))
            .await
            .expect_err("ttl below the backend minimum");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidConfig | ErrorKind::Unsupported
            ),
            "{err}"
        );
    }
    let err = client
        .acquire(&name, &AcquireOptions::try_once().with_ttl(Duration::ZERO))
        .await
        .expect_err("zero ttl");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidConfig | ErrorKind::Unsupported
        ),
        "{err}"
    );
    eventually_empty(factory, &[name], "bad_urls_and_options").await;
}

/// A scoped run completes and releases when the lock stays held, and is cancelled with
/// a Lost outcome when the lock is stolen mid-run.
pub async fn scoped_run_cancels_on_loss(factory: &dyn Factory) {
    let ttl = factory.short_ttl();
    let client = factory.client(options_with_ttl(ttl)).await;
    let name = unique_name("scoped");
    let outcome = client
        .with_lock(
            name.as_str(),
            &AcquireOptions::forever(),
            |ctx| async move { ctx.fencing_token },
        )
        .await
        .expect("run");
    assert!(matches!(
        outcome,
        RunOutcome::Completed {
            release: ReleaseOutcome::Released,
            ..
        }
    ));

    let finished = Arc::new(AtomicU64::new(0));
    let run = {
        let finished = Arc::clone(&finished);
        let name = name.clone();
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            client
                .with_lock(
                    name.as_str(),
                    &AcquireOptions::forever(),
                    |_ctx| async move {
                        sleep(Duration::from_secs(60)).await;
                        finished.store(1, Ordering::SeqCst);
                    },
                )
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    factory.steal(&name).await;
    let outcome = timeout(ttl + PROMPT, run)
        .await
        .expect("the run ends when its lock is lost")
        .expect("run task")
        .expect("run");
    assert!(matches!(outcome, RunOutcome::Lost { .. }), "{outcome:?}");
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the work was not cancelled"
    );
    eventually_empty(factory, &[name], "scoped_run_cancels_on_loss").await;
}
