//! Mutual exclusion, fencing tokens and the TTL bound on a crashed holder.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{DistributedLockExt, LockOptions, LostReason, ReleaseOutcome};
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, push_only_options, unique_name, with_ttl, PROMPT};
use crate::factory::Factory;
use crate::fence::FencedResource;

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
    if !super::leased(factory, "fencing_tokens_increase (takeover after expiry)").await {
        return;
    }
    let (crashing, crash) = factory.crashable_client(with_ttl(ttl)).await;
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
    if !super::leased(factory, "crashed_holder_blocks_at_most_ttl").await {
        return;
    }
    let name = unique_name("crash");
    let ttl = factory.short_ttl();
    let (holder, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let other = factory.client(with_ttl(ttl)).await;
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
    // A dual lock also names the side; the rule is about the reason.
    let reason = watch.lost().await;
    assert!(
        matches!(
            reason.without_side(),
            LostReason::Expired | LostReason::SessionExpired
        ),
        "unexpected reason {reason:?}"
    );
    next.release().await.expect("release");
    drop(guard);
}
