//! Interleavings opened deterministically around this backend (see
//! `lab::interleavings`): the ones that wrap its protocol half, then the shared
//! ones. Every acquire attempt is distinguishable on the server, so the late cleanup of
//! a failed attempt never removes what a retry of the same acquisition took.

use std::time::Duration;

use lab::interleavings::{
    last_applied_extension_wins, retry_survives_late_cleanup, LateCleanup, SlowRenewalReply,
};
use lock_core::raw::driver::Connect;
use lock_redis::RedisBackend;
use testkit::redis::{config_for, with_ttl, RedisFactory};

async fn check(factory: RedisFactory, redlock: bool) {
    let options = with_ttl(Duration::from_secs(30));
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

/// Two extensions in flight at once: the guard keeps the deadline of the one the
/// server applied last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_applied_extension_wins_on_redis() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(1));
    let backend = RedisBackend::open(config_for(&factory.servers.addrs(), false, options.clone()))
        .await
        .expect("connect");
    let slow = SlowRenewalReply::new(backend, Duration::from_secs(30), Duration::from_millis(500));
    let other = factory.make(options.clone()).await;
    let name = format!("extensions/{}", uuid::Uuid::new_v4().simple());
    last_applied_extension_wins(slow, options, other, &name).await;
}

lab::interleavings_suite!(RedisFactory::single());
