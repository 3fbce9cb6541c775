//! Interleavings opened deterministically around this backend (see
//! `lab::interleavings`): the ones that wrap its protocol half, then the shared
//! ones. Every acquire attempt is distinguishable on the server, so the late cleanup of
//! a failed attempt never removes what a retry of the same acquisition took.

use std::time::Duration;

use conformance::Factory;
use lab::interleavings::{retry_survives_late_cleanup, LateCleanup};
use lock_core::raw::driver::Connect;
use lock_etcd::EtcdBackend;
use testkit::etcd::{config, with_ttl, EtcdFactory};

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

lab::interleavings_suite!(EtcdFactory::start());
