//! The `fenced_write` example opens a second client of its own on `LOCK_URL` with a short
//! TTL and manual renewal: whatever the URL already says (a query of its own, a dual lock's
//! two sides), the store must refuse the stalled writer's old token and keep the new write.
//!
//! Without Redis the test on it prints a loud notice and passes, unless
//! `LOCK_TEST_STRICT=1`, where it fails.

use harness::{or_skip, RedisServer};

use crate::run::{example, stdout, text};

/// Runs the example on `url` and checks the fenced store kept the newer write.
async fn fences(url: &str) {
    let output = example(env!("CARGO_BIN_EXE_fenced_write"), url).await;
    let printed = stdout(&output);
    for line in [
        "fast write: Written",
        "slow write: Stale { newest: FencingToken(",
        "store holds: \"new profile\"",
    ] {
        assert!(printed.contains(line), "{url}: {line}\n{}", text(&output));
    }
}

/// A URL without a query, the example's first case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_url() {
    fences("memory://fenced").await;
}

/// A URL with a query of its own (`?ttl=5s`): its options stay, the example's replace
/// the ones it sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_with_a_query() {
    fences("memory://fenced?ttl=5s&request_timeout=3s").await;
}

/// A dual lock's URL: both sides get the example's options, which they must agree on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_url() {
    fences("dual:memory://fenced-old|memory://fenced-new").await;
    fences("dual:memory://fenced-old?ttl=5s|memory://fenced-new?ttl=5s").await;
}

/// A Redis URL with a query, on a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_url_with_a_query() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    fences(&format!("{}?ttl=5s", server.url())).await;
}
