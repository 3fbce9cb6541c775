//! `RedisFence`, the fenced resource on Redis, against real servers: the store checks of
//! `conformance::fence::store` on one server and on Redis Cluster, what the server holds,
//! and bad input.

use std::sync::Arc;
use std::time::Duration;

use conformance::fence::store::{concurrent_writers_keep_the_highest, stale_write_changes_nothing};
use harness::{or_skip, RedisServer};
use lock_core::fence::{FenceOutcome, FencedStore};
use lock_core::{ErrorKind, FencingToken};
use lock_redis::RedisFence;
use redis::AsyncCommands;
use testkit::redis::{raw, with_ttl, ClusterFactory};

fn key(test: &str) -> String {
    format!("fenced/{test}/{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_stale_writes_and_keeps_the_token_in_the_hash() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let key = key("stale");
    let store = RedisFence::connect(&server.url(), &key)
        .await
        .expect("store");
    stale_write_changes_nothing(&store).await;
    // The server's own record: the hash holds the newest token and its value.
    let mut conn = raw(server.addr()).await;
    let (token, value): (String, Vec<u8>) = redis::cmd("HMGET")
        .arg(&key)
        .arg("token")
        .arg("value")
        .query_async(&mut conn)
        .await
        .expect("HMGET");
    assert_eq!((token.as_str(), value), ("11", Vec::new()));
    // Tokens compare exactly over all of u64, where Lua's doubles would round.
    let top = store.resource(&format!("{key}/top")).expect("resource");
    assert!(top
        .write(FencingToken(u64::MAX), b"max")
        .await
        .expect("write")
        .is_written());
    let below = top
        .write(FencingToken(u64::MAX - 1), b"below")
        .await
        .expect("write");
    assert_eq!(
        below,
        FenceOutcome::Stale {
            newest: FencingToken(u64::MAX)
        }
    );
    let held: Vec<u8> = conn
        .hget(format!("{key}/top"), "value")
        .await
        .expect("HGET");
    assert_eq!(held, b"max");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_highest_token() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let store = RedisFence::connect(&server.url(), &key("concurrent"))
        .await
        .expect("store");
    concurrent_writers_keep_the_highest(Arc::new(store), 100).await;
}

/// On Redis Cluster a resource is one key on its slot's primary, hash tag or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_redis_cluster() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let config = factory.config(with_ttl(Duration::from_secs(5)));
    let store = RedisFence::open(config, &format!("{{{}}}", key("cluster")))
        .await
        .expect("store");
    stale_write_changes_nothing(&store).await;
    let other = store.resource(&key("cluster-untagged")).expect("resource");
    concurrent_writers_keep_the_highest(Arc::new(other), 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let empty = RedisFence::connect("redis://127.0.0.1:1", "")
        .await
        .expect_err("empty");
    assert_eq!(empty.kind(), ErrorKind::InvalidConfig);
    let redlock = RedisFence::connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "k")
        .await
        .expect_err("redlock");
    assert_eq!(redlock.kind(), ErrorKind::Unsupported);
    let bad = RedisFence::connect("redis://127.0.0.1:1?no_such_option=1", "k").await;
    assert_eq!(bad.expect_err("bad url").kind(), ErrorKind::InvalidConfig);
    let started = tokio::time::Instant::now();
    let closed = RedisFence::connect("redis://127.0.0.1:1?request_timeout=500ms", "k").await;
    assert_eq!(
        closed.expect_err("nobody listens").kind(),
        ErrorKind::Connection
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the request timeout"
    );
}
