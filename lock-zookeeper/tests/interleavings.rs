//! Interleavings opened deterministically around this backend (see
//! `conformance::interleavings`): the ones that wrap its protocol half, then the shared
//! ones. Every acquire attempt is distinguishable on the server, so the late cleanup of
//! a failed attempt never removes what a retry of the same acquisition took.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, with_ttl, ZkFactory, BASE};
use conformance::interleavings::{retry_survives_late_cleanup, Cleanup, LateCleanup};
use conformance::Factory;
use lock_core::raw::Connect;
use lock_zookeeper::{lock_dir, queue_order, ZkBackend, ZkHold};

/// The first attempt's cleanup acts as the backend's own cleanup of an abandoned create
/// does when the create's reply never came: it deletes the child of the lock directory
/// that carries the attempt's `_c_<token>-lock-` marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_survives_late_cleanup_by_marker() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(20));
    let backend = ZkBackend::open(config(factory.servers.hosts(), options.clone()))
        .await
        .expect("connect");
    let admin = Arc::new(common::raw_client(&factory.servers.hosts()).await);
    let cleanup: Cleanup<ZkHold> = Arc::new(move |name, token, _hold| {
        let admin = Arc::clone(&admin);
        Box::pin(async move {
            let dir = lock_dir(BASE, &name);
            let marker = format!("_c_{token}-lock-");
            let children = admin.list_children(&dir).await.expect("list");
            // The backend deletes the first marked child in the server's listing order,
            // which may be any of them: take the newest, the worst case, every time.
            let newest = queue_order(&children)
                .into_iter()
                .rfind(|c| c.starts_with(&marker));
            if let Some(child) = newest {
                let _ = admin.delete(&format!("{dir}/{child}"), None).await;
            }
        })
    });
    let flaky = LateCleanup::new(backend, Duration::from_millis(300)).with_cleanup(cleanup);
    let other = factory.client(options.clone()).await;
    let name = format!("attempts/{}", uuid::Uuid::new_v4().simple());
    retry_survives_late_cleanup(flaky, options, other, &name).await;
}

conformance::interleavings_suite!(ZkFactory::start());
