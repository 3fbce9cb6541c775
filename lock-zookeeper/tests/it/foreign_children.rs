//! Children of a lock directory that are not lock nodes (`<prefix>lock-<ten digits>`, the
//! names Curator's InterProcessMutex and this crate create) are not part of the queue:
//! whatever their names sort like, they never hold the lock or stand in line for it.

use std::time::Duration;

use lock_core::{DistributedLockExt, ReleaseOutcome};
use lock_zookeeper::lock_dir;
use testkit::zookeeper::{create_persistent, hand_over, unique_name, with_ttl, ZkFactory, BASE};

/// Names that are not lock nodes, some of which sort before any sequence number.
const FOREIGN: &[&str] = &["foo", "lock-abc", "lock-", "x-lock-0", "0000000000"];

/// Acquire, wait and release work in a lock directory that also holds foreign children,
/// which stay untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_children_of_a_lock_directory_are_not_queued() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let lock = unique_name("foreign");
    let dir = lock_dir(BASE, &lock);
    let foreign = FOREIGN.iter().map(|child| format!("{dir}/{child}"));
    create_persistent(
        factory.admin(),
        [BASE.to_owned(), dir.clone()].into_iter().chain(foreign),
    )
    .await;
    let first = factory.zk_client(with_ttl(Duration::from_secs(6))).await;
    let second = factory.zk_client(with_ttl(Duration::from_secs(6))).await;

    let guard = first
        .lock_timeout(lock.as_str(), Duration::from_secs(5))
        .await
        .expect("granted although the directory holds foreign children");
    assert!(
        second.try_lock(lock.as_str()).await.expect("try").is_none(),
        "a second holder"
    );
    let next = hand_over(guard, &second, &lock).await;
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    let mut left = factory.admin().list_children(&dir).await.expect("list");
    left.sort();
    let mut foreign: Vec<String> = FOREIGN.iter().map(|c| (*c).to_owned()).collect();
    foreign.sort();
    assert_eq!(
        left, foreign,
        "only the foreign children are left, untouched"
    );
}
