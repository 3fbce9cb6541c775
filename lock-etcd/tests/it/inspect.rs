//! `Backend::inspect` on etcd: the keys of a lock's range in create revision order with
//! their owner tokens (ours, stored as the value; none for an empty value as the Go
//! client puts), the holder's fencing token (its create revision, the guard's token) and
//! lease, and a token floor below every later grant's token.

use std::sync::Arc;
use std::time::Duration;

use conformance::inspection::{self, inspect_until, owner, release, wait_for};
use conformance::rules::unique_name;
use lock_core::raw::backend::Backend;
use lock_core::{DistributedLockExt, ErrorKind, FencingToken};
use lock_etcd::EtcdLock;
use testkit::etcd::{
    client, config, enable_auth, go_key, raw_client, single, with_ttl, EtcdFactory, GoKey,
};

async fn clients(factory: &EtcdFactory, n: usize) -> Vec<Arc<EtcdLock>> {
    let addrs = factory.servers.addrs();
    futures::future::join_all((0..n).map(|_| client(&addrs, with_ttl(Duration::from_secs(10)))))
        .await
}

/// A holder and two waiters show in queue order with their owner tokens and leases; the
/// holder's fencing token is its guard's and its lease the client's; each waiter later
/// holds with the token it showed, and is granted a fencing token above the floor the
/// inspection reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_and_waiters_in_queue_order() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let clients = clients(&factory, 3).await;
    inspection::holder_and_waiters_in_queue_order(&clients, Some(Duration::from_secs(10))).await;
}

/// A name never locked shows nobody and a floor below its first grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lock() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let clients = clients(&factory, 1).await;
    let lock = unique_name("inspect_empty");
    let never = clients[0].backend().inspect(&lock).await.expect("inspect");
    assert_eq!(never.holder, None);
    assert!(never.waiters.is_empty());
    let floor = never.token_floor.expect("a token floor");
    let guard = clients[0].lock(lock.as_str()).await.expect("acquire");
    assert!(guard.fencing_token() > floor);
    release(guard).await;
}

/// A key put as the Go client's `concurrency.Mutex` puts it (empty value, on a lease)
/// holds without an owner token, with its create revision as fencing token and its
/// lease's time to live; our waiter queues behind it with its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_client_key_without_owner_token() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let clients = clients(&factory, 1).await;
    let lock = unique_name("inspect_go");
    let admin = factory.admin().clone();
    let GoKey {
        revision: created,
        lease,
        ..
    } = go_key(&admin, &factory.range(&lock), 30).await;
    let waiter = wait_for(&clients[0], &lock);

    let seen = inspect_until(&clients[0], &lock, 2).await;
    let holder = seen.holder.clone().expect("the Go-client key holds");
    assert_eq!(holder.owner_token, None);
    assert_eq!(
        holder.fencing_token,
        Some(FencingToken(u64::try_from(created).expect("revision")))
    );
    let left = holder.lease_left.expect("its lease");
    assert!(left <= Duration::from_secs(30), "{left:?}");
    let ours = seen.waiters[0].owner_token.clone();
    assert!(ours.is_some(), "our waiter stores its token: {seen:?}");

    admin
        .lease_client()
        .revoke(lease)
        .await
        .expect("revoke the Go-client lease");
    let guard = waiter.await.expect("waiter");
    assert_eq!(owner(&guard), ours);
    release(guard).await;
}

/// A lock range the user may not read is a typed error: the permissions error of the
/// backend (a configuration problem), not retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_lock_range() {
    const PASSWORD: &str = "inspect-pw";
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    enable_auth(&admin, PASSWORD, &[("reader", "elsewhere/")]).await;
    let config = config(&[server.addr()], with_ttl(Duration::from_secs(5)))
        .with_credentials("reader", PASSWORD);
    let reader = EtcdLock::connect(config).await.expect("connect");
    let err = reader
        .backend()
        .inspect(&unique_name("inspect_no_read"))
        .await
        .expect_err("no read permission on the range");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable());
}

/// An election's inspection: the leader as holder with its proposal as value and its
/// term as fencing token, the other candidate as a waiter with its value (no owner token:
/// the key stores the proposal); `list` names the election, the factory's leftover check
/// sees its keys, and `force_release` returns the leader with its value, after which the
/// leader turns Lost (broken) and the waiting candidate leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_candidates_show_their_values() {
    use conformance::Factory;
    use lock_core::{AcquireOptions, Election, LostReason};

    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let clients = clients(&factory, 2).await;
    let name = unique_name("inspect_election");
    let on_a = Election::new(clients[0].clone(), name.as_str()).expect("election");
    let on_b = Election::new(clients[1].clone(), name.as_str()).expect("election");
    let leader = on_a
        .campaign_with("10.0.0.1:8080", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let waiting = tokio::spawn(async move {
        on_b.campaign_with(
            "10.0.0.2:8080",
            &AcquireOptions::timeout(Duration::from_secs(30)),
        )
        .await
        .expect("campaign")
        .expect("leads after the break")
    });
    let seen = inspect_until(clients[0].as_ref(), &name, 2).await;
    let holder = seen.holder.expect("the leader holds");
    assert_eq!(holder.value.as_deref(), Some(&b"10.0.0.1:8080"[..]));
    assert_eq!(holder.fencing_token, Some(leader.term()));
    assert_eq!(holder.owner_token, None, "a proposal is no owner token");
    assert_eq!(
        seen.waiters[0].value.as_deref(),
        Some(&b"10.0.0.2:8080"[..])
    );
    let listed = clients[1].backend().list("").await.expect("list");
    assert!(listed.contains(&name), "{listed:?}");
    // (These clients are not the factory's, so their leases show as leftovers too.)
    let left = factory.leftovers(std::slice::from_ref(&name)).await;
    let keys = left.iter().filter(|left| left.contains(": key ")).count();
    assert_eq!(keys, 2, "both candidates' keys are leftovers: {left:?}");

    let broken = clients[1]
        .backend()
        .force_release(&name)
        .await
        .expect("break")
        .expect("a leader to break");
    assert_eq!(broken.value.as_deref(), Some(&b"10.0.0.1:8080"[..]));
    assert_eq!(broken.fencing_token, Some(leader.term()));
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting candidate leads after the break")
        .expect("campaign task");
    assert!(next.term() > leader.term());
    let reason = tokio::time::timeout(Duration::from_secs(15), leader.lost())
        .await
        .expect("the broken leader turns Lost");
    assert_eq!(reason, LostReason::Broken);
    next.resign().await.expect("resign");
    drop(leader);
}
