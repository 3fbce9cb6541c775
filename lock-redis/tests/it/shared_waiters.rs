//! Queued waiters of the shared kinds (permits, readers, writers) that leave the queue
//! without being granted: evicted after a crash, or refused when the name changed kind.

use std::time::Duration;

use crate::primitives::{try_once, within};
use conformance::Factory;
use lock_core::Semaphore;
use lock_redis::{KeyLayout, DEFAULT_PREFIX};
use testkit::redis::{unique_name as name, with_ttl, RedisFactory};
use tokio::time::{sleep, timeout, Instant};

/// A waiter that crashed while queued (cut off, never showing up again) is evicted once
/// its stay is over, and takes its kind's entry in the holders' table with it, while the
/// name stays busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_waiter_leaves_nothing_in_the_table() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(10));
    options.recheck = Duration::from_millis(100);
    options.request_timeout = Duration::from_millis(500);
    let holder = factory.make(options.clone()).await;
    let (crashing, crash) = factory.crashable_client(options.clone()).await;
    let lock = name("sem_evicted_waiter");
    let sem = Semaphore::new(holder, lock.as_str(), 1).expect("semaphore");
    let held = sem
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let on_crashing = Semaphore::new(crashing, lock.as_str(), 1).expect("semaphore");
    let waiting = tokio::spawn(async move {
        on_crashing
            .acquire_with(&within(Duration::from_secs(30)))
            .await
    });
    let mut conn = factory.raw_all().await.remove(0);
    testkit::redis::until_queued(&mut conn, &lock, 1).await;
    crash.crash().await;
    // Its stay: two rechecks and a request timeout.
    sleep(Duration::from_millis(1200)).await;
    assert!(
        sem.acquire_with(&try_once()).await.expect("try").is_none(),
        "still held"
    );
    assert!(
        testkit::redis::queue_of(&mut conn, &lock).await.is_empty(),
        "the waiter was evicted"
    );
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(KeyLayout::new(DEFAULT_PREFIX).holders_key(&lock))
        .query_async(&mut conn)
        .await
        .expect("HKEYS");
    let left: Vec<&String> = fields.iter().filter(|f| f.starts_with("q:")).collect();
    assert!(
        left.is_empty(),
        "evicted waiters left in the holders' table: {left:?}"
    );
    waiting.abort();
    held.release().await.expect("release");
}

/// A permit waiter whose name became a mutex while it was queued (its holder stolen, a
/// client without the queue took the name) fails with a conflict and leaves the queue at
/// once, not after its stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_takes_a_queued_waiter_out_of_the_queue() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(10));
    options.recheck = Duration::from_secs(2);
    let lock = name("sem_conflict");
    let holder = factory.make(options.clone()).await;
    let sem = Semaphore::new(holder, lock.as_str(), 1).expect("semaphore");
    let held = sem
        .acquire_with(&try_once())
        .await
        .expect("a")
        .expect("free");
    let waiter = factory.make(options.clone()).await;
    let on_waiter = Semaphore::new(waiter, lock.as_str(), 1).expect("semaphore");
    let waiting = tokio::spawn(async move {
        on_waiter
            .acquire_with(&within(Duration::from_secs(30)))
            .await
            .map(|guard| guard.is_some())
    });
    let mut conn = factory.raw_all().await.remove(0);
    testkit::redis::until_queued(&mut conn, &lock, 1).await;
    // The steal and a mutex's grant in one step, as a client without the queue takes a
    // name the moment it is free: were they two, the waiter at the head could take the
    // freed name first.
    let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock);
    let (): () = redis::pipe()
        .atomic()
        .del(&key)
        .ignore()
        .cmd("SET")
        .arg(&key)
        .arg("a-mutex-without-the-queue")
        .arg("PX")
        .arg(30_000)
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("steal and take");
    let refused = timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter's next round ends it")
        .expect("waiter task");
    assert!(refused.is_err(), "a mutex holds the name: {refused:?}");
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let queue = testkit::redis::queue_of(&mut conn, &lock).await;
        if queue.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the refused waiter is still queued: {queue:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let (): () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let _ = held.release().await;
}
