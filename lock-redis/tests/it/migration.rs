//! What the dual (migration) lock needs of Redis, on one server (with and without the
//! queue) and on RedLock: a floor for the granted fencing token (`fence_at_least`), and an
//! inspection of who holds and who waits (`Backend::inspect`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use harness::proxy::{FaultProxy, ProxyMode};
use lock_core::raw::{
    backend::{AcquireRequest, Backend, HoldKind},
    driver::Connect,
};
use lock_core::{FencingToken, LockName, LockOptions, Occupancy, OwnerToken};
use lock_redis::{KeyLayout, RedisBackend, RedisHold, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use testkit::redis::{config_for, unique_name as name, with_ttl, RedisFactory};

const TTL: Duration = Duration::from_secs(10);

fn options() -> LockOptions {
    let mut options = with_ttl(TTL);
    options.request_timeout = Duration::from_secs(1);
    options
}

/// One deployment under test: its servers and a backend of them.
struct Setup {
    label: String,
    redlock: bool,
    queue: bool,
    factory: Arc<RedisFactory>,
    backend: Arc<RedisBackend>,
}

/// One server and RedLock over three, each with and without the queue; `None` when the
/// servers cannot start (outside strict mode).
async fn setups() -> Option<Vec<Setup>> {
    let single = Arc::new(RedisFactory::single().await?);
    let redlock = Arc::new(RedisFactory::redlock(3).await?);
    let mut setups = Vec::new();
    for (factory, redlock) in [(single, false), (redlock, true)] {
        for queue in [true, false] {
            let mut config = config_for(&factory.servers.addrs(), redlock, options());
            config.queue = queue;
            let backend = RedisBackend::open(config).await.expect("connect");
            setups.push(Setup {
                label: format!("redlock={redlock} queue={queue}"),
                redlock,
                queue,
                factory: Arc::clone(&factory),
                backend: Arc::new(backend),
            });
        }
    }
    Some(setups)
}

impl Setup {
    /// A try-acquire of `lock` by `token` with `floor`, which must be granted: its hold
    /// and fencing token.
    async fn take(
        &self,
        lock: &LockName,
        token: &OwnerToken,
        floor: Option<u64>,
    ) -> (RedisHold, u64) {
        let acquired = self
            .backend
            .acquire(AcquireRequest {
                name: lock,
                token,
                ttl: TTL,
                wait: false,
                fence_at_least: floor.map(FencingToken),
                kind: &HoldKind::Mutex,
            })
            .await
            .expect("acquire")
            .unwrap_or_else(|| panic!("{}: `{lock}` is free", self.label));
        (acquired.hold, acquired.fencing_token.get())
    }

    /// A grant of `lock` with `floor` to a new owner token, released: its fencing token.
    async fn grant(&self, lock: &LockName, floor: Option<u64>) -> u64 {
        let (hold, token) = self.take(lock, &OwnerToken::generate(), floor).await;
        self.backend.release(&hold).await.expect("release");
        token
    }

    /// The fencing counter of `lock` on each server.
    async fn counters(&self, lock: &LockName) -> Vec<Option<u64>> {
        let key = KeyLayout::new(DEFAULT_PREFIX).fence_key(lock);
        let mut counters = Vec::new();
        for mut conn in self.factory.raw_all().await {
            let counter: Option<u64> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("GET counter");
            counters.push(counter);
        }
        counters
    }

    /// Sets the fencing counter of `lock` on every server to `value`, then deletes it on
    /// server `missing`.
    async fn set_counters(&self, lock: &LockName, value: u64, missing: usize) {
        let key = KeyLayout::new(DEFAULT_PREFIX).fence_key(lock);
        for (i, mut conn) in self.factory.raw_all().await.into_iter().enumerate() {
            let mut cmd = redis::cmd(if i == missing { "DEL" } else { "SET" });
            cmd.arg(&key);
            if i != missing {
                cmd.arg(value);
            }
            let _: redis::Value = cmd.query_async(&mut conn).await.expect("counter");
        }
    }

    /// Token `token` is stored in the counter of `lock` on a majority of the servers.
    async fn assert_stored(&self, lock: &LockName, token: u64) {
        let counters = self.counters(lock).await;
        let stored = counters.iter().filter(|c| **c == Some(token)).count();
        assert!(
            stored > counters.len() / 2,
            "{}: token {token} is not the counter of a majority: {counters:?}",
            self.label
        );
    }

    async fn inspect(&self, lock: &LockName) -> Occupancy {
        self.backend.inspect(lock).await.expect("inspect")
    }
}

/// A floor above the counter is the token granted, and the counter is set to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_above_the_counter_is_the_token() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let lock = name("floor_above");
        let floor = setup.grant(&lock, None).await + 1000;
        assert_eq!(
            setup.grant(&lock, Some(floor)).await,
            floor,
            "{}",
            setup.label
        );
        setup.assert_stored(&lock, floor).await;
    }
}

/// A floor below the counter changes nothing: the token is the counter + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_below_the_counter_gives_the_counter_plus_one() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let lock = name("floor_below");
        let plain = setup.grant(&lock, None).await;
        assert_eq!(
            setup.grant(&lock, Some(5)).await,
            plain + 1,
            "{}",
            setup.label
        );
        setup.assert_stored(&lock, plain + 1).await;
    }
}

/// Where no counter exists, the token is the floor itself, never the server clock's
/// seed, and the counter is set to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_without_a_counter_is_the_token_itself() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let lock = name("floor_no_counter");
        assert_eq!(setup.grant(&lock, Some(42)).await, 42, "{}", setup.label);
        setup.assert_stored(&lock, 42).await;
    }
}

/// RedLock with one server's counter missing (each server in turn): the token is the
/// highest counter + 1 above a lower floor, the floor above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_one_counter_missing_honours_the_floor() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in setups.iter().filter(|s| s.redlock) {
        for missing in 0..3 {
            let lock = name("redlock_counter_missing");
            setup.set_counters(&lock, 1000, missing).await;
            let label = format!("{}, counter missing on server {missing}", setup.label);
            assert_eq!(setup.grant(&lock, Some(10)).await, 1001, "{label}");
            setup.assert_stored(&lock, 1001).await;
            setup.set_counters(&lock, 1000, missing).await;
            assert_eq!(setup.grant(&lock, Some(5000)).await, 5000, "{label}");
            setup.assert_stored(&lock, 5000).await;
        }
    }
}

/// Grants without a floor after one with a floor keep increasing, and so does a floored
/// grant after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_grants_after_a_floored_one_keep_increasing() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let lock = name("plain_after_floored");
        let mut tokens = vec![setup.grant(&lock, Some(42)).await];
        tokens.push(setup.grant(&lock, None).await);
        tokens.push(setup.grant(&lock, None).await);
        tokens.push(setup.grant(&lock, Some(50)).await);
        assert_eq!(tokens[0], 42, "{}", setup.label);
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{}: tokens {tokens:?} do not increase",
            setup.label
        );
    }
}

/// An acquire sent again by the same owner token (its reply was lost) is granted again.
/// Where one server decides, with the token the first request took, with or without a
/// floor (a second token, floor + 1, would put a dual lock's new side above its old side:
/// see [`a_handed_waiter_takes_the_token_it_was_handed`]); a higher floor is still the
/// token. RedLock takes the next token: its re-sent request of round 1 reads the counters
/// before its round's write-back (and each round has an owner token of its own), so
/// within an acquisition it never finds its own token; here a second acquire with the
/// same owner token comes after the write-back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_token_acquires_again_with_a_floor() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let label = &setup.label;
        let lock = name("same_token_again");
        let token = OwnerToken::generate();
        let (_, first) = setup.take(&lock, &token, Some(42)).await;
        let (_, again) = setup.take(&lock, &token, Some(42)).await;
        let (_, plain) = setup.take(&lock, &token, None).await;
        let (hold, higher) = setup.take(&lock, &token, Some(50)).await;
        if setup.redlock {
            assert_eq!((first, again), (42, 43), "{label}");
            assert!(plain > again, "{label}: {plain} after {again}");
            assert!(higher > plain, "{label}: {higher} after {plain}");
        } else {
            assert_eq!((first, again, plain, higher), (42, 42, 42, 50), "{label}");
        }
        setup.backend.release(&hold).await.expect("release");
        let next = setup.grant(&lock, Some(42)).await;
        assert!(next > higher, "{label}: {next} after {higher}");
    }
}

/// A waiter handed the lock by a release (`grant_head` in `queue.lua`, the waiter's floor
/// as the token) whose next round runs before it takes the grant finds the key its own:
/// that round gets the token it was handed, not a second one. A second token (floor + 1)
/// puts every later dual token one above its old-side token, and an old-only client can
/// then get a token a dual holder already used. A higher floor is still honoured. Where
/// one server decides (RedLock's waiters take no grants); on Redis Cluster in
/// `cluster.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_waiter_takes_the_token_it_was_handed() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in setups.iter().filter(|s| s.queue && !s.redlock) {
        let lock = name("handed_waiter");
        let conn = setup.factory.raw_all().await.remove(0);
        handed_waiter_keeps_its_token(&setup.backend, conn, &lock, &setup.label).await;
    }
}

/// [`a_handed_waiter_takes_the_token_it_was_handed`] with `backend` (the queue on, one
/// server deciding) on `lock`, free, whose server `conn` reaches.
pub(crate) async fn handed_waiter_keeps_its_token(
    backend: &RedisBackend,
    mut conn: MultiplexedConnection,
    lock: &LockName,
    label: &str,
) {
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let take = |token: OwnerToken, floor: u64| async move {
        let acquired = backend
            .acquire(AcquireRequest {
                name: lock,
                token: &token,
                ttl: TTL,
                wait: false,
                fence_at_least: Some(FencingToken(floor)),
                kind: &HoldKind::Mutex,
            })
            .await
            .expect("acquire")
            .unwrap_or_else(|| panic!("{label}: `{lock}` is free"));
        (acquired.hold, acquired.fencing_token.get())
    };
    let (holder, fence) = take(OwnerToken::generate(), 581).await;
    assert_eq!(fence, 581, "{label}");
    // The waiter's round 0 queued, asking for grants with its floor 582 (as `acquire_q.lua`
    // stores it); its client is not listening.
    let waiter = OwnerToken::generate();
    let id = format!("absentclient/{waiter}");
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(keys.queue_key(lock))
        .arg(1)
        .arg(&id)
        .ignore()
        .cmd("ZADD")
        .arg(keys.queue_live_key(lock))
        .arg(secs * 1000 + micros / 1000 + 60_000)
        .arg(&id)
        .ignore()
        .cmd("HSET")
        .arg(keys.queue_grant_key(lock))
        .arg(&id)
        .arg("0:10000:582")
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("queue the waiter");
    backend.release(&holder).await.expect("release");
    let (owner, counter): (Option<String>, Option<u64>) = redis::pipe()
        .cmd("GET")
        .arg(keys.lock_key(lock))
        .cmd("GET")
        .arg(keys.fence_key(lock))
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(owner, Some(waiter.to_string()), "{label}: handed");
    assert_eq!(counter, Some(582), "{label}: the handed token");
    // Its next round, before it took the grant.
    let (_, next) = take(waiter.clone(), 582).await;
    assert_eq!(next, 582, "{label}: the handed token");
    let (hold, higher) = take(waiter, 600).await;
    assert_eq!(higher, 600, "{label}: a higher floor");
    backend.release(&hold).await.expect("release");
    // The next holder's token is above both.
    let (hold, after) = take(OwnerToken::generate(), 582).await;
    assert_eq!(after, 601, "{label}");
    backend.release(&hold).await.expect("release");
}

/// Polls `lock` until it shows `waiters` waiters (bounded).
async fn until_waiters(setup: &Setup, lock: &LockName, waiters: usize) -> Occupancy {
    for _ in 0..1000 {
        let seen = setup.inspect(lock).await;
        if seen.waiters.len() >= waiters {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{}: `{lock}` never showed {waiters} waiters", setup.label);
}

/// The holder and two queued waiters are seen, the waiters in arrival order, each with
/// its owner token; the token floor is the fencing counter (the holder's token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_holder_and_the_queue_in_order() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in setups.iter().filter(|s| s.queue) {
        let lock = name("inspect_queue");
        let (hold, fence) = setup.take(&lock, &OwnerToken::generate(), None).await;
        let mut waiters = Vec::new();
        let mut tasks = Vec::new();
        for i in 1..=2 {
            let token = OwnerToken::generate();
            waiters.push(Some(token.to_string()));
            let (backend, wanted) = (Arc::clone(&setup.backend), lock.clone());
            tasks.push(tokio::spawn(async move {
                let request = AcquireRequest {
                    name: &wanted,
                    token: &token,
                    ttl: TTL,
                    wait: true,
                    fence_at_least: None,
                    kind: &HoldKind::Mutex,
                };
                backend.acquire(request).await.map(|a| a.is_some())
            }));
            until_waiters(setup, &lock, i).await;
        }
        // Behind them, a waiter whose liveness deadline has passed: not listed.
        let keys = KeyLayout::new(DEFAULT_PREFIX);
        for mut conn in setup.factory.raw_all().await {
            let _: () = redis::pipe()
                .cmd("ZADD")
                .arg(keys.queue_key(&lock))
                .arg(1_000_000)
                .arg("ghost/dead")
                .ignore()
                .cmd("ZADD")
                .arg(keys.queue_live_key(&lock))
                .arg(1)
                .arg("ghost/dead")
                .ignore()
                .query_async(&mut conn)
                .await
                .expect("enqueue a dead waiter");
        }
        let seen = setup.inspect(&lock).await;
        let holder = seen.holder.clone().expect("held");
        assert_eq!(holder.owner_token.as_deref(), Some(hold.token().as_str()));
        assert!(
            holder.lease_left.is_some_and(|left| left <= TTL),
            "{}: {holder:?}",
            setup.label
        );
        let tokens: Vec<_> = seen.waiters.iter().map(|w| w.owner_token.clone()).collect();
        assert_eq!(tokens, waiters, "{}", setup.label);
        assert_eq!(
            holder.session, None,
            "{}: a key keeps no client id",
            setup.label
        );
        assert!(
            seen.waiters.iter().all(|w| w.session.is_some()),
            "{}: a waiter id starts with its client id: {seen:?}",
            setup.label
        );
        let highest = setup.counters(&lock).await.into_iter().flatten().max();
        assert_eq!(
            seen.token_floor,
            highest.map(FencingToken),
            "{}",
            setup.label
        );
        assert_eq!(
            seen.token_floor,
            Some(FencingToken(fence)),
            "{}",
            setup.label
        );
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        setup.backend.release(&hold).await.expect("release");
    }
}

/// A plain `SET key value NX PX` holder is seen with its value and lease; a name nobody
/// took shows nothing; once released, no holder and the counter as the token floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_plain_holder_and_a_free_name() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let lock = name("inspect_plain");
        assert_eq!(
            setup.inspect(&lock).await,
            Occupancy::default(),
            "{}",
            setup.label
        );
        let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock);
        for mut conn in setup.factory.raw_all().await {
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("plain-client")
                .arg("NX")
                .arg("PX")
                .arg(60_000)
                .query_async(&mut conn)
                .await
                .expect("SET NX PX");
            assert_eq!(set.as_deref(), Some("OK"));
        }
        let seen = setup.inspect(&lock).await;
        let holder = seen.holder.expect("the plain holder");
        assert_eq!(holder.owner_token.as_deref(), Some("plain-client"));
        assert!(holder
            .lease_left
            .is_some_and(|left| left > TTL && left <= Duration::from_secs(60)));
        assert!(
            seen.waiters.is_empty() && seen.token_floor.is_none(),
            "{}",
            setup.label
        );
        setup.factory.delete_everywhere(&key).await;
        let token = setup.grant(&lock, None).await;
        let seen = setup.inspect(&lock).await;
        assert_eq!(
            seen,
            Occupancy::default().token_floor(Some(FencingToken(token))),
            "{}",
            setup.label
        );
    }
}

/// RedLock inspection needs a majority of the servers to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_redlock_needs_a_majority() {
    let Some(factory) = RedisFactory::redlock(3).await else {
        return;
    };
    let mut proxies = Vec::new();
    for addr in factory.servers.addrs() {
        proxies.push(FaultProxy::start(addr).await.expect("proxy"));
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    let backend = RedisBackend::open(config_for(&addrs, true, options()))
        .await
        .expect("connect");
    let lock = name("inspect_majority");
    proxies[0].set_mode(ProxyMode::Blackhole);
    backend.inspect(&lock).await.expect("two of three answer");
    proxies[1].set_mode(ProxyMode::Blackhole);
    let err = backend
        .inspect(&lock)
        .await
        .expect_err("one of three answers");
    assert_eq!(err.kind(), lock_core::ErrorKind::Unavailable, "{err}");
}
