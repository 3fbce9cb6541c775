//! Semaphores and read-write locks on Redis: the key layout, the grant rule on the FIFO
//! queue (permits, writers not starved, downgrade), the permits disagreement, a crashed
//! holder's permit freed by expiry, and RedLock's refusal; on one server and Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use conformance::Factory;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockState, ReleaseOutcome,
    RwLock, Semaphore,
};
use lock_redis::{KeyLayout, DEFAULT_PREFIX};
use testkit::redis::{unique_name as name, with_ttl, ClusterFactory, RedisFactory};
use tokio::time::{sleep, timeout, Instant};

pub(crate) fn try_once() -> AcquireOptions {
    AcquireOptions::try_once()
}

pub(crate) fn within(limit: Duration) -> AcquireOptions {
    AcquireOptions::timeout(limit)
}

/// The lock key of a semaphore is a sorted set of holders by expiry, with a holders'
/// table beside it in the same hash slot naming each holder's kind and fencing token and
/// the name's kind; all of it is gone once the last holder released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_layout_is_a_sorted_set_and_a_table() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let client = factory.make(with_ttl(Duration::from_secs(5))).await;
    let lock = name("sem_layout");
    let sem = Semaphore::new(client.clone(), lock.as_str(), 2).expect("semaphore");
    let a = sem
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let b = sem
        .acquire_with(&try_once())
        .await
        .expect("b")
        .expect("second permit");
    assert!(
        sem.acquire_with(&try_once()).await.expect("c").is_none(),
        "two permits only"
    );
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let key = keys.lock_key(&lock);
    let table = keys.holders_key(&lock);
    assert_eq!(table, format!("{DEFAULT_PREFIX}{{{key}}}:holders"));
    let mut conn = factory.raw_all().await.remove(0);
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "zset");
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(holders.len(), 2);
    let name_kind: String = redis::cmd("HGET")
        .arg(&table)
        .arg("kind")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(name_kind, "P2");
    let entry: String = redis::cmd("HGET")
        .arg(&table)
        .arg(a.owner_token().as_str())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(entry, format!("P2:{}", a.fencing_token().0));
    assert!(b.fencing_token() > a.fencing_token());
    let seen = sem.occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2);
    assert!(seen
        .holders()
        .all(|h| h.kind == Some(lock_core::raw::backend::HoldKind::permit(2))));
    assert_eq!(client.list("").await.expect("list"), vec![lock.clone()]);
    assert_eq!(
        a.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        b.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let left: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .arg(&table)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "nothing left once every permit is back");
}

/// Participants that disagree on the number of permits get a typed conflict, never an
/// extra permit; a mutex on a read-write lock's name too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_disagreement_is_refused() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let client = factory.make(with_ttl(Duration::from_secs(5))).await;
    let lock = name("sem_disagree");
    let two = Semaphore::new(client.clone(), lock.as_str(), 2).expect("semaphore");
    let three = Semaphore::new(client.clone(), lock.as_str(), 3).expect("semaphore");
    let held = two
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let err = three
        .acquire_with(&try_once())
        .await
        .expect_err("3 beside 2");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("2 permits"), "{err}");
    let rw = RwLock::new(client.clone(), lock.as_str()).expect("rwlock");
    let err = rw
        .read_with(&try_once())
        .await
        .expect_err("a reader on a semaphore");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    let err = client
        .try_lock(lock.as_str())
        .await
        .expect_err("a mutex on a semaphore");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("2 permits"), "{err}");
    held.release().await.expect("release");
    // Free again: the name may be used as another kind now.
    let permit = three
        .acquire_with(&try_once())
        .await
        .expect("3")
        .expect("free");
    permit.release().await.expect("release");
    let mutex = client
        .try_lock(name("rw_mutex").as_str())
        .await
        .expect("mutex")
        .expect("free");
    let err = RwLock::new(client.clone(), mutex.name().as_str())
        .expect("rwlock")
        .write_with(&try_once())
        .await
        .expect_err("a writer on a mutex");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    mutex.release().await.expect("release");
}

/// A holder that crashed (cut off, never releasing) keeps its permit only until its TTL:
/// the waiter at the head of the queue takes it within the TTL plus a small bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_is_freed_by_expiry() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let (crashing, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let other = factory.make(with_ttl(ttl)).await;
    let lock = name("sem_crash");
    let on_crashing = Semaphore::new(crashing, lock.as_str(), 1).expect("semaphore");
    let on_other = Semaphore::new(other, lock.as_str(), 1).expect("semaphore");
    let held = on_crashing
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let crashed_at = Instant::now();
    crash.crash().await;
    let next = on_other
        .acquire_with(&within(ttl * 3))
        .await
        .expect("acquire")
        .expect("the crashed holder's permit comes back");
    let waited = crashed_at.elapsed();
    println!("permit taken over {waited:?} after the crash");
    assert!(waited <= ttl + Duration::from_millis(1500), "{waited:?}");
    assert!(next.fencing_token() > held.fencing_token());
    std::mem::forget(held);
    next.release().await.expect("release");
}

/// A waiter with a TTL well above the hand-off lease that takes a crashed holder's place
/// by its own acquire (no release hands it over) holds for its TTL on the server, not for
/// the hand-off lease: long after the lease, nobody else is granted the writer or the
/// one permit it holds, and the key keeps at least what the guard promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_settled_grant_keeps_the_waiters_ttl() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let short = Duration::from_secs(2);
    let long = Duration::from_secs(30);
    for kind in ["writer", "permit"] {
        let (crashing, crash) = factory.crashable_client(with_ttl(short)).await;
        let waiting = factory.make(with_ttl(long)).await;
        let third = factory.make(with_ttl(long)).await;
        let lock = name("self_settled");
        let take = {
            let lock = lock.clone();
            move |client: Arc<dyn DistributedLock>, options: AcquireOptions| {
                let lock = lock.clone();
                async move {
                    if kind == "writer" {
                        let rw = RwLock::new(client, lock.as_str()).expect("rwlock");
                        rw.write_with(&options)
                            .await
                            .expect("write")
                            .map(|g| g.into_guard())
                    } else {
                        let sem = Semaphore::new(client, lock.as_str(), 1).expect("semaphore");
                        sem.acquire_with(&options)
                            .await
                            .expect("permit")
                            .map(|p| p.into_guard())
                    }
                }
            }
        };
        let first = take(crashing, try_once()).await.expect("free");
        let waiter = {
            let waiting: Arc<dyn DistributedLock> = waiting.clone();
            let take = take.clone();
            tokio::spawn(async move { take(waiting, within(Duration::from_secs(20))).await })
        };
        sleep(Duration::from_millis(300)).await;
        crash.crash().await;
        let second = waiter
            .await
            .expect("waiter")
            .expect("granted after the expiry");
        let granted_at = Instant::now();
        let mut conn = factory.raw_all().await.remove(0);
        let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock);
        let table = KeyLayout::new(DEFAULT_PREFIX).holders_key(&lock);
        for what in [&key, &table] {
            let left: i64 = redis::cmd("PTTL")
                .arg(what)
                .query_async(&mut conn)
                .await
                .unwrap();
            let promised = second
                .valid_until()
                .saturating_duration_since(Instant::now());
            assert!(
                u128::try_from(left).unwrap_or(0) + 50 >= promised.as_millis(),
                "{kind}: {what} keeps {left} ms, the guard promises {promised:?}"
            );
        }
        sleep(short + Duration::from_secs(1)).await;
        assert!(
            second.is_held(),
            "{kind}: still held {:?} on",
            granted_at.elapsed()
        );
        let intruder = take(third.clone() as Arc<dyn DistributedLock>, try_once()).await;
        assert!(
            intruder.is_none(),
            "{kind}: a second holder was granted while the first is held"
        );
        std::mem::forget(first);
        assert_eq!(
            second.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// FIFO: a writer queued behind a reader is not overtaken by readers that come after it;
/// it gets the lock once the first reader leaves, and they after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_are_not_starved() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let a = factory.make(with_ttl(Duration::from_secs(5))).await;
    let b = factory.make(with_ttl(Duration::from_secs(5))).await;
    let c = factory.make(with_ttl(Duration::from_secs(5))).await;
    let lock = name("rw_starve");
    let rw = |client: &Arc<lock_redis::RedisLock>| {
        RwLock::new(client.clone() as Arc<dyn DistributedLock>, lock.as_str()).expect("rwlock")
    };
    let reader = rw(&a)
        .read_with(&try_once())
        .await
        .expect("read")
        .expect("free");
    let writer_lock = rw(&b);
    let writer = tokio::spawn(async move {
        let guard = writer_lock
            .write_with(&within(Duration::from_secs(10)))
            .await;
        (guard, Instant::now())
    });
    // The writer is queued.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rw(&c)
        .occupancy()
        .await
        .expect("inspect")
        .waiters
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the writer queues");
        sleep(Duration::from_millis(20)).await;
    }
    assert!(
        rw(&c)
            .read_with(&try_once())
            .await
            .expect("late read")
            .is_none(),
        "a later reader does not overtake the queued writer"
    );
    let late_reader_lock = rw(&c);
    let late_reader = tokio::spawn(async move {
        let guard = late_reader_lock
            .read_with(&within(Duration::from_secs(10)))
            .await;
        (guard, Instant::now())
    });
    sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    reader.release().await.expect("release");
    let (writer, writer_at) = writer.await.expect("join");
    let writer = writer.expect("write").expect("granted");
    println!(
        "writer granted {:?} after the release",
        writer_at - released_at
    );
    assert!(
        writer_at - released_at < Duration::from_secs(1),
        "push hand-off"
    );
    sleep(Duration::from_millis(100)).await;
    assert!(
        !late_reader.is_finished(),
        "the late reader waits for the writer"
    );
    writer.release().await.expect("release");
    let (late, _) = late_reader.await.expect("join");
    late.expect("read")
        .expect("granted")
        .release()
        .await
        .expect("release");
}

/// A writer downgrades to a reader in its place: the readers queued behind it are
/// granted at once, the writer queued behind them still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_grants_readers_and_keeps_a_queued_writer_waiting() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let a = factory.make(with_ttl(Duration::from_secs(5))).await;
    let b = factory.make(with_ttl(Duration::from_secs(5))).await;
    let c = factory.make(with_ttl(Duration::from_secs(5))).await;
    let lock = name("rw_downgrade");
    let rw = |client: &Arc<lock_redis::RedisLock>| {
        RwLock::new(client.clone() as Arc<dyn DistributedLock>, lock.as_str()).expect("rwlock")
    };
    let writer = rw(&a)
        .write_with(&try_once())
        .await
        .expect("write")
        .expect("free");
    let token = writer.fencing_token();
    let reader_lock = rw(&b);
    let reader = tokio::spawn(async move {
        reader_lock
            .read_with(&within(Duration::from_secs(10)))
            .await
    });
    let inspect = rw(&a);
    let deadline = Instant::now() + Duration::from_secs(5);
    while inspect
        .occupancy()
        .await
        .expect("inspect")
        .waiters
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the reader queues");
        sleep(Duration::from_millis(20)).await;
    }
    let writer_lock = rw(&c);
    let second_writer = tokio::spawn(async move {
        writer_lock
            .write_with(&within(Duration::from_secs(10)))
            .await
    });
    while inspect.occupancy().await.expect("inspect").waiters.len() < 2 {
        assert!(Instant::now() < deadline, "the second writer queues");
        sleep(Duration::from_millis(20)).await;
    }
    let downgraded_at = Instant::now();
    let read = writer.downgrade().await.expect("downgrade");
    assert_eq!(read.fencing_token(), token, "the token stays");
    assert_eq!(read.state(), LockState::Held);
    let reader = timeout(Duration::from_secs(2), reader)
        .await
        .expect("the queued reader is granted by the downgrade")
        .expect("join")
        .expect("read")
        .expect("granted");
    println!(
        "reader granted {:?} after the downgrade",
        downgraded_at.elapsed()
    );
    let seen = inspect.occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2, "{seen:?}");
    assert!(seen
        .holders()
        .all(|h| h.kind == Some(lock_core::raw::backend::HoldKind::Read)));
    assert_eq!(seen.waiters.len(), 1, "the writer still waits");
    assert!(!second_writer.is_finished());
    read.release().await.expect("release");
    reader.release().await.expect("release");
    let second = second_writer
        .await
        .expect("join")
        .expect("write")
        .expect("granted");
    second.release().await.expect("release");
}

/// A force release breaks the oldest holder of a semaphore: its guard turns Lost
/// (`Broken`) and the next waiter gets the permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_breaks_the_oldest_permit() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let client = factory.make(with_ttl(Duration::from_secs(3))).await;
    let lock = name("sem_break");
    let sem = Semaphore::new(client.clone(), lock.as_str(), 2).expect("semaphore");
    let first = sem
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let second = sem
        .acquire_with(&try_once())
        .await
        .expect("b")
        .expect("free");
    let removed = client
        .force_release(&lock)
        .await
        .expect("break")
        .expect("held");
    assert_eq!(
        removed.owner_token.as_deref(),
        Some(first.owner_token().as_str())
    );
    let reason = timeout(Duration::from_secs(3), first.lost())
        .await
        .expect("lost");
    assert_eq!(reason, lock_core::LostReason::Broken);
    assert_eq!(second.state(), LockState::Held);
    let third = sem
        .acquire_with(&try_once())
        .await
        .expect("c")
        .expect("the broken permit is free");
    third.release().await.expect("release");
    second.release().await.expect("release");
}

/// RedLock refuses semaphores and read-write locks with a typed error (a majority is not
/// enough for a semaphore; see the README).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_shared_kinds() {
    let Some(factory) = RedisFactory::redlock(3).await else {
        return;
    };
    let client = factory.make(with_ttl(Duration::from_secs(3))).await;
    assert!(!client.capabilities().semaphore && !client.capabilities().rwlock);
    let err = Semaphore::new(client.clone(), "sem", 2).expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = RwLock::new(client.clone(), "rw").expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}

/// On Redis Cluster every key of a semaphore is in the lock key's slot: permits are
/// granted, refused and handed over there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_and_rwlock_on_a_cluster() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let a = factory.make(with_ttl(Duration::from_secs(3))).await;
    let b = factory.make(with_ttl(Duration::from_secs(3))).await;
    let lock = name("cluster_sem");
    let on_a = Semaphore::new(a.clone(), lock.as_str(), 2).expect("semaphore");
    let on_b = Semaphore::new(b.clone(), lock.as_str(), 2).expect("semaphore");
    let p1 = on_a
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let p2 = on_b
        .acquire_with(&try_once())
        .await
        .expect("b")
        .expect("free");
    let waiting =
        tokio::spawn(async move { on_b.acquire_with(&within(Duration::from_secs(10))).await });
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a third permit waits");
    sleep(Duration::from_secs(2)).await;
    assert_eq!(p2.state(), LockState::Held, "renewed on the cluster");
    p1.release().await.expect("release");
    let p3 = timeout(Duration::from_secs(2), waiting)
        .await
        .expect("handed over")
        .expect("join")
        .expect("acquire")
        .expect("granted");
    p2.release().await.expect("release");
    p3.release().await.expect("release");
    let rw = RwLock::new(a.clone(), name("cluster_rw").as_str()).expect("rwlock");
    let w = rw
        .write_with(&try_once())
        .await
        .expect("write")
        .expect("free");
    let r = w.downgrade().await.expect("downgrade");
    let r2 = rw
        .read_with(&try_once())
        .await
        .expect("read")
        .expect("readers share");
    r.release().await.expect("release");
    r2.release().await.expect("release");
    let _ = factory.label();
}
