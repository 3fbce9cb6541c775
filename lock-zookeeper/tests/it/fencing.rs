//! The fencing token is the lock node's czxid (the zxid of its create), whichever reply
//! the acquire learned it from: a create that counted the directory's children alone
//! (free lock), or with others in it (a wait).

use std::time::Duration;

use lock_core::{DistributedLockExt, LockGuard, LockName};
use lock_zookeeper::lock_dir;
use testkit::zookeeper::{hand_over, queue, unique_name, with_ttl, ZkFactory, BASE};
use zookeeper_client as zk;

/// The czxid of the lock node at `position` in `name`'s queue.
async fn czxid(admin: &zk::Client, name: &LockName, position: usize) -> u64 {
    let nodes = queue(admin, name).await;
    let path = format!("{}/{}", lock_dir(BASE, name), nodes[position]);
    let (_, stat) = admin.get_data(&path).await.expect("read lock node");
    u64::try_from(stat.czxid).expect("a valid czxid")
}

/// Asserts that `guard`'s fencing token is the czxid of the node at `position`.
async fn assert_token_is_czxid(admin: &zk::Client, guard: &LockGuard, position: usize) {
    let name = guard.name().clone();
    assert_eq!(
        guard.fencing_token().0,
        czxid(admin, &name, position).await,
        "the fencing token of {name:?} is its node's czxid"
    );
}

/// A lock granted from the create's own reply and one granted after a wait both carry
/// their node's czxid, and the later grant's token is the larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_token_is_the_nodes_czxid() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let admin = factory.admin();
    let first = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let second = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let lock = unique_name("fencing");

    let held = first
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("a free lock");
    assert_token_is_czxid(admin, &held, 0).await;
    let token = held.fencing_token();
    let next = hand_over(held, &second, &lock).await;
    assert_token_is_czxid(admin, &next, 0).await;
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
}
