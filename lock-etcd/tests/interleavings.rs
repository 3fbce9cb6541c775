//! Every acquire attempt is distinguishable on the server: the late cleanup of a failed
//! attempt never removes what a retry of the same acquisition took.

mod common;

use std::time::Duration;

use common::{config, with_ttl, EtcdFactory};
use conformance::interleavings::{
    ended_hold_released_despite_a_broken_link, extend_for_keeps_an_auto_renewed_hold,
    retry_survives_late_cleanup, LateCleanup,
};
use conformance::Factory;
use lock_etcd::EtcdBackend;

/// The retry's key gets a fresh create revision; the first attempt's cleanup compares
/// the old one and leaves it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_survives_late_cleanup_on_etcd() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(30));
    let backend = EtcdBackend::open(config(&factory.servers.addrs(), options.clone()))
        .await
        .expect("connect");
    let flaky = LateCleanup::new(backend, Duration::from_millis(300));
    let other = factory.client(options.clone()).await;
    let name = format!("attempts/{}", uuid::Uuid::new_v4().simple());
    retry_survives_late_cleanup(flaky, options, other, &name).await;
}

/// `extend_for` another TTL is refused: one session-wide lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_for_another_ttl_is_unsupported() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    extend_for_keeps_an_auto_renewed_hold(&factory).await;
}

/// The release of an ended hold lost on a broken link is retried while the session
/// lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_hold_released_despite_a_broken_link_while_the_session_lives() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    ended_hold_released_despite_a_broken_link(&factory).await;
}

/// A waiter cut off beyond the TTL waits on with a new session and gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_outlives_its_session() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    conformance::interleavings::waiter_outlives_its_session(&factory).await;
}
