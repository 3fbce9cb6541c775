//! Read-write locks: readers together and never beside a writer, FIFO so that writers
//! are not starved, a downgrade without a window, cancellation leaves nothing (the
//! upgradeable readers' rules are in `upgrade`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{AcquireOptions, DistributedLock, LockOptions, ReadGuard, RwLock, WriteGuard};
use rand::Rng;
use tokio::time::{sleep, timeout, Instant};

use super::semaphore::semaphore;
use super::{
    cut_off_then_replaced, eventually_empty, offered, push_only_options, unique_name,
    waiters_reach, PROMPT,
};
use crate::factory::Factory;
use crate::limits::HoldLog;
use crate::with_ttl;

/// The read-write lock `name` on `client`, or `None` (said loudly) when the backend has
/// none.
pub(super) fn rwlock(client: &Arc<dyn DistributedLock>, name: &str, rule: &str) -> Option<RwLock> {
    offered(RwLock::new(Arc::clone(client), name), rule)
}

pub(super) async fn read(lock: &RwLock, limit: Duration) -> ReadGuard {
    lock.read_with(&AcquireOptions::timeout(limit))
        .await
        .expect("read within the limit")
        .expect("a waiting read ends holding")
}

pub(super) async fn write(lock: &RwLock, limit: Duration) -> WriteGuard {
    lock.write_with(&AcquireOptions::timeout(limit))
        .await
        .expect("write within the limit")
        .expect("a waiting write ends holding")
}

/// The read-write lock `name` on a new client whose waiters act only on pushes.
pub(super) async fn push_only_rwlock(
    factory: &dyn Factory,
    name: &lock_core::LockName,
    rule: &str,
) -> RwLock {
    let client = factory.client(push_only_options()).await;
    rwlock(&client, name.as_str(), rule).expect("capable")
}

/// `acquire` in a task of its own, which ends with the guard and when it was granted.
pub(super) fn timed<G: Send + 'static>(
    acquire: impl std::future::Future<Output = G> + Send + 'static,
) -> tokio::task::JoinHandle<(G, Instant)> {
    tokio::spawn(async move {
        let guard = acquire.await;
        (guard, Instant::now())
    })
}

/// The guard of `task` (see [`timed`]), which must end within `limit` (`what` says why)
/// and be granted no earlier than `after`.
pub(super) async fn served<G>(
    task: tokio::task::JoinHandle<(G, Instant)>,
    limit: Duration,
    after: Instant,
    what: &str,
) -> G {
    let (guard, at) = timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .expect("task");
    assert!(at >= after, "{what}: granted too early");
    guard
}

/// Four readers and two writers take the lock 4 times each: no writer is ever beside
/// anyone, and readers do hold together.
pub async fn rwlock_readers_share_writers_exclude(factory: &dyn Factory) {
    const READERS: usize = 4;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 4;
    let rule = "rwlock_readers_share_writers_exclude";
    let name = unique_name(rule);
    let log = HoldLog::new();
    let mut tasks = Vec::new();
    for i in 0..READERS + WRITERS {
        let client = factory.client(LockOptions::default()).await;
        let Some(lock) = rwlock(&client, name.as_str(), rule) else {
            return;
        };
        let log = log.clone();
        let writer = i >= READERS;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                // The time inside starts once the hold is granted.
                let inside = || sleep(Duration::from_millis(60));
                if writer {
                    let guard = write(&lock, Duration::from_secs(60)).await;
                    log.inside(&guard, true, inside()).await;
                    guard.release().await.expect("release");
                } else {
                    let guard = read(&lock, Duration::from_secs(60)).await;
                    log.inside(&guard, false, inside()).await;
                    guard.release().await.expect("release");
                }
                let pause = rand::rng().random_range(0..20);
                sleep(Duration::from_millis(pause)).await;
            }
            drop(client);
        }));
    }
    for task in join_all(tasks).await {
        task.expect("contender task");
    }
    let report = log.check();
    assert_eq!(
        report.unvouched, 0,
        "every guard vouched while inside: {report:?}"
    );
    assert!(
        report.exclusive_overlaps.is_empty(),
        "a writer beside someone: {report:?}"
    );
    assert!(
        report.most_at_once >= 2,
        "readers never held together: {report:?}"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// A writer waiting behind a reader is not overtaken by later readers: a reader's try
/// fails while the writer waits, the writer is served by a push when the first reader
/// leaves, and the later reader after the writer.
pub async fn rwlock_writer_not_starved(factory: &dyn Factory) {
    let rule = "rwlock_writer_not_starved";
    let name = unique_name(rule);
    let first = factory.client(LockOptions::default()).await;
    let Some(on_first) = rwlock(&first, name.as_str(), rule) else {
        return;
    };
    let on_writer = push_only_rwlock(factory, &name, rule).await;
    let on_later = push_only_rwlock(factory, &name, rule).await;

    let reading = read(&on_first, PROMPT).await;
    let waiting_writer = timed(async move { write(&on_writer, Duration::from_secs(30)).await });
    waiters_reach(&*first, &name, 1).await;
    assert!(
        on_later
            .read_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a reader's try must not overtake a waiting writer"
    );
    let later_reader = timed(async move { read(&on_later, Duration::from_secs(30)).await });
    waiters_reach(&*first, &name, 2).await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        !later_reader.is_finished(),
        "a later reader waits for the writer"
    );
    let released = Instant::now();
    reading.release().await.expect("release");
    let (writing, wrote_at) = timeout(PROMPT, waiting_writer)
        .await
        .expect("the writer is served by a push")
        .expect("writer task");
    assert!(wrote_at - released < PROMPT);
    sleep(Duration::from_millis(200)).await;
    assert!(!later_reader.is_finished(), "no reader beside the writer");
    let freed = Instant::now();
    writing.release().await.expect("release");
    let late = served(
        later_reader,
        PROMPT,
        freed,
        "the later reader is served after the writer",
    )
    .await;
    late.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// A writer downgrades to a reader with a reader and then a writer queued behind it: the
/// guard stays Held with its fencing token throughout, the queued reader joins it by a
/// push, the queued writer waits until both readers leave.
pub async fn rwlock_downgrade_without_window(factory: &dyn Factory) {
    let rule = "rwlock_downgrade_without_window";
    let name = unique_name(rule);
    let owner = factory.client(LockOptions::default()).await;
    let Some(on_owner) = rwlock(&owner, name.as_str(), rule) else {
        return;
    };
    let on_reader = push_only_rwlock(factory, &name, rule).await;
    let on_writer = push_only_rwlock(factory, &name, rule).await;

    let writing = write(&on_owner, PROMPT).await;
    let token = writing.fencing_token();
    let watch = writing.watch();
    let queued_reader =
        tokio::spawn(async move { read(&on_reader, Duration::from_secs(30)).await });
    waiters_reach(&*owner, &name, 1).await;
    let queued_writer =
        tokio::spawn(async move { write(&on_writer, Duration::from_secs(30)).await });
    waiters_reach(&*owner, &name, 2).await;

    let reading = writing.downgrade().await.expect("downgrade");
    assert!(reading.is_held(), "held through the downgrade");
    assert_eq!(reading.fencing_token(), token, "the fencing token stays");
    let joined = timeout(PROMPT, queued_reader)
        .await
        .expect("the queued reader joins the downgraded holder by a push")
        .expect("reader task");
    sleep(Duration::from_millis(300)).await;
    assert!(
        !queued_writer.is_finished(),
        "the queued writer waits for both readers"
    );
    assert!(
        !watch.state().is_lost(),
        "the downgraded guard never turned Lost"
    );
    let inspected = on_owner.occupancy().await.expect("inspect");
    assert_eq!(inspected.holders().count(), 2, "two readers: {inspected:?}");
    reading.release().await.expect("release");
    sleep(Duration::from_millis(200)).await;
    assert!(
        !queued_writer.is_finished(),
        "the queued writer waits for the other reader"
    );
    joined.release().await.expect("release");
    let last = timeout(PROMPT, queued_writer)
        .await
        .expect("the writer is served once the readers left")
        .expect("writer task");
    last.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// Acquires of permits, reads and writes dropped at random points under contention leave
/// no entry behind, and a semaphore's permits are all free right after.
pub async fn primitives_cancellation_leaves_nothing(factory: &dyn Factory) {
    const ROUNDS: usize = 24;
    let rule = "primitives_cancellation_leaves_nothing";
    let (sem_name, rw_name) = (unique_name(rule), unique_name(rule));
    let holder = factory.client(LockOptions::default()).await;
    let Some(on_holder) = rwlock(&holder, rw_name.as_str(), rule) else {
        return;
    };
    let Some(held_sem) = semaphore(&holder, sem_name.as_str(), 2, rule) else {
        return;
    };
    let writing = write(&on_holder, PROMPT).await;
    let permits = [
        held_sem
            .acquire_with(&AcquireOptions::try_once())
            .await
            .expect("permit")
            .expect("free"),
        held_sem
            .acquire_with(&AcquireOptions::try_once())
            .await
            .expect("permit")
            .expect("free"),
    ];
    let mut releases = Some((writing, permits));
    let client = factory.client(LockOptions::default()).await;
    let lock = rwlock(&client, rw_name.as_str(), rule).expect("capable");
    let sem = semaphore(&client, sem_name.as_str(), 2, rule).expect("capable");
    let mut contenders = Vec::new();
    for round in 0..ROUNDS {
        let (lock, sem) = (lock.clone(), sem.clone());
        let cut_after = Duration::from_micros(rand::rng().random_range(0..30_000));
        contenders.push(tokio::spawn(async move {
            let forever = AcquireOptions::forever();
            // Whatever happens, the future is dropped: at a random await point, or just
            // after it was granted (the guard is then dropped too).
            match round % 3 {
                0 => drop(timeout(cut_after, lock.read_with(&forever)).await),
                1 => drop(timeout(cut_after, lock.write_with(&forever)).await),
                _ => drop(timeout(cut_after, sem.acquire_with(&forever)).await),
            }
        }));
        if round == ROUNDS / 2 {
            if let Some((writing, permits)) = releases.take() {
                writing.release().await.expect("release");
                for permit in permits {
                    permit.release().await.expect("release");
                }
            }
        }
        let pause = Duration::from_millis(rand::rng().random_range(0..5));
        sleep(pause).await;
    }
    for task in contenders {
        task.await.expect("contender task");
    }
    let names = [sem_name.clone(), rw_name.clone()];
    eventually_empty(factory, &names, rule).await;
    let fresh = factory.client(LockOptions::default()).await;
    let sem = semaphore(&fresh, sem_name.as_str(), 2, rule).expect("capable");
    let both = [
        sem.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try"),
        sem.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try"),
    ];
    assert!(
        both.iter().all(Option::is_some),
        "both permits are free again"
    );
    for permit in both.into_iter().flatten() {
        permit.release().await.expect("release");
    }
    let lock = rwlock(&fresh, rw_name.as_str(), rule).expect("capable");
    let writing = lock
        .write_with(&AcquireOptions::try_once())
        .await
        .expect("try")
        .expect("the lock is free right after the cancellations");
    writing.release().await.expect("release");
    eventually_empty(factory, &names, rule).await;
}

/// A writer cut off from the server turns Lost before a waiting writer is given the lock,
/// which happens within the TTL; the waiter, granted by its own acquire once the cut-off
/// lease ran out, holds for its own TTL (the lease oracle reads its server's lease).
pub async fn rwlock_cut_off_writer_is_replaced(factory: &dyn Factory) {
    let rule = "rwlock_cut_off_writer_is_replaced";
    if !super::leased(factory, rule).await {
        return;
    }
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let (a, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let b = factory.client(with_ttl(ttl)).await;
    let Some(on_a) = rwlock(&a, name.as_str(), rule) else {
        return;
    };
    let on_b = rwlock(&b, name.as_str(), rule).expect("capable");
    let first = write(&on_a, PROMPT).await;
    let next = async {
        let waiting = tokio::spawn(async move { write(&on_b, ttl * 4 + PROMPT).await });
        waiting.await.expect("the waiting writer")
    };
    let second = cut_off_then_replaced(first.watch(), &*crash, ttl, next).await;
    sleep(ttl / 2).await;
    assert!(second.is_held(), "[{rule}] the new writer holds on");
    second.release().await.expect("release");
    drop(first);
}
