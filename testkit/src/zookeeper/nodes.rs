//! ZooKeeper nodes as the tests see them: persistent nodes created up front, the lock
//! nodes of a directory in queue order, a directory's children, and waits until they
//! reach a count.

use std::time::Duration;

use lock_core::LockName;
use lock_zookeeper::{lock_dir, queue_order, semaphore_dirs, SEMAPHORE_LEASES, SEMAPHORE_LOCKS};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{ZkFactory, BASE};

/// Creates each of `paths` as a persistent node open to anyone, unless it exists.
pub async fn create_persistent(admin: &zk::Client, paths: impl IntoIterator<Item = String>) {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for path in paths {
        match admin.create(&path, &[], &persistent).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(err) => panic!("create {path}: {err}"),
        }
    }
}

/// The lock nodes in `name`'s directory under [`BASE`], in queue order.
pub async fn queue(admin: &zk::Client, name: &LockName) -> Vec<String> {
    queue_under(admin, BASE, name).await
}

/// The lock nodes in `name`'s directory under `base`, in queue order.
pub async fn queue_under(admin: &zk::Client, base: &str, name: &LockName) -> Vec<String> {
    let dir = lock_dir(base, name);
    let children = match admin.list_children(&dir).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(err) => panic!("list {dir}: {err}"),
    };
    queue_order(&children)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The nodes of a semaphore named `name` under `base`: its mutex's lock nodes and its
/// lease nodes, as `locks/<node>` and `leases/<node>` (the two containers themselves,
/// which the server reaps once empty, are not listed).
pub async fn semaphore_nodes(admin: &zk::Client, base: &str, name: &LockName) -> Vec<String> {
    let dir = lock_dir(base, name);
    let (locks, leases) = semaphore_dirs(&dir);
    let mut nodes = Vec::new();
    for (sub, path) in [(SEMAPHORE_LOCKS, locks), (SEMAPHORE_LEASES, leases)] {
        for child in children(admin, &path).await {
            nodes.push(format!("{sub}/{child}"));
        }
    }
    nodes
}

/// The children of `dir`, sorted (none for a missing `dir`).
pub async fn children(admin: &zk::Client, dir: &str) -> Vec<String> {
    match admin.list_children(dir).await {
        Ok(mut children) => {
            children.sort_unstable();
            children
        }
        Err(zk::Error::NoNode) => Vec::new(),
        Err(err) => panic!("list {dir}: {err}"),
    }
}

/// Waits (at most 20 s) until `dir` has `n` children.
pub async fn children_reach(admin: &zk::Client, dir: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while children(admin, dir).await.len() != n {
        assert!(Instant::now() < deadline, "{dir} never had {n} children");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 20 s) until `name`'s queue has `n` lock nodes.
pub async fn queue_len_reaches(factory: &ZkFactory, name: &LockName, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while factory.queue(name).await.len() < n {
        assert!(
            Instant::now() < deadline,
            "queue of {name} never reached {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
