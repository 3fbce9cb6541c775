//! Waiters: timeouts, cancellation, prompt release on drop and fair order.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, ErrorKind, LockOptions};
use rand::Rng;
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, push_only_options, unique_name, PROMPT};
use crate::factory::Factory;

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
        let (lock, order) = (name.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let guard = client.lock(lock.as_str()).await.expect("waiter acquires");
            order.lock().expect("order").push(i);
            sleep(Duration::from_millis(20)).await;
            guard.release().await.expect("release");
        }));
        // Let this waiter reach the queue before the next one arrives: wait until the
        // queue shows it (a fair backend reports its waiters), at most a few seconds.
        let queued_by = Instant::now() + Duration::from_secs(5);
        loop {
            sleep(Duration::from_millis(20)).await;
            let queued = holder.inspect(&name).await.map_or(0, |o| o.waiters.len());
            if queued > i || Instant::now() >= queued_by {
                break;
            }
        }
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
