//! Interleavings opened deterministically around this backend (see
//! `lab::interleavings`): the ones that wrap its protocol half, then the shared
//! ones. Every acquire attempt is distinguishable on the server, so the late cleanup of
//! a failed attempt never removes what a retry of the same acquisition took; an acquire
//! dropped while its first requests are in flight leaves no node.

use std::sync::Arc;
use std::time::Duration;

use conformance::Factory;
use lab::interleavings::{retry_survives_late_cleanup, Cleanup, LateCleanup};
use lock_core::raw::driver::Connect;
use lock_core::DistributedLockExt;
use lock_zookeeper::{lock_dir, queue_order, ZkBackend, ZkHold};
use testkit::zookeeper::{
    config, create_persistent, queue, unique_name, with_ttl, ZkFactory, BASE,
};
use tokio::time::{sleep, Instant};
use zookeeper_client as zk;

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
    let admin = Arc::new(testkit::zookeeper::raw_client(&factory.servers.hosts()).await);
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

/// The child version of `dir`: it counts the creates and deletes of its children.
async fn child_changes(admin: &zk::Client, dir: &str) -> i32 {
    let stat = admin
        .check_stat(dir)
        .await
        .expect("stat")
        .expect("directory");
    stat.cversion
}

/// An acquire dropped right after its first poll, when the create of its node and the
/// listing sent behind it are both unanswered, leaves no node: on a free lock (which the
/// create would have won) and behind a holder. The directory's child version shows that
/// each dropped acquire did create its node, and that it was deleted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_dropped_with_its_requests_in_flight_leaves_no_node() {
    const ROUNDS: i32 = 10;
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let admin = factory.admin();
    let options = with_ttl(Duration::from_secs(20));
    let client = factory.zk_client(options.clone()).await;
    let holder = factory.zk_client(options).await;
    let lock = unique_name("dropped_in_flight");
    let dir = lock_dir(BASE, &lock);
    create_persistent(admin, [BASE.to_owned(), dir.clone()]).await;
    for contended in [false, true] {
        let guard = match contended {
            true => Some(holder.lock(lock.as_str()).await.expect("holder acquires")),
            false => None,
        };
        let expected = queue(admin, &lock).await;
        // A round whose replies arrive within the first poll (the polling thread was
        // preempted while the client's I/O ran) tests nothing: it is done again, at most
        // ROUNDS times in all.
        let mut answered_at_once = 0;
        let mut round = 0;
        while round < ROUNDS {
            let before = child_changes(admin, &dir).await;
            let mut acquire = Box::pin(client.lock(lock.as_str()));
            if let std::task::Poll::Ready(outcome) = futures::poll!(acquire.as_mut()) {
                assert!(
                    !contended,
                    "round {round}: answered at once while held: {outcome:?}"
                );
                answered_at_once += 1;
                assert!(
                    answered_at_once <= ROUNDS,
                    "contended {contended}: {answered_at_once} acquires answered within \
                     their first poll"
                );
                outcome
                    .expect("an acquire answered at once")
                    .release()
                    .await
                    .expect("release");
                continue;
            }
            drop(acquire);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let changes = child_changes(admin, &dir).await - before;
                let left = queue(admin, &lock).await;
                if changes == 2 && left == expected {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "contended {contended}, round {round}: {changes} child changes \
                     (a create and a delete expected), queue {left:?}, expected {expected:?}"
                );
                sleep(Duration::from_millis(20)).await;
            }
            round += 1;
        }
        if let Some(guard) = guard {
            guard.release().await.expect("release");
        }
    }
    let guard = holder
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("free after the dropped acquires");
    guard.release().await.expect("release");
}

lab::interleavings_suite!(ZkFactory::start());
