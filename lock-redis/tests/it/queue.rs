//! The waiter queue on one server, seen from behind the library: a dead head is passed
//! over within the hand-off window, a waiter that gives up leaves at once, dead entries
//! never block, a waiter dropped from the queue behind its back queues again, a closed
//! client's waiter leaves before `close()` returns, and clients with and without the
//! queue exclude each other on the plain lock key.

use std::sync::Arc;
use std::time::Duration;

use conformance::fence::FencedResource;
use conformance::Factory;
use lock_core::{DistributedLock, DistributedLockExt, Error, LockGuard, LockName, LockOptions};
use lock_redis::{KeyLayout, RedisLock, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use testkit::redis::{config_for, queue_of, raw, unique_name as name, until_queued, RedisFactory};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// Options whose recheck (2 s) is well above the hand-off window (500 ms), so that a wait
/// ended by the window is told apart from one ended by the recheck.
fn options() -> LockOptions {
    let mut options = testkit::redis::with_ttl(Duration::from_secs(10));
    options.recheck = Duration::from_secs(2);
    options
}

async fn client(factory: &RedisFactory, queue: bool) -> Arc<RedisLock> {
    client_with(factory, queue, options()).await
}

async fn client_with(factory: &RedisFactory, queue: bool, options: LockOptions) -> Arc<RedisLock> {
    let mut config = config_for(&factory.servers.addrs(), false, options);
    config.queue = queue;
    Arc::new(RedisLock::connect(config).await.expect("connect"))
}

/// The server clock in milliseconds.
async fn server_ms(conn: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

/// Puts a waiter that will never show up at the tail of `name`'s queue, alive for `for_ms`.
async fn enqueue_ghost(conn: &mut MultiplexedConnection, name: &LockName, id: &str, for_ms: u64) {
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let last: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.queue_key(name))
        .arg(-1)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .expect("ZRANGE");
    let ticket = last.first().map_or(1.0, |(_, t)| t + 1.0);
    let deadline = server_ms(conn).await + for_ms;
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(keys.queue_key(name))
        .arg(ticket)
        .arg(id)
        .ignore()
        .cmd("ZADD")
        .arg(keys.queue_live_key(name))
        .arg(deadline)
        .arg(id)
        .ignore()
        .query_async(conn)
        .await
        .expect("enqueue");
}

/// A head of the queue that crashed (its entry alive for another minute) stalls the
/// waiter behind it for one hand-off window after the release, not until its entry
/// expires nor until the next recheck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_is_passed_over_within_the_window() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("dead_head");
    let (guard, waiting) = held_with_a_ghost_ahead(&factory, &mut conn, &lock, None).await;
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let (next, after) = taken_since(released_at, waiting).await;
    println!("takeover {after:?} after the release (window 500 ms, recheck 2 s)");
    assert!(
        after >= Duration::from_millis(450),
        "the woken head keeps its window: {after:?}"
    );
    assert!(
        after < Duration::from_millis(1900),
        "the stand-by waiter takes over after the window, before its recheck: {after:?}"
    );
    assert!(
        queue_of(&mut conn, &lock).await.is_empty(),
        "the dead head was dropped"
    );
    next.release().await.expect("release");
}

/// A head that asked for grants and died is handed the lock by the release, which costs
/// the waiter behind it the grant's short lease and a recheck at most, never the TTL.
#[tokio::test]
async fn a_granted_head_that_died_costs_its_grant_lease_not_the_ttl() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("dead_granted_head");
    let (guard, waiting) =
        held_with_a_ghost_ahead(&factory, &mut conn, &lock, Some("1:800:")).await;
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let holder_now: Option<String> = redis::cmd("GET")
        .arg(KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock))
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(
        holder_now.as_deref(),
        Some("token"),
        "the release granted the head"
    );
    let (next, after) = taken_since(released_at, waiting).await;
    println!("takeover {after:?} after the release (grant lease 800 ms, recheck 2 s, TTL 10 s)");
    assert!(
        after >= Duration::from_millis(750),
        "the granted head keeps its lease: {after:?}"
    );
    assert!(
        after < Duration::from_millis(800 + 2_000 + 500),
        "the next waiter takes over within the grant lease and a recheck: {after:?}"
    );
    next.release().await.expect("release");
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!(
            "{}*",
            KeyLayout::new(DEFAULT_PREFIX).queue_key(&lock)
        ))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(left.is_empty(), "queue keys left: {left:?}");
}

/// Takes `lock`, queues a crashed waiter (asking for grants as `grant` says, a stored
/// `<round>:<lease ms>:<floor>`) and a live waiter behind it: the holder's guard and the
/// live waiter's task, once it is queued.
async fn held_with_a_ghost_ahead(
    factory: &RedisFactory,
    conn: &mut MultiplexedConnection,
    lock: &LockName,
    grant: Option<&str>,
) -> (LockGuard, JoinHandle<LockGuard>) {
    let holder = client(factory, true).await;
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    enqueue_ghost(conn, lock, "crashedclient/token", GHOST_LIFE).await;
    if let Some(grant) = grant {
        let _: () = redis::cmd("HSET")
            .arg(KeyLayout::new(DEFAULT_PREFIX).queue_grant_key(lock))
            .arg("crashedclient/token")
            .arg(grant)
            .query_async(conn)
            .await
            .expect("HSET");
    }
    let waiter = client(factory, true).await;
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { waiter.lock(lock.as_str()).await.expect("waiter acquires") }
    });
    until_queued(conn, lock, 2).await;
    (guard, waiting)
}

/// Waits (at most 10 s) for `waiting` to take the lock released at `released_at`: its
/// guard, and how long after the release it came.
async fn taken_since(
    released_at: Instant,
    waiting: JoinHandle<LockGuard>,
) -> (LockGuard, Duration) {
    let next = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter behind a dead head gets the lock")
        .expect("waiter task");
    (next, released_at.elapsed())
}

/// How long a crashed waiter's entry stays in the queue in the tests below: far longer
/// than any wait they allow.
const GHOST_LIFE: u64 = 60_000;

/// Queues two crashed waiters (a head and the stand-by behind it, alive for
/// [`GHOST_LIFE`]) and then a live waiter behind them; returns the live waiter's task,
/// once it is queued.
async fn behind_two_ghosts(
    factory: &RedisFactory,
    conn: &mut MultiplexedConnection,
    lock: &LockName,
) -> JoinHandle<LockGuard> {
    let queued = queue_of(conn, lock).await.len();
    enqueue_ghost(conn, lock, "crashedhead/token", GHOST_LIFE).await;
    enqueue_ghost(conn, lock, "crashedstandby/token", GHOST_LIFE).await;
    let waiter = client(factory, true).await;
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { waiter.lock(lock.as_str()).await.expect("waiter acquires") }
    });
    until_queued(conn, lock, queued + 3).await;
    waiting
}

/// Checks that the live waiter of [`behind_two_ghosts`] is granted within `bound` of
/// `since` (`what`), and that the dead entries ahead of it are gone; then releases.
async fn granted_past_the_ghosts(
    conn: &mut MultiplexedConnection,
    lock: &LockName,
    waiting: JoinHandle<LockGuard>,
    since: Instant,
    bound: Duration,
    what: &str,
) {
    let next = timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| panic!("the live waiter is not granted within 10 s {what}"))
        .expect("waiter task");
    let after = since.elapsed();
    println!("granted {after:?} {what}");
    assert!(
        after < bound,
        "granted {after:?} {what}, not within {bound:?}"
    );
    assert!(
        queue_of(conn, lock).await.is_empty(),
        "the dead entries were dropped"
    );
    next.release().await.expect("release");
}

/// A holder that crashed (its key expires by itself, nobody releases it) with a crashed
/// head and a crashed stand-by queued behind it: the live waiter behind them gets the
/// lock within its recheck (when it finds the key free and wakes the head itself) and a
/// hand-off window per dead entry, not when the dead entries expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_head_and_standby_stall_no_longer_than_a_recheck() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("crashed_holder");
    let expiry = Duration::from_millis(300);
    let _: () = redis::cmd("SET")
        .arg(KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock))
        .arg("crashedholder")
        .arg("PX")
        .arg(u64::try_from(expiry.as_millis()).expect("ms"))
        .query_async(&mut conn)
        .await
        .expect("SET");
    let started = Instant::now();
    let waiting = behind_two_ghosts(&factory, &mut conn, &lock).await;
    // A recheck (by then the key is gone), then a window for each dead entry.
    let (recheck, window) = (options().recheck, options().recheck / 4);
    let bound = recheck + window * 2 + Duration::from_millis(700);
    let what = format!("after queueing behind a holder whose key expires in {expiry:?}");
    granted_past_the_ghosts(&mut conn, &lock, waiting, started, bound, &what).await;
}

/// A release wakes a head that crashed, whose stand-by crashed too: the live waiter
/// behind them gets the lock within its recheck and a hand-off window after the release,
/// not when the dead entries expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_and_dead_standby_stall_no_longer_than_a_recheck() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("dead_standby");
    let holder = client(&factory, true).await;
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let waiting = behind_two_ghosts(&factory, &mut conn, &lock).await;
    let released_at = Instant::now();
    guard.release().await.expect("release");
    // The release woke the dead head: at its recheck the waiter finds the head's window
    // over and wakes the dead stand-by, then a window.
    let (recheck, window) = (options().recheck, options().recheck / 4);
    let bound = recheck + window + Duration::from_millis(700);
    granted_past_the_ghosts(
        &mut conn,
        &lock,
        waiting,
        released_at,
        bound,
        "after the release",
    )
    .await;
}

/// A waiter that gives up (its acquire times out or is dropped) leaves the queue at once:
/// the waiter behind it is woken by the next release directly, not after a hand-off window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_head_leaves_at_once() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("cancelled_head");
    let holder = client(&factory, true).await;
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let first = client(&factory, true).await;
    let giving_up = tokio::spawn({
        let lock = lock.clone();
        async move {
            first
                .lock_timeout(lock.as_str(), Duration::from_millis(700))
                .await
        }
    });
    until_queued(&mut conn, &lock, 1).await;
    let second = client(&factory, true).await;
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { second.lock(lock.as_str()).await.expect("second acquires") }
    });
    until_queued(&mut conn, &lock, 2).await;
    let gave_up = giving_up.await.expect("first task");
    assert!(gave_up.is_err(), "the first waiter times out: {gave_up:?}");
    until_queued(&mut conn, &lock, 1).await;
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let next = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second waiter gets the lock")
        .expect("waiter task");
    let after = released_at.elapsed();
    println!("takeover {after:?} after the release (window 500 ms)");
    assert!(
        after < Duration::from_millis(400),
        "woken by the release itself, not after the window: {after:?}"
    );
    next.release().await.expect("release");
    let left = factory.leftovers(&[lock]).await;
    assert!(left.is_empty(), "{left:?}");
}

/// Entries whose deadline passed are dropped by the next script that looks: a queue of
/// dead waiters does not keep a try from a free lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_entries_never_block() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("expired");
    for i in 0..5 {
        enqueue_ghost(&mut conn, &lock, &format!("gone{i}/token"), 1).await;
    }
    sleep(Duration::from_millis(20)).await;
    let client = client(&factory, true).await;
    let guard = client
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("a queue of dead waiters does not hold the lock");
    assert!(queue_of(&mut conn, &lock).await.is_empty());
    guard.release().await.expect("release");
    let left = factory.leftovers(&[lock]).await;
    assert!(left.is_empty(), "{left:?}");
}

/// A live waiter whose entry was dropped behind its back (evicted while it was away)
/// queues again when it next shows up, and gets the lock: it never waits forever for a
/// wake-up that nobody will send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_from_the_queue_queues_again() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("dropped");
    let holder = client(&factory, true).await;
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let waiter = client(&factory, true).await;
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { waiter.lock(lock.as_str()).await.expect("waiter acquires") }
    });
    until_queued(&mut conn, &lock, 1).await;
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let _: () = redis::cmd("DEL")
        .arg(keys.queue_key(&lock))
        .arg(keys.queue_live_key(&lock))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    guard.release().await.expect("release");
    let next = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the dropped waiter still gets the lock")
        .expect("waiter task");
    next.release().await.expect("release");
}

/// Closing a client ends its waiting acquire with an error and takes its waiter out of
/// the queue before `close()` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_a_waiting_acquire_and_its_entry() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("closed_waiter");
    let holder = client(&factory, true).await;
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let waiter = client(&factory, true).await;
    let waiting = tokio::spawn({
        let (waiter, lock) = (Arc::clone(&waiter), lock.clone());
        async move { waiter.lock(lock.as_str()).await.map(drop) }
    });
    until_queued(&mut conn, &lock, 1).await;
    waiter.close().await.expect("close");
    let left = queue_of(&mut conn, &lock).await;
    let ended = timeout(Duration::from_millis(200), waiting).await;
    assert!(left.is_empty(), "queued after close(): {left:?}");
    let ended = ended.expect("the acquire ends with close()").expect("task");
    assert!(matches!(ended, Err(Error::Closed { .. })), "{ended:?}");
    guard.release().await.expect("release");
}

/// Clients with and without the queue on one name exclude each other (the plain key
/// decides), and all of them get their turns. (A release of one kind does not wake the
/// waiters of the other, which notice it at their next recheck: 100 ms here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_and_without_the_queue_exclude_each_other() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let lock = name("mixed");
    let resource = FencedResource::new();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let mut options = options();
        options.recheck = Duration::from_millis(100);
        let client = client_with(&factory, i % 2 == 0, options).await;
        let (lock, resource) = (lock.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let guard = client
                    .lock_timeout(lock.as_str(), Duration::from_secs(20))
                    .await
                    .expect("acquire");
                resource
                    .hold_section(&guard, sleep(Duration::from_millis(1)))
                    .await
                    .expect("fresh token");
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        timeout(Duration::from_secs(120), task)
            .await
            .expect("every client finishes")
            .expect("client task");
    }
    let report = resource.check();
    assert!(report.overlaps.is_empty(), "{report:?}");
    assert!(report.tokens_backwards.is_empty(), "{report:?}");
    assert_eq!(report.accepted_writes, 150);
    let left = factory.leftovers(&[lock]).await;
    assert!(left.is_empty(), "{left:?}");
}

/// The queue's entries and liveness deadlines (ms after the server's `now`), the lock's
/// owner and PTTL: what a stalled queue looks like.
async fn queue_state(conn: &mut MultiplexedConnection, name: &LockName) -> String {
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let now = i64::try_from(server_ms(conn).await).expect("server time in ms");
    let queue: Vec<String> = queue_of(conn, name).await;
    let live: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(keys.queue_live_key(name))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .expect("ZRANGE");
    let (owner, pttl): (Option<String>, i64) = redis::pipe()
        .cmd("GET")
        .arg(keys.lock_key(name))
        .cmd("PTTL")
        .arg(keys.lock_key(name))
        .query_async(conn)
        .await
        .expect("GET, PTTL");
    // "<client>/<token>", shortened to their first four characters each.
    let short = |id: &str| {
        id.split('/')
            .map(|part| part.get(..4).unwrap_or(part))
            .collect::<Vec<_>>()
            .join("/")
    };
    let queue: Vec<String> = queue.iter().map(|id| short(id)).collect();
    let live: Vec<String> = live
        .iter()
        .map(|(id, at)| format!("{} {:+}ms", short(id), at - now))
        .collect();
    let owner = owner.map(|token| short(&token));
    format!("queue {queue:?} live {live:?} owner {owner:?} pttl {pttl}")
}

/// Waiters blocked in `lock()` while the server is stopped for longer than the holder's
/// TTL take the lock once it continues, the first within a second (the longest pause of a
/// waiter between failed attempts, and at least the TTL: the holder's renewal sent during
/// the stop may run then) plus a hand-off window and 500 ms, the others in turn. The
/// attempts that timed out during the stop leave queue entries ahead of them, renewed by
/// their requests that run after the continue: their cleanups remove them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_take_over_after_a_stopped_server_continues() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let stop = ttl * 2;
    let mut options = testkit::redis::with_ttl(ttl);
    options.request_timeout = Duration::from_millis(500);
    let window = options.recheck / 4;
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let lock = name("stopped_server");
    let holder = client_with(&factory, true, options.clone()).await;
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let section = Duration::from_millis(100);
    let mut waiters = Vec::new();
    for i in 0..3 {
        let client = client_with(&factory, true, options.clone()).await;
        let name = lock.clone();
        waiters.push(tokio::spawn(async move {
            let next = client
                .lock_timeout(name.as_str(), Duration::from_secs(12))
                .await;
            let at = Instant::now();
            let next = next.unwrap_or_else(|err| panic!("waiter {i}: {err}"));
            sleep(section).await;
            next.release().await.expect("release");
            at
        }));
        until_queued(&mut conn, &lock, i + 1).await;
    }
    let server = factory.servers.member(0);
    server.pause().expect("pause");
    sleep(stop).await;
    server.resume().expect("resume");
    let resumed = Instant::now();
    let mut seen = Vec::new();
    while !waiters.iter().all(|w| w.is_finished()) && resumed.elapsed() < Duration::from_secs(8) {
        seen.push(format!(
            "+{:?}: {}",
            resumed.elapsed(),
            queue_state(&mut conn, &lock).await
        ));
        sleep(Duration::from_millis(100)).await;
    }
    let mut grants = Vec::new();
    for waiter in waiters {
        let at = timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter is granted")
            .expect("waiter task");
        grants.push(at.saturating_duration_since(resumed));
    }
    grants.sort();
    println!("grants after the continue: {grants:?}\n{}", seen.join("\n"));
    // The longest pause of lock-core between the failed attempts of a waiting acquire.
    let longest_retry_pause = Duration::from_secs(1);
    let bound = ttl.max(longest_retry_pause) + window + Duration::from_millis(500);
    assert!(
        grants[0] < bound,
        "the first waiter is granted {:?} after the continue, not within {bound:?}:\n{}",
        grants[0],
        seen.join("\n")
    );
    let turns = (section + window) * 3;
    assert!(
        grants[2] < bound + turns,
        "the last waiter is granted {:?} after the continue, not within {:?}",
        grants[2],
        bound + turns
    );
    let _ = guard.release().await;
}
