//! `Backend::inspect` on ZooKeeper: the lock nodes in queue order with their owner
//! tokens (ours, a Curator node's protection id, none for a bare `lock-` node), the
//! holder's fencing token (its czxid, the guard's token), and a token floor below every
//! later grant's token.

use std::sync::Arc;
use std::time::Duration;

use conformance::inspection::{self, inspect_until, owner, release, wait_for};
use lock_core::raw::backend::Backend;
use lock_core::{DistributedLockExt, ErrorKind, FencingToken, Occupancy};
use lock_zookeeper::{lock_dir, ZkLock};
use testkit::zookeeper::{create_persistent, unique_name, with_ttl, ZkFactory, BASE};
use zookeeper_client as zk;

/// A holder and two waiters show in queue order with their owner tokens and sessions;
/// the holder's fencing token is its guard's (no lease: ZooKeeper's are per session);
/// each waiter later holds with the token it showed, and is granted a fencing token
/// above the floor the inspection reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_and_waiters_in_queue_order() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let clients: Vec<Arc<ZkLock>> = futures::future::join_all(
        (0..3).map(|_| factory.zk_client(with_ttl(Duration::from_secs(10)))),
    )
    .await;
    inspection::holder_and_waiters_in_queue_order(&clients, None).await;
}

/// A name never locked shows nobody and a floor below its first grant; once its
/// directory is gone again, the floor (from the lock prefix) covers every earlier grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_missing_lock_directories() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let client = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let lock = unique_name("inspect_empty");

    let never = client.backend().inspect(&lock).await.expect("inspect");
    assert_eq!(never.holder, None);
    assert!(never.waiters.is_empty());
    let floor = never.token_floor.expect("a floor without a directory");
    let guard = client.lock(lock.as_str()).await.expect("acquire");
    assert!(guard.fencing_token() > floor);
    let token = guard.fencing_token();
    release(guard).await;

    // Its directory goes (as the server removes an empty container): the delete is a
    // change of the prefix's children, which the floor then comes from.
    let dir = lock_dir(BASE, &lock);
    match factory.admin().delete(&dir, None).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(err) => panic!("delete {dir}: {err}"),
    }
    let gone = client.backend().inspect(&lock).await.expect("inspect");
    assert_eq!(gone, Occupancy::default().token_floor(gone.token_floor));
    let floor = gone.token_floor.expect("a floor without a directory");
    assert!(floor > token, "{floor:?} covers the grant {token:?}");
    let next = client.lock(lock.as_str()).await.expect("acquire");
    assert!(next.fencing_token() > floor);
    release(next).await;
}

/// A Curator-layout node (`_c_<uuid>-lock-N`) shows with its protection id, a bare
/// `lock-N` node without an owner token, in queue order ahead of our waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_bare_lock_nodes() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let admin = factory.admin();
    let lock = unique_name("inspect_foreign");
    let dir = lock_dir(BASE, &lock);
    create_persistent(admin, [BASE.to_owned(), dir.clone()]).await;
    let id = uuid::Uuid::new_v4().to_string();
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (stat, sequence) = admin
        .create(&format!("{dir}/_c_{id}-lock-"), &[], &ephemeral)
        .await
        .expect("create a Curator-layout node");
    let curator = format!("{dir}/_c_{id}-lock-{sequence}");
    let (_, bare_sequence) = admin
        .create(&format!("{dir}/lock-"), &[], &ephemeral)
        .await
        .expect("create a bare lock node");
    let client = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let waiter = wait_for(&client, &lock);

    let seen = inspect_until(&client, &lock, 3).await;
    let holder = seen.holder.as_ref().expect("the Curator node holds");
    assert_eq!(holder.owner_token.as_deref(), Some(id.as_str()));
    assert_eq!(
        holder.fencing_token,
        Some(FencingToken(u64::try_from(stat.czxid).expect("czxid")))
    );
    assert_eq!(seen.waiters[0].owner_token, None, "the bare node: {seen:?}");
    let ours = seen.waiters[1].owner_token.clone();
    assert!(ours.is_some(), "{seen:?}");

    admin.delete(&curator, None).await.expect("delete");
    let bare = inspect_until(&client, &lock, 2).await;
    let holder = bare.holder.expect("the bare node holds");
    assert_eq!(holder.owner_token, None);
    assert!(holder.fencing_token.is_some());
    assert_eq!(bare.waiters[0].owner_token, ours);

    admin
        .delete(&format!("{dir}/lock-{bare_sequence}"), None)
        .await
        .expect("delete");
    let guard = waiter.await.expect("waiter");
    assert_eq!(owner(&guard), ours);
    release(guard).await;
}

/// A lock directory its ACL does not let us read is a typed error: the permissions
/// error of the backend (a configuration problem), not retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_lock_directory() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let admin = factory.admin();
    let lock = unique_name("inspect_no_read");
    create_persistent(admin, [BASE.to_owned()]).await;
    let no_read = [zk::Acl::new(
        zk::Permission::CREATE | zk::Permission::DELETE,
        zk::AuthId::anyone(),
    )];
    admin
        .create(
            &lock_dir(BASE, &lock),
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&no_read)),
        )
        .await
        .expect("create the lock directory");
    let client = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let err = client
        .backend()
        .inspect(&lock)
        .await
        .expect_err("no READ on the directory");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable());
}
