//! Every acquire attempt is distinguishable on the server: the late cleanup of a failed
//! attempt never removes what a retry of the same acquisition took.

mod common;

use std::time::Duration;

use common::{config_for, ttl_options, RedisFactory};
use conformance::attempts::{retry_survives_late_cleanup, LateCleanup};
use lock_redis::RedisBackend;

async fn check(factory: RedisFactory, redlock: bool) {
    let options = ttl_options(Duration::from_secs(30));
    let backend = RedisBackend::open(config_for(
        &factory.servers.addrs(),
        redlock,
        options.clone(),
    ))
    .await
    .expect("connect");
    let flaky = LateCleanup::new(backend, Duration::from_millis(300));
    let other = factory.make(options.clone()).await;
    let name = format!("attempts/{}", uuid::Uuid::new_v4().simple());
    retry_survives_late_cleanup(flaky, options, other, &name).await;
}

/// Single server: the retry is not undone by the first attempt's compare-and-delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_retry_survives_late_cleanup() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    check(factory, false).await;
}

/// RedLock: the same across five nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_retry_survives_late_cleanup() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    check(factory, true).await;
}
