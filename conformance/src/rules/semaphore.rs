//! Semaphores: never more holders than permits, the limit reached under load, FIFO with
//! push wake-up, disagreements refused, a cut-off holder Lost before its permit is
//! given to another (several permits at once and resizes are in `semaphore_many`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{AcquireOptions, DistributedLock, ErrorKind, LockOptions, Permit, Semaphore};
use tokio::time::{sleep, timeout, Instant};

use super::{
    cut_off_then_replaced, eventually_empty, offered, push_only_options, unique_name,
    waiters_reach, PROMPT,
};
use crate::factory::Factory;
use crate::limits::HoldLog;
use crate::with_ttl;

/// The semaphore `name` of `permits` on `client`, or `None` (said loudly) when the
/// backend has none.
pub(super) fn semaphore(
    client: &Arc<dyn DistributedLock>,
    name: &str,
    permits: u32,
    rule: &str,
) -> Option<Semaphore> {
    offered(Semaphore::new(Arc::clone(client), name, permits), rule)
}

/// Takes a permit, waiting at most `limit`.
pub(super) async fn permit(semaphore: &Semaphore, limit: Duration) -> Permit {
    semaphore
        .acquire_with(&AcquireOptions::timeout(limit))
        .await
        .expect("a permit within the limit")
        .expect("a waiting acquire ends holding")
}

/// Six contenders on a semaphore of 3 take permits 4 times each: never more than 3 hold
/// at once and every permit has a fencing token of its own; then 3 clients hold a permit
/// each at the same time while a fourth's try gets none.
pub async fn semaphore_never_exceeds_permits(factory: &dyn Factory) {
    const PERMITS: u32 = 3;
    const CONTENDERS: usize = 6;
    const ROUNDS: usize = 4;
    let rule = "semaphore_never_exceeds_permits";
    let name = unique_name(rule);
    let log = HoldLog::new();
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let client = factory.client(LockOptions::default()).await;
        let Some(semaphore) = semaphore(&client, name.as_str(), PERMITS, rule) else {
            return;
        };
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..ROUNDS {
                let permit = permit(&semaphore, Duration::from_secs(60)).await;
                log.inside(&permit, false, sleep(Duration::from_millis(60)))
                    .await;
                tokens.push(permit.fencing_token());
                permit.release().await.expect("release");
            }
            drop(client);
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for result in join_all(tasks).await {
        tokens.extend(result.expect("contender task"));
    }
    let report = log.check();
    assert_eq!(
        report.unvouched, 0,
        "every permit vouched while inside: {report:?}"
    );
    assert!(
        report.most_at_once <= PERMITS as usize,
        "more holders than permits: {report:?}"
    );
    assert!(
        report.most_at_once >= 2,
        "permits were never shared: {report:?}"
    );
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        CONTENDERS * ROUNDS,
        "a fencing token per permit"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// With every permit taken, waiters are served in arrival order, each by a push (their
/// recheck is 20 s) as soon as a permit is given back; a try meanwhile gets nothing.
pub async fn semaphore_fifo_with_push(factory: &dyn Factory) {
    const PERMITS: u32 = 2;
    const WAITERS: usize = 3;
    let rule = "semaphore_fifo_with_push";
    let name = unique_name(rule);
    let holder = factory.client(LockOptions::default()).await;
    let Some(held) = semaphore(&holder, name.as_str(), PERMITS, rule) else {
        return;
    };
    if !holder.capabilities().fair {
        eprintln!("[{rule}] {} does not claim fairness", factory.label());
        return;
    }
    let mut permits = Vec::new();
    for _ in 0..PERMITS {
        permits.push(permit(&held, PROMPT).await);
    }
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let (finish, finished) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = factory.client(push_only_options()).await;
        let semaphore = semaphore(&client, name.as_str(), PERMITS, rule).expect("capable");
        let granted_tx = granted_tx.clone();
        let mut finished = finished.clone();
        tasks.push(tokio::spawn(async move {
            let permit = permit(&semaphore, Duration::from_secs(30)).await;
            let _ = granted_tx.send(i);
            // Held until the test ends, so that only released permits serve the next.
            let _ = timeout(Duration::from_secs(30), finished.wait_for(|done| *done)).await;
            permit.release().await.expect("release");
        }));
        waiters_reach(&*holder, &name, i + 1).await;
    }
    assert!(
        held.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a try gets no permit while all are taken"
    );
    for expected in 0..WAITERS.min(PERMITS as usize) {
        let released = Instant::now();
        permits
            .pop()
            .expect("a permit")
            .release()
            .await
            .expect("release");
        let served = timeout(PROMPT, granted.recv())
            .await
            .expect("a waiter is served by a push")
            .expect("waiters alive");
        assert_eq!(served, expected, "grant order");
        assert!(released.elapsed() < PROMPT);
    }
    sleep(Duration::from_millis(200)).await;
    assert!(
        granted.try_recv().is_err(),
        "no waiter is served without a permit"
    );
    finish.send_replace(true);
    for task in tasks {
        timeout(Duration::from_secs(30), task)
            .await
            .expect("every waiter is served in the end")
            .expect("waiter task");
    }
    eventually_empty(factory, &[name], rule).await;
}

/// An acquire that disagrees on the number of permits with the holders of the name fails
/// with a conflict, once or waiting, and leaves nothing behind.
pub async fn semaphore_permits_disagreement_refused(factory: &dyn Factory) {
    let rule = "semaphore_permits_disagreement_refused";
    let name = unique_name(rule);
    let a = factory.client(LockOptions::default()).await;
    let b = factory.client(LockOptions::default()).await;
    let Some(of_three) = semaphore(&a, name.as_str(), 3, rule) else {
        return;
    };
    let of_four = semaphore(&b, name.as_str(), 4, rule).expect("capable");
    let held = permit(&of_three, PROMPT).await;
    for options in [AcquireOptions::try_once(), AcquireOptions::timeout(PROMPT)] {
        let err = of_four
            .acquire_with(&options)
            .await
            .expect_err("a disagreement on permits is refused");
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert!(!err.is_retryable());
    }
    let inspected = of_three.occupancy().await.expect("inspect");
    assert_eq!(
        inspected.holders().count(),
        1,
        "only the agreeing holder: {inspected:?}"
    );
    assert!(
        inspected.waiters.is_empty(),
        "no waiter left: {inspected:?}"
    );
    held.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// A permit holder cut off from the server turns Lost before another acquirer is given
/// its permit, which happens within the TTL.
pub async fn semaphore_cut_off_holder_is_replaced(factory: &dyn Factory) {
    let rule = "semaphore_cut_off_holder_is_replaced";
    if !super::leased(factory, rule).await {
        return;
    }
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let (a, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let b = factory.client(with_ttl(ttl)).await;
    let Some(on_a) = semaphore(&a, name.as_str(), 1, rule) else {
        return;
    };
    let on_b = semaphore(&b, name.as_str(), 1, rule).expect("capable");
    let first = permit(&on_a, PROMPT).await;
    let next = permit(&on_b, ttl * 4 + PROMPT);
    let second = cut_off_then_replaced(first.watch(), &*crash, ttl, next).await;
    second.release().await.expect("release");
    drop(first);
}
