//! Semaphore and read-write lock interoperability with Apache Curator's
//! `InterProcessSemaphoreV2` and `InterProcessReadWriteLock` (Debian package
//! `libcurator-recipes-java`): on one path, Curator and distlock together never exceed
//! the permits and never put a writer beside anyone, each waits for the other, and a
//! distlock downgrade keeps a Curator writer queued behind it out.
//!
//! The Java program is [`harness::curator`]'s. Without java, javac or the Curator jars
//! the tests print a loud notice and pass, unless `LOCK_TEST_STRICT=1`, where they fail.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{AcquireOptions, DistributedLock, RwLock, Semaphore};
use lock_zookeeper::{node_kind, semaphore_dirs, NodeKind};
use testkit::zookeeper::{children, children_reach, with_ttl, CuratorSetup};
use tokio::time::{sleep, timeout};

/// How long a hand-over may take.
const PROMPT: Duration = Duration::from_secs(5);
/// How long a waiter must stay waiting to count as waiting.
const QUIET: Duration = Duration::from_millis(800);

async fn client(setup: &CuratorSetup) -> Arc<dyn DistributedLock> {
    setup
        .factory
        .zk_client(with_ttl(Duration::from_secs(10)))
        .await
}

/// Curator and distlock share a semaphore of 2: a Curator lease and a distlock permit
/// fill it; a third of either kind waits (Curator's in the `locks` mutex queue, ours
/// behind it) and is granted when the other side returns one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_distlock_share_the_permits() {
    let Some(setup) = CuratorSetup::start("semaphore").await else {
        return;
    };
    let admin = setup.factory.admin();
    let (locks, leases) = semaphore_dirs(&setup.path);
    let ours = Semaphore::new(client(&setup).await, setup.name.as_str(), 2).expect("semaphore");
    let mut curator = setup.curator().await;
    let mut second = setup.curator().await;

    let node = curator.lease(2).await.expect("Curator leases");
    assert_eq!(node_kind(&node), Some(NodeKind::Lease), "{node}");
    let permit = ours.acquire_with(&AcquireOptions::try_once()).await;
    let permit = permit.expect("try").expect("the second permit");
    assert!(
        ours.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a third permit of two beside Curator's lease"
    );
    let seen = ours.occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2, "{seen:?}");

    // A Curator acquirer waits for our permit.
    second.send("semaphore 2").await.expect("send");
    children_reach(admin, &leases, 3).await;
    second.silent_for(QUIET).await;
    assert!(children(admin, &locks).await.len() <= 1);
    permit.release().await.expect("release");
    second
        .leased(PROMPT)
        .await
        .expect("Curator leases after our release");
    assert_eq!(children(admin, &leases).await.len(), 2);

    // Ours waits for a Curator lease.
    let waiting = {
        let ours = ours.clone();
        tokio::spawn(async move { ours.acquire_with(&AcquireOptions::forever()).await })
    };
    children_reach(admin, &leases, 3).await;
    sleep(QUIET).await;
    assert!(
        !waiting.is_finished(),
        "a third permit beside two Curator leases"
    );
    curator.return_lease().await.expect("return");
    let permit = timeout(PROMPT, waiting)
        .await
        .expect("granted after Curator returns a lease")
        .expect("task")
        .expect("acquire")
        .expect("granted");
    children_reach(admin, &leases, 2).await;
    permit.release().await.expect("release");
    second.return_lease().await.expect("return");
    children_reach(admin, &leases, 0).await;
    curator.exit().await;
    second.exit().await;
}

/// A Curator writer keeps distlock readers and writers out and the other way round;
/// Curator and distlock readers share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_distlock_readers_and_writers_exclude() {
    let Some(setup) = CuratorSetup::start("rwlock").await else {
        return;
    };
    let admin = setup.factory.admin();
    let ours = RwLock::new(client(&setup).await, setup.name.as_str()).expect("rwlock");
    let mut curator = setup.curator().await;
    let try_once = AcquireOptions::try_once();

    // Curator writes: we neither read nor write.
    curator.send("write").await.expect("send");
    curator.expect("WRITING", PROMPT).await;
    let nodes = children(admin, &setup.path).await;
    assert!(
        nodes.iter().all(|n| node_kind(n) == Some(NodeKind::Write)),
        "{nodes:?}"
    );
    assert!(ours.read_with(&try_once).await.expect("try").is_none());
    assert!(ours.write_with(&try_once).await.expect("try").is_none());
    let reading = {
        let ours = ours.clone();
        tokio::spawn(async move { ours.read_with(&AcquireOptions::forever()).await })
    };
    children_reach(admin, &setup.path, 2).await;
    sleep(QUIET).await;
    assert!(!reading.is_finished(), "a reader beside Curator's writer");
    curator.unlock(true).await.expect("unwrite");
    let read = timeout(PROMPT, reading)
        .await
        .expect("we read after Curator's writer")
        .expect("task")
        .expect("read")
        .expect("granted");

    // Curator reads beside our reader; its writer waits for both.
    curator.send("read").await.expect("send");
    curator.expect("READING", PROMPT).await;
    let mut writer = setup.curator().await;
    writer.send("write").await.expect("send");
    children_reach(admin, &setup.path, 3).await;
    writer.silent_for(QUIET).await;
    read.release().await.expect("release");
    writer.silent_for(QUIET).await;
    curator.unlock(false).await.expect("unread");
    writer.expect("WRITING", PROMPT).await;
    assert!(ours.read_with(&try_once).await.expect("try").is_none());
    writer.unlock(true).await.expect("unwrite");

    // We write: a Curator reader waits for us.
    let write = ours
        .write_with(&try_once)
        .await
        .expect("try")
        .expect("write");
    curator.send("read").await.expect("send");
    children_reach(admin, &setup.path, 2).await;
    curator.silent_for(QUIET).await;
    write.release().await.expect("release");
    curator.expect("READING", PROMPT).await;
    curator.unlock(false).await.expect("unread");
    children_reach(admin, &setup.path, 0).await;
    curator.exit().await;
    writer.exit().await;
}

/// A distlock downgrade lets our reader queued behind in, while a Curator writer queued
/// behind it keeps waiting (our node still reads as a writer to Curator) until both
/// readers are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_keeps_a_curator_writer_out() {
    let Some(setup) = CuratorSetup::start("downgrade").await else {
        return;
    };
    let admin = setup.factory.admin();
    let ours = RwLock::new(client(&setup).await, setup.name.as_str()).expect("rwlock");
    let other = RwLock::new(client(&setup).await, setup.name.as_str()).expect("rwlock");
    let mut curator = setup.curator().await;

    let write = ours.write_with(&AcquireOptions::try_once()).await;
    let write = write.expect("try").expect("write");
    let reading = tokio::spawn(async move { other.read_with(&AcquireOptions::forever()).await });
    children_reach(admin, &setup.path, 2).await;
    curator.send("write").await.expect("send");
    children_reach(admin, &setup.path, 3).await;

    let read = write.downgrade().await.expect("downgrade");
    let other_read = timeout(PROMPT, reading)
        .await
        .expect("our reader is granted beside the downgraded hold")
        .expect("task")
        .expect("read")
        .expect("granted");
    curator.silent_for(QUIET).await;
    read.release().await.expect("release");
    curator.silent_for(QUIET).await;
    other_read.release().await.expect("release");
    curator.expect("WRITING", PROMPT).await;
    curator.unlock(true).await.expect("unwrite");
    curator.exit().await;
}

/// Beside a Curator lease on a semaphore of 3, distlock refuses to take several permits in
/// one hold and to resize (`Unsupported`, before any request: Curator counts lease nodes
/// and keeps its number in each client), leaving the Curator lease alone and no node of
/// its own; single permits are still shared with Curator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_and_resize_refused_beside_curator() {
    let Some(setup) = CuratorSetup::start("semaphore-many").await else {
        return;
    };
    let admin = setup.factory.admin();
    let (_, leases) = semaphore_dirs(&setup.path);
    let mut ours = Semaphore::new(client(&setup).await, setup.name.as_str(), 3).expect("semaphore");
    let mut curator = setup.curator().await;
    curator.lease(3).await.expect("Curator leases");
    for n in [2, 3] {
        let err = ours.try_acquire_many(n).await.expect_err("refused");
        assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
    }
    let err = ours.resize(2, PROMPT).await.expect_err("refused");
    assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("Curator"), "says why: {err}");
    assert_eq!(ours.permits(), 3, "the handle keeps its number");
    assert_eq!(
        children(admin, &leases).await.len(),
        1,
        "Curator's lease only"
    );
    let permit = ours
        .try_acquire_many(1)
        .await
        .expect("try")
        .expect("a permit beside Curator's");
    assert_eq!(children(admin, &leases).await.len(), 2);
    permit.release().await.expect("release");
    curator.return_lease().await.expect("return");
    children_reach(admin, &leases, 0).await;
    curator.exit().await;
}

/// Our upgradeable reader beside Curator's `InterProcessReadWriteLock`: granted beside a
/// Curator reader ahead; a Curator reader queued behind waits for it (our node is a
/// writer's to Curator), which is safe, and the upgrade does not wait for that reader
/// (it would wait for the upgrade: a deadlock), only for the readers that hold beside it:
/// Curator's ahead and ours behind. A Curator writer queued behind comes after the
/// upgraded writer, and after the Curator reader queued before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_beside_curator_readers_and_writers() {
    let Some(setup) = CuratorSetup::start("upgrade").await else {
        return;
    };
    let admin = setup.factory.admin();
    let ours = RwLock::new(client(&setup).await, setup.name.as_str()).expect("rwlock");
    let other = RwLock::new(client(&setup).await, setup.name.as_str()).expect("rwlock");
    let (mut ahead, mut behind, mut writer) = (
        setup.curator().await,
        setup.curator().await,
        setup.curator().await,
    );

    ahead.send("read").await.expect("send");
    ahead.expect("READING", PROMPT).await;
    let upgradeable = ours.try_upgradeable_read().await.expect("try");
    let upgradeable = upgradeable.expect("granted beside Curator's reader");
    behind.send("read").await.expect("send");
    children_reach(admin, &setup.path, 3).await;
    behind.silent_for(QUIET).await;
    let reading = other.try_read().await.expect("try");
    let reading = reading.expect("our reader passes the upgradeable reader");
    writer.send("write").await.expect("send");
    children_reach(admin, &setup.path, 5).await;

    let token = upgradeable.fencing_token();
    let upgrade = tokio::spawn(async move { upgradeable.upgrade().await });
    sleep(QUIET).await;
    assert!(!upgrade.is_finished(), "upgraded beside Curator's reader");
    assert!(
        other.try_read().await.expect("try").is_none(),
        "a new reader of ours waits for the upgrade"
    );
    ahead.unlock(false).await.expect("unread");
    sleep(QUIET).await;
    assert!(!upgrade.is_finished(), "upgraded beside our reader");
    reading.release().await.expect("release");
    let writing = timeout(PROMPT, upgrade)
        .await
        .expect("upgraded once the readers beside it left, not waiting for Curator's")
        .expect("task")
        .expect("upgrade");
    assert_eq!(writing.fencing_token(), token);
    behind.silent_for(QUIET).await;
    writing.release().await.expect("release");
    behind.expect("READING", PROMPT).await;
    writer.silent_for(QUIET).await;
    behind.unlock(false).await.expect("unread");
    writer.expect("WRITING", PROMPT).await;
    writer.unlock(true).await.expect("unwrite");
    children_reach(admin, &setup.path, 0).await;
    for curator in [ahead, behind, writer] {
        curator.exit().await;
    }
}
