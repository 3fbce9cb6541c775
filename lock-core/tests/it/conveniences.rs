//! Every primitive's conveniences, as the mutex's (`lock`, `try_lock`, `lock_timeout`):
//! a wait that cannot come back empty returns the guard, a try an `Option`, a timeout
//! [`ErrorKind::Timeout`] that leaves no waiter behind.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    connect, DistributedLock, Election, ErrorKind, LockName, MultiLock, RwLock, Semaphore,
};
use tokio::time::timeout;

const BRIEFLY: Duration = Duration::from_millis(200);
const PROMPT: Duration = Duration::from_secs(5);

async fn client() -> Arc<dyn DistributedLock> {
    crate::memory_client("conveniences").await
}

async fn nobody_waits(locks: &Arc<dyn DistributedLock>, name: &str) {
    let occupancy = locks
        .inspect(&LockName::new(name).expect("name"))
        .await
        .expect("inspect");
    assert!(occupancy.waiters.is_empty(), "{name}: {occupancy:?}");
}

#[tokio::test]
async fn a_semaphore_waits_tries_and_times_out() {
    let locks = client().await;
    let pool = Semaphore::new(Arc::clone(&locks), "pool", 1).expect("semaphore");
    let held = pool
        .try_acquire()
        .await
        .expect("try")
        .expect("a free permit");
    assert!(pool.try_acquire().await.expect("try").is_none());
    let err = pool.acquire_timeout(BRIEFLY).await.expect_err("taken");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    nobody_waits(&locks, "pool").await;
    let waiting = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire().await }
    });
    held.release().await.expect("release");
    let next = timeout(PROMPT, waiting)
        .await
        .expect("prompt")
        .expect("task");
    next.expect("a permit").release().await.expect("release");
    locks.close().await.expect("close");
}

#[tokio::test]
async fn a_read_write_lock_waits_tries_and_times_out() {
    let locks = client().await;
    let table = RwLock::new(Arc::clone(&locks), "table").expect("rwlock");
    let writing = table.write().await.expect("free");
    assert!(table.try_read().await.expect("try").is_none());
    assert!(table.try_write().await.expect("try").is_none());
    let err = table.read_timeout(BRIEFLY).await.expect_err("written");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let err = table.write_timeout(BRIEFLY).await.expect_err("written");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    nobody_waits(&locks, "table").await;
    let reading = writing.downgrade().await.expect("downgrade");
    let also = table.read().await.expect("readers share");
    let err = table.write_timeout(BRIEFLY).await.expect_err("read");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    reading.release().await.expect("release");
    also.release().await.expect("release");
    let writing = table.try_write().await.expect("try").expect("free again");
    writing.release().await.expect("release");
    locks.close().await.expect("close");
}

#[tokio::test]
async fn an_upgradeable_read_waits_tries_times_out_and_upgrades() {
    let locks = client().await;
    let table = RwLock::new(Arc::clone(&locks), "table").expect("rwlock");
    let checking = table.upgradeable_read().await.expect("free");
    let reading = table.try_read().await.expect("try").expect("beside it");
    assert!(table.try_upgradeable_read().await.expect("try").is_none());
    let err = table
        .upgradeable_read_timeout(BRIEFLY)
        .await
        .expect_err("one at a time");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    nobody_waits(&locks, "table").await;
    let upgrade = tokio::spawn(checking.upgrade());
    tokio::time::sleep(BRIEFLY).await;
    assert!(!upgrade.is_finished(), "the reader still holds");
    reading.release().await.expect("release");
    let writing = timeout(PROMPT, upgrade)
        .await
        .expect("upgraded once the reader left")
        .expect("task")
        .expect("upgrade");
    assert!(table.try_read().await.expect("try").is_none());
    let reading = writing
        .downgrade()
        .await
        .expect("an upgraded writer downgrades");
    reading.release().await.expect("release");
    locks.close().await.expect("close");
}

/// An upgrade waiting for readers ends with `Lost` when the hold is taken from it.
#[tokio::test]
async fn an_upgrade_ends_when_the_hold_is_lost() {
    let space = format!("conveniences-{}", uuid::Uuid::new_v4().simple());
    let locks = connect(&format!("memory://{space}?recheck=100ms"))
        .await
        .expect("connect");
    let table = RwLock::new(Arc::clone(&locks), "table").expect("rwlock");
    let checking = table.upgradeable_read().await.expect("free");
    let _reading = table.try_read().await.expect("try").expect("beside it");
    let upgrade = tokio::spawn(checking.upgrade());
    tokio::time::sleep(BRIEFLY).await;
    let name = LockName::new("table").expect("name");
    assert!(lock_core::memory::MemorySpace::named(&space).steal(&name));
    let err = timeout(PROMPT, upgrade)
        .await
        .expect("the upgrade ends")
        .expect("task")
        .expect_err("lost");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    locks.close().await.expect("close");
}

#[tokio::test]
async fn an_election_waits_tries_and_times_out() {
    let locks = client().await;
    let election = Election::new(Arc::clone(&locks), "leader").expect("election");
    let leading = election.campaign("first").await.expect("leads");
    assert_eq!(leading.value(), b"first");
    assert!(election
        .try_campaign("second")
        .await
        .expect("try")
        .is_none());
    let err = election
        .campaign_timeout("second", BRIEFLY)
        .await
        .expect_err("led");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    nobody_waits(&locks, "leader").await;
    leading.resign().await.expect("resign");
    let next = election
        .campaign_timeout("third", PROMPT)
        .await
        .expect("leads");
    next.resign().await.expect("resign");
    locks.close().await.expect("close");
}

#[tokio::test]
async fn a_multi_lock_waits_tries_and_times_out() {
    let locks = client().await;
    let both = MultiLock::new(Arc::clone(&locks), ["a", "b"]).expect("multi");
    let one = MultiLock::new(Arc::clone(&locks), ["b"]).expect("multi");
    let held = one.acquire().await.expect("free");
    assert!(both.try_acquire().await.expect("try").is_none());
    let err = both.acquire_timeout(BRIEFLY).await.expect_err("b is held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    nobody_waits(&locks, "b").await;
    // All or nothing: the part taken before the timeout is free again.
    let a = MultiLock::new(Arc::clone(&locks), ["a"]).expect("multi");
    a.try_acquire()
        .await
        .expect("try")
        .expect("a was given back")
        .release()
        .await
        .expect("release");
    held.release().await.expect("release");
    both.acquire()
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
    locks.close().await.expect("close");
}
