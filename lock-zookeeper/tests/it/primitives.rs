//! Semaphores and read-write locks on ZooKeeper, in Curator's layouts: the node names
//! Curator's `InterProcessSemaphoreV2` and `InterProcessReadWriteLock` use, the grant
//! rules, a permits disagreement refused, a name of one kind refusing the others, a dropped
//! acquire leaving no node, a long wait keeping its place, a downgrade with a writer
//! queued behind, and a break of the oldest permit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::raw::backend::{AcquireKind, HoldKind};
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockName, ReleaseOutcome,
    RwLock, Semaphore,
};
use lock_zookeeper::{lock_dir, node_kind, permits_in, semaphore_dirs, NodeKind};
use testkit::zookeeper::{children, children_reach, with_ttl, ZkFactory, BASE};
use tokio::time::{sleep, timeout, Instant};

/// How long a hand-over may take.
const PROMPT: Duration = Duration::from_secs(5);

async fn client(factory: &ZkFactory) -> Arc<dyn DistributedLock> {
    factory.zk_client(with_ttl(Duration::from_secs(10))).await
}

fn fresh(tag: &str) -> LockName {
    LockName::new(format!("{tag}-{}", uuid::Uuid::new_v4().simple())).expect("valid")
}

/// A Curator-shaped protected node name: `_c_<id>-<word><ten digits>`.
fn curator_shaped(node: &str, word: &str) -> bool {
    let Some(rest) = node.strip_prefix("_c_") else {
        return false;
    };
    let Some((_, digits)) = rest.rsplit_once(word) else {
        return false;
    };
    digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Permits are lease nodes `<dir>/leases/_c_<token>-lease-<seq>` carrying the count; the
/// `locks` mutex is empty once they are granted; the permits are never exceeded, and a
/// waiter is granted promptly when a permit is returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_layout_and_limit() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = fresh("sem");
    let dir = lock_dir(BASE, &name);
    let (locks, leases) = semaphore_dirs(&dir);
    let admin = factory.admin();
    let semaphores: Vec<Semaphore> = futures::future::join_all((0..3).map(|_| async {
        Semaphore::new(client(&factory).await, name.as_str(), 2).expect("semaphore")
    }))
    .await;
    let one = semaphores[0]
        .acquire_with(&AcquireOptions::try_once())
        .await;
    let one = one.expect("try").expect("first permit");
    let two = semaphores[1]
        .acquire_with(&AcquireOptions::try_once())
        .await;
    let two = two.expect("try").expect("second permit");
    assert!(two.fencing_token() > one.fencing_token());
    assert!(
        semaphores[2]
            .acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a third permit of two"
    );
    let nodes = children(admin, &leases).await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for node in &nodes {
        assert!(curator_shaped(node, "-lease-"), "{node}");
        assert_eq!(node_kind(node), Some(NodeKind::Lease));
        let (data, _) = admin
            .get_data(&format!("{leases}/{node}"))
            .await
            .expect("read");
        assert_eq!(permits_in(&data), Some(2), "{data:?}");
    }
    children_reach(admin, &locks, 0).await;
    let seen = semaphores[0].occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2, "{seen:?}");
    assert!(seen.holders().all(|p| p.kind == Some(HoldKind::permit(2))));

    let third = semaphores[2].clone();
    let waiting = tokio::spawn(async move {
        let permit = third.acquire_with(&AcquireOptions::forever()).await;
        (permit, Instant::now())
    });
    // It waits holding the `locks` mutex, its lease node over the count.
    children_reach(admin, &locks, 1).await;
    children_reach(admin, &leases, 3).await;
    let seen = semaphores[0].occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2, "{seen:?}");
    assert_eq!(seen.waiters.len(), 1, "{seen:?}");
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a third permit of two");
    assert_eq!(
        one.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let released = Instant::now();
    let (third, granted) = timeout(PROMPT, waiting)
        .await
        .expect("granted promptly")
        .expect("task");
    let third = third.expect("acquire").expect("granted");
    eprintln!("permit hand-over after {:?}", granted - released);
    children_reach(admin, &locks, 0).await;
    assert_eq!(children(admin, &leases).await.len(), 2);
    third.release().await.expect("release");
    two.release().await.expect("release");
    children_reach(admin, &leases, 0).await;
}

/// A semaphore used with another number of permits is refused with a typed conflict,
/// and the refused acquire leaves no node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_disagreement_is_a_conflict() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = fresh("sem-conflict");
    let (locks, leases) = semaphore_dirs(&lock_dir(BASE, &name));
    let two = Semaphore::new(client(&factory).await, name.as_str(), 2).expect("semaphore");
    let three = Semaphore::new(client(&factory).await, name.as_str(), 3).expect("semaphore");
    let held = two.acquire_with(&AcquireOptions::try_once()).await;
    let held = held.expect("try").expect("permit");
    for options in [AcquireOptions::try_once(), AcquireOptions::forever()] {
        let err = timeout(PROMPT, three.acquire_with(&options))
            .await
            .expect("refused promptly")
            .expect_err("a disagreement is refused");
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    }
    // A mutex or a read-write lock in a semaphore's directory is refused too.
    let other = client(&factory).await;
    let err = other.try_lock(name.as_str()).await.expect_err("a mutex");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    let rw = RwLock::new(other, name.as_str()).expect("rwlock");
    let err = rw
        .read_with(&AcquireOptions::try_once())
        .await
        .expect_err("a reader");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    children_reach(factory.admin(), &leases, 1).await;
    children_reach(factory.admin(), &locks, 0).await;
    held.release().await.expect("release");
}

/// A name held as one kind refuses an acquire of any kind that cannot be one primitive
/// with it with a typed conflict, once or waiting, whichever kind came first, and the
/// refused acquire leaves nothing behind: no node, and the name is free for its kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_as_one_kind_refuses_the_others() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let kinds = [
        HoldKind::Mutex,
        HoldKind::Candidate {
            value: b"leader".to_vec(),
        },
        HoldKind::Read,
        HoldKind::Write,
        HoldKind::permit(2),
    ];
    let holder = client(&factory).await;
    let other = client(&factory).await;
    let as_kind = |kind: &HoldKind, options: AcquireOptions| options.with_kind(kind.clone());
    let mut granted = Vec::new();
    for held in &kinds {
        let name = fresh("kinds");
        let others = kinds
            .iter()
            .filter(|k| held.check_beside(k, &name).is_err());
        for asked in others {
            let holding = as_kind(held, AcquireOptions::try_once());
            let guard = holder.acquire(&name, &holding).await;
            let guard = guard.expect("try").expect("held");
            let waits = [
                ("try", AcquireOptions::try_once()),
                ("wait", AcquireOptions::timeout(PROMPT)),
            ];
            for (how, wait) in waits {
                let pair = format!("{} beside {} ({how})", asked.label(), held.label());
                match timeout(2 * PROMPT, other.acquire(&name, &as_kind(asked, wait))).await {
                    Ok(Err(err)) => assert_eq!(err.kind(), ErrorKind::Conflict, "{pair}: {err}"),
                    Ok(Ok(Some(wrong))) => {
                        granted.push(pair);
                        wrong.release().await.expect("release");
                    }
                    Ok(Ok(None)) => granted.push(format!("{pair}: busy, not refused")),
                    Err(_) => granted.push(format!("{pair}: waited, not refused")),
                }
            }
            let (locks, leases) = semaphore_dirs(&lock_dir(BASE, &name));
            let permit = matches!(held, HoldKind::Permit { .. });
            children_reach(factory.admin(), &leases, usize::from(permit)).await;
            children_reach(factory.admin(), &locks, 0).await;
            queue_reaches(&factory, &name, usize::from(!permit)).await;
            guard.release().await.expect("release");
            // Nor anything that keeps the name from its own kind.
            match other.acquire(&name, &holding).await {
                Ok(Some(again)) => again.release().await.map(drop).expect("release"),
                refused => granted.push(format!("{} again: {refused:?}", held.label())),
            }
        }
    }
    assert!(granted.is_empty(), "not as expected: {granted:?}");
}

/// Waits (at most 20 s) until `name`'s queue has exactly `n` lock nodes.
async fn queue_reaches(factory: &ZkFactory, name: &LockName, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while factory.queue(name).await.len() != n {
        assert!(Instant::now() < deadline, "{name} never had {n} lock nodes");
        sleep(Duration::from_millis(20)).await;
    }
}

/// A waiter that waits longer than the TTL keeps its place: the one permit held past two
/// TTLs with waiters queued in order b, c goes to b, then to c.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_permit_wait_keeps_its_place() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let name = fresh("sem-long");
    let (locks, leases) = semaphore_dirs(&lock_dir(BASE, &name));
    let admin = factory.admin();
    let semaphore = |lock| Semaphore::new(lock, name.as_str(), 1).expect("semaphore");
    let holder = semaphore(factory.zk_client(with_ttl(ttl)).await);
    let held = holder.acquire_with(&AcquireOptions::try_once()).await;
    let held = held.expect("try").expect("permit");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    // b waits holding the `locks` mutex, its lease node over the count; c behind it.
    for (label, queued) in [("b", 1), ("c", 2)] {
        let waiter = semaphore(factory.zk_client(with_ttl(ttl)).await);
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let permit = waiter.acquire_with(&AcquireOptions::forever()).await;
            let permit = permit.expect("acquire").expect("granted");
            order.lock().expect("order").push(label);
            permit.release().await.expect("release");
        }));
        children_reach(admin, &locks, queued).await;
        children_reach(admin, &leases, 2).await;
    }
    sleep(2 * ttl).await;
    held.release().await.expect("release");
    for waiter in waiters {
        timeout(4 * PROMPT, waiter)
            .await
            .expect("served")
            .expect("task");
    }
    assert_eq!(*order.lock().expect("order"), ["b", "c"]);
}

/// An acquire dropped while it waits (holding the `locks` mutex, its lease node queued)
/// leaves neither node behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_permit_acquire_leaves_no_node() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = fresh("sem-drop");
    let (locks, leases) = semaphore_dirs(&lock_dir(BASE, &name));
    let ours = Semaphore::new(client(&factory).await, name.as_str(), 1).expect("semaphore");
    let other = Semaphore::new(client(&factory).await, name.as_str(), 1).expect("semaphore");
    let held = ours.acquire_with(&AcquireOptions::try_once()).await;
    let held = held.expect("try").expect("permit");
    let waiting = tokio::spawn(async move { other.acquire_with(&AcquireOptions::forever()).await });
    children_reach(factory.admin(), &leases, 2).await;
    waiting.abort();
    children_reach(factory.admin(), &leases, 1).await;
    children_reach(factory.admin(), &locks, 0).await;
    held.release().await.expect("release");
}

/// Readers and writers are `_c_<token>-__READ__<seq>` and `-__WRIT__<seq>` nodes in the
/// lock's directory; readers share, a writer waits for everyone before it, and a reader
/// queued behind a writer does not overtake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_layout_and_order() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = fresh("rw");
    let dir = lock_dir(BASE, &name);
    let admin = factory.admin();
    let locks: Vec<RwLock> =
        futures::future::join_all((0..4).map(|_| async {
            RwLock::new(client(&factory).await, name.as_str()).expect("rwlock")
        }))
        .await;
    let try_once = AcquireOptions::try_once();
    let r1 = locks[0]
        .read_with(&try_once)
        .await
        .expect("try")
        .expect("read");
    let r2 = locks[1]
        .read_with(&try_once)
        .await
        .expect("try")
        .expect("read");
    assert!(locks[2].write_with(&try_once).await.expect("try").is_none());
    let nodes = children(admin, &dir).await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert!(nodes.iter().all(|node| curator_shaped(node, "-__READ__")));

    let writer = locks[2].clone();
    let writing = tokio::spawn(async move {
        let guard = writer.write_with(&AcquireOptions::forever()).await;
        (guard, Instant::now())
    });
    children_reach(admin, &dir, 3).await;
    assert!(children(admin, &dir)
        .await
        .iter()
        .any(|node| curator_shaped(node, "-__WRIT__")));
    let reader = locks[3].clone();
    let reading = tokio::spawn(async move {
        let guard = reader.read_with(&AcquireOptions::forever()).await;
        (guard, Instant::now())
    });
    children_reach(admin, &dir, 4).await;
    let seen = locks[0].occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2, "{seen:?}");
    assert_eq!(seen.waiters.len(), 2, "{seen:?}");
    assert_eq!(seen.waiters[0].kind, Some(HoldKind::Write));
    sleep(Duration::from_millis(300)).await;
    assert!(!writing.is_finished() && !reading.is_finished());
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let (writer, _) = timeout(PROMPT, writing)
        .await
        .expect("writer")
        .expect("task");
    let writer = writer.expect("write").expect("granted");
    sleep(Duration::from_millis(300)).await;
    assert!(!reading.is_finished(), "a reader beside a writer");
    let seen = locks[0].occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 1, "{seen:?}");
    writer.release().await.expect("release");
    let (reader, _) = timeout(PROMPT, reading)
        .await
        .expect("reader")
        .expect("task");
    reader
        .expect("read")
        .expect("granted")
        .release()
        .await
        .expect("release");
    children_reach(admin, &dir, 0).await;
}

/// A downgrade leaves no window: with a reader and then a writer queued behind the
/// writer, the reader is granted beside the downgraded hold at once, the writer only
/// after both are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_lets_readers_in_and_keeps_writers_out() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = fresh("rw-down");
    let dir = lock_dir(BASE, &name);
    let admin = factory.admin();
    let locks: Vec<RwLock> =
        futures::future::join_all((0..3).map(|_| async {
            RwLock::new(client(&factory).await, name.as_str()).expect("rwlock")
        }))
        .await;
    let held = locks[0].write_with(&AcquireOptions::try_once()).await;
    let held = held.expect("try").expect("write");
    let token = held.fencing_token();
    let reader = locks[1].clone();
    let reading = tokio::spawn(async move { reader.read_with(&AcquireOptions::forever()).await });
    children_reach(admin, &dir, 2).await;
    let writer = locks[2].clone();
    let writing = tokio::spawn(async move { writer.write_with(&AcquireOptions::forever()).await });
    children_reach(admin, &dir, 3).await;
    sleep(Duration::from_millis(200)).await;
    assert!(!reading.is_finished() && !writing.is_finished());

    let downgraded = held.downgrade().await.expect("downgrade");
    assert_eq!(downgraded.fencing_token(), token, "the token stays");
    let read = timeout(PROMPT, reading)
        .await
        .expect("the reader is granted beside the downgraded hold")
        .expect("task")
        .expect("read")
        .expect("granted");
    let seen = locks[0].occupancy().await.expect("inspect");
    assert_eq!(seen.holders().count(), 2, "{seen:?}");
    assert!(
        seen.holders().all(|p| p.kind == Some(HoldKind::Read)),
        "{seen:?}"
    );
    sleep(Duration::from_millis(500)).await;
    assert!(
        !writing.is_finished(),
        "a writer beside the downgraded hold"
    );
    downgraded.release().await.expect("release");
    sleep(Duration::from_millis(300)).await;
    assert!(!writing.is_finished(), "a writer beside a reader");
    read.release().await.expect("release");
    let write = timeout(PROMPT, writing)
        .await
        .expect("the writer is granted after both")
        .expect("task")
        .expect("write")
        .expect("granted");
    write.release().await.expect("release");
}

/// A break of a semaphore removes its oldest permit, whose guard is then lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_breaks_the_oldest_permit() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = fresh("sem-break");
    let (_, leases) = semaphore_dirs(&lock_dir(BASE, &name));
    let lock = client(&factory).await;
    let semaphore = Semaphore::new(Arc::clone(&lock), name.as_str(), 2).expect("semaphore");
    let first = semaphore.acquire_with(&AcquireOptions::try_once()).await;
    let first = first.expect("try").expect("permit");
    let second = semaphore.acquire_with(&AcquireOptions::try_once()).await;
    let second = second.expect("try").expect("permit");
    let operator = client(&factory).await;
    let broken = operator.force_release(&name).await.expect("break");
    let broken = broken.expect("a holder was broken");
    assert_eq!(broken.fencing_token, Some(first.fencing_token()));
    children_reach(factory.admin(), &leases, 1).await;
    let listed = operator.list(name.as_str()).await.expect("list");
    assert_eq!(listed, std::slice::from_ref(&name));
    assert!(matches!(
        first.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    second.release().await.expect("release");
}
