//! What the dual (migration) lock needs of Redis, on one server (with and without the
//! queue) and on RedLock: a floor for the granted fencing token (`fence_at_least`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config_for, unique_name as name, with_ttl, RedisFactory};
use lock_core::raw::{AcquireRequest, Backend, Connect};
use lock_core::{FencingToken, LockName, LockOptions, OwnerToken};
use lock_redis::{KeyLayout, RedisBackend, RedisHold, DEFAULT_PREFIX};

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

/// An acquire sent again by the same owner token (its reply was lost) is granted again,
/// with a higher token, with or without a floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_token_acquires_again_with_a_floor() {
    let Some(setups) = setups().await else {
        return;
    };
    for setup in &setups {
        let lock = name("same_token_again");
        let token = OwnerToken::generate();
        let (_, first) = setup.take(&lock, &token, Some(42)).await;
        let (_, again) = setup.take(&lock, &token, Some(42)).await;
        let (hold, plain) = setup.take(&lock, &token, None).await;
        assert_eq!((first, again), (42, 43), "{}", setup.label);
        assert!(plain > again, "{}: {plain} after {again}", setup.label);
        setup.backend.release(&hold).await.expect("release");
    }
}
