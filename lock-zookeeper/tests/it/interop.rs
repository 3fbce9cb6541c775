//! Interoperability with Apache Curator's `InterProcessMutex` (Debian package
//! `libcurator-recipes-java`): a tiny Java program, compiled with `javac` at test time,
//! holds the mutex on the same path as our lock. Both exclude each other and mixed
//! waiters are served in sequence order.
//!
//! The Java program is [`harness::curator`]'s. Without java, javac or the Curator jars
//! the tests print a loud notice and pass, unless `LOCK_TEST_STRICT=1`, where they fail.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{DistributedLockExt, ReleaseOutcome};
use testkit::zookeeper::{queue, queue_len_reaches, with_ttl, CuratorSetup};
use tokio::time::{sleep, timeout, Instant};

/// A Curator holder blocks our acquire on the same path, and ours blocks Curator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_distlock_exclude_each_other() {
    let Some(setup) = CuratorSetup::start("exclude").await else {
        return;
    };
    let (factory, name) = (&setup.factory, &setup.name);
    let ours = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let mut curator = setup.curator().await;

    // Curator holds: we are excluded, and we wait in its queue.
    curator.send("acquire").await.expect("send");
    curator.expect("ACQUIRED", Duration::from_secs(20)).await;
    assert!(
        ours.try_lock(name.as_str()).await.expect("try").is_none(),
        "try_lock succeeded while Curator holds the lock"
    );
    let waiter = tokio::spawn({
        let (ours, name) = (Arc::clone(&ours), name.clone());
        async move {
            let guard = ours.lock(name.as_str()).await.expect("acquire");
            (Instant::now(), guard)
        }
    });
    queue_len_reaches(factory, name, 2).await;
    sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "acquired while Curator holds the lock"
    );
    curator.send("release").await.expect("send");
    let released_at = curator.expect("RELEASED", Duration::from_secs(10)).await;
    let (acquired_at, guard) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("our waiter gets the lock after Curator releases")
        .expect("waiter task");
    eprintln!(
        "Curator -> distlock hand-off observed after {:?}",
        acquired_at.saturating_duration_since(released_at)
    );

    // We hold: Curator queues behind us and waits.
    curator.send("acquire").await.expect("send");
    queue_len_reaches(factory, name, 2).await;
    curator.silent_for(Duration::from_millis(800)).await;
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    curator.expect("ACQUIRED", Duration::from_secs(10)).await;
    assert!(ours.try_lock(name.as_str()).await.expect("try").is_none());
    curator.send("release").await.expect("send");
    curator.expect("RELEASED", Duration::from_secs(10)).await;
    let next = ours
        .try_lock(name.as_str())
        .await
        .expect("try")
        .expect("free after Curator released");
    next.release().await.expect("release");
    curator.exit().await;
}

/// Mixed waiters (Curator, distlock, Curator, distlock) are served in queue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_waiters_are_served_in_sequence_order() {
    let Some(setup) = CuratorSetup::start("fifo").await else {
        return;
    };
    let (factory, name) = (&setup.factory, &setup.name);
    let holder = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let first = holder.lock(name.as_str()).await.expect("acquire");
    let order: Arc<Mutex<Vec<(&'static str, Instant)>>> = Arc::default();

    let mut c1 = setup.curator().await;
    let mut c3 = setup.curator().await;
    let mut rust_waiters = Vec::new();
    let mut queued = 1;
    for label in ["curator-1", "distlock-2", "curator-3", "distlock-4"] {
        match label {
            "curator-1" => c1.send("hold 150").await.expect("send"),
            "curator-3" => c3.send("hold 150").await.expect("send"),
            _ => {
                let client = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
                let (name, order) = (name.clone(), Arc::clone(&order));
                rust_waiters.push(tokio::spawn(async move {
                    let guard = client.lock(name.as_str()).await.expect("acquire");
                    order.lock().expect("order").push((label, Instant::now()));
                    sleep(Duration::from_millis(150)).await;
                    guard.release().await.expect("release");
                }));
            }
        }
        queued += 1;
        queue_len_reaches(factory, name, queued).await;
    }
    first.release().await.expect("release");
    let c1_at = c1.expect("ACQUIRED", Duration::from_secs(20)).await;
    c1.expect("RELEASED", Duration::from_secs(20)).await;
    let c3_at = c3.expect("ACQUIRED", Duration::from_secs(20)).await;
    c3.expect("RELEASED", Duration::from_secs(20)).await;
    for waiter in rust_waiters {
        timeout(Duration::from_secs(20), waiter)
            .await
            .expect("distlock waiters served")
            .expect("waiter task");
    }
    let mut order = order.lock().expect("order").clone();
    order.push(("curator-1", c1_at));
    order.push(("curator-3", c3_at));
    order.sort_by_key(|(_, at)| *at);
    let labels: Vec<&str> = order.iter().map(|(label, _)| *label).collect();
    assert_eq!(
        labels,
        ["curator-1", "distlock-2", "curator-3", "distlock-4"],
        "grant order"
    );
    assert!(queue(factory.admin(), name).await.is_empty());
    c1.exit().await;
    c3.exit().await;
}
