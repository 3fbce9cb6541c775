//! A 3-member cluster under failure: the leader dies while a lock is held; a majority
//! dies; an election's leader is partitioned away.

use std::sync::Arc;
use std::time::Duration;

use conformance::Factory;
use harness::EtcdCluster;
use lab::chaos::ChaosTarget;
use lock_core::{
    AcquireOptions, DistributedLockExt, Election, ErrorKind, LockState, LostReason, ReleaseOutcome,
};
use lock_etcd::EtcdLock;
use testkit::etcd::{client, cluster, raw_client, trace, with_ttl, EtcdFactory};
use tokio::time::{sleep, timeout, Instant};

/// A 3-member cluster and two clients of it with lease `ttl`; `None` when etcd is missing.
async fn two_clients(ttl: Duration) -> Option<(EtcdCluster, Arc<EtcdLock>, Arc<EtcdLock>)> {
    trace();
    let cluster = cluster().await?;
    let addrs: Vec<_> = cluster.members().iter().map(|m| m.addr()).collect();
    let first = client(&addrs, with_ttl(ttl)).await;
    let second = client(&addrs, with_ttl(ttl)).await;
    Some((cluster, first, second))
}

/// Moves leadership to member 0 (the first endpoint of every client); returns 0.
async fn lead_with_first_member(cluster: &EtcdCluster) -> usize {
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("a leader");
    if leader == 0 {
        return 0;
    }
    let target = cluster.member(0).status().await.expect("status").member_id;
    raw_client(&[cluster.member(leader).addr()])
        .await
        .move_leader(target)
        .await
        .expect("move leadership to member 0");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.leader().await.ok() != Some(0) {
        assert!(Instant::now() < deadline, "member 0 never became leader");
        sleep(Duration::from_millis(50)).await;
    }
    0
}

/// Killing the leader while a lock is held keeps the lock: the lease survives the
/// election, the guard never turns Lost, and no other client acquires it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_the_lock() {
    // Generous against a slow election on a loaded machine: the hold must survive as
    // long as a leader is back within two thirds of the TTL.
    let ttl = Duration::from_secs(5);
    let Some((cluster, holder, other)) = two_clients(ttl).await else {
        return;
    };
    let guard = holder.lock("leader-kill").await.expect("acquire");
    let token = guard.fencing_token();

    // The hard case: the leader is the member every client talks to first, so the
    // clients must fail over as well as ride out the election.
    let leader = lead_with_first_member(&cluster).await;
    cluster
        .member(leader)
        .kill9()
        .await
        .expect("kill -9 the leader");
    let killed_at = Instant::now();
    let new_leader = cluster
        .wait_for_new_leader(leader, Duration::from_secs(15))
        .await
        .expect("a new leader is elected");
    eprintln!(
        "leader m{} killed; m{} elected after {:?}",
        leader + 1,
        new_leader + 1,
        killed_at.elapsed()
    );

    // Two TTLs through and after the election: the holder keeps its lock, nobody else
    // gets it (errors while the cluster elects are fine; a grant is not).
    let mut tries = 0;
    let mut refused = 0;
    while killed_at.elapsed() < ttl * 2 {
        assert!(
            !guard.state().is_lost(),
            "the hold was lost across the election: {:?} ({:?} after the kill, {refused} \
             tries refused)",
            guard.state(),
            killed_at.elapsed()
        );
        tries += 1;
        match timeout(Duration::from_secs(2), other.try_lock("leader-kill")).await {
            Ok(Ok(Some(_))) => panic!("a second holder appeared after the leader was killed"),
            Ok(Ok(None)) => refused += 1,
            Ok(Err(err)) => eprintln!("try during the election: {err}"),
            Err(_) => eprintln!("try during the election timed out"),
        }
        sleep(Duration::from_millis(200)).await;
    }
    assert!(
        refused > 0,
        "no try was answered in {tries} tries after the election"
    );
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.valid_until() > Instant::now());
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = other
        .try_lock("leader-kill")
        .await
        .expect("try after release")
        .expect("free after release");
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
}

/// With two of three members dead there is no quorum: acquires fail with an
/// unavailable (or timeout) error, and never grant a lock that another client holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_loss_is_unavailable_never_a_double_grant() {
    let ttl = Duration::from_secs(2);
    let Some((cluster, holder, other)) = two_clients(ttl).await else {
        return;
    };
    let guard = holder.lock("majority").await.expect("acquire");

    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("a leader");
    // Kill the leader and one follower: the survivor is a follower without a quorum.
    let follower = (0..3).find(|i| *i != leader).expect("a follower");
    cluster
        .member(leader)
        .kill9()
        .await
        .expect("kill the leader");
    cluster
        .member(follower)
        .kill9()
        .await
        .expect("kill a follower");
    let killed_at = Instant::now();

    let mut kinds = Vec::new();
    for name in ["majority", "majority-free"] {
        let started = Instant::now();
        let outcome = other.lock_timeout(name, Duration::from_secs(3)).await;
        let err = match outcome {
            Ok(_) => panic!("`{name}` was granted without a quorum"),
            Err(err) => err,
        };
        eprintln!(
            "acquire `{name}` without quorum after {:?}: {err}",
            started.elapsed()
        );
        assert!(
            matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "`{name}`: expected unavailable or timeout, got {err}"
        );
        assert!(err.is_retryable());
        kinds.push(err.kind());
    }
    let err = other
        .try_lock("majority-free")
        .await
        .expect_err("a try without quorum fails");
    eprintln!("try without quorum: {err}");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "try: expected unavailable or timeout, got {err}"
    );
    // The holder cannot renew without a quorum either: its guard stops claiming the lock
    // by its own deadline.
    timeout(ttl + Duration::from_secs(5), async {
        while guard.state() == LockState::Held {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the holder turns Suspect or Lost without a quorum");
    eprintln!(
        "holder state {:?} {:?} after the majority died; acquire errors {kinds:?}",
        guard.state(),
        killed_at.elapsed()
    );
    drop(guard);
}

/// A waiter queued while the leader dies rides out the election: it keeps its place
/// and its lease, and takes over when the holder releases under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_leader_election() {
    let ttl = Duration::from_secs(5);
    let Some((cluster, holder, waiter)) = two_clients(ttl).await else {
        return;
    };
    let guard = holder.lock("election-wait").await.expect("acquire");
    let token = guard.fencing_token();
    let waiting = tokio::spawn(async move {
        waiter
            .lock_timeout("election-wait", Duration::from_secs(30))
            .await
    });
    sleep(Duration::from_millis(300)).await;
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("a leader");
    cluster
        .member(leader)
        .kill9()
        .await
        .expect("kill -9 the leader");
    cluster
        .wait_for_new_leader(leader, Duration::from_secs(15))
        .await
        .expect("a new leader is elected");
    sleep(ttl).await;
    assert!(
        !waiting.is_finished(),
        "the waiter keeps waiting across the election"
    );
    assert!(
        guard.is_held(),
        "the holder keeps its lock across the election"
    );
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter takes over promptly")
        .expect("task")
        .expect("the waiter acquires after the election");
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
}

/// An election's leader partitioned from the cluster (its link blackholed) turns Lost
/// before the waiting candidate leads, which happens once the leader's lease expires;
/// an observer never reports an older term after a newer one, also after the partition
/// heals; the old leader's proclaim then fails with Lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_leader_turns_lost_before_the_next_leads() {
    trace();
    let ttl = Duration::from_secs(2);
    let Some(factory) = EtcdFactory::start_cluster().await else {
        return;
    };
    let name = format!("election-partition-{}", uuid::Uuid::new_v4().simple());
    let (cut_off, link) = factory.linked_client(with_ttl(ttl)).await;
    let other = factory.client(with_ttl(ttl)).await;
    let watcher = factory.client(with_ttl(ttl)).await;
    let on_cut_off = Election::new(cut_off, &name).expect("election");
    let on_other = Election::new(other, &name).expect("election");
    let mut observer = Election::new(watcher, &name).expect("election").observe();
    let observed = tokio::spawn(async move {
        let mut terms = Vec::new();
        // Until the second leader is seen, or a generous bound.
        let deadline = Instant::now() + Duration::from_secs(30);
        while terms.len() < 2 && Instant::now() < deadline {
            if let Ok(change) = timeout(Duration::from_secs(1), observer.next()).await {
                if let Some(leader) = change.expect("observe") {
                    terms.push(leader.term);
                }
            }
        }
        (terms, observer)
    });

    let mut first = on_cut_off
        .campaign_with("partitioned", &AcquireOptions::forever())
        .await
        .expect("campaign")
        .expect("leads");
    let mut watch = first.watch();
    let lost_at = tokio::spawn(async move {
        let reason = watch.lost().await;
        (reason, Instant::now())
    });
    let waiting = tokio::spawn(async move {
        let leadership = on_other
            .campaign_with(
                "successor",
                &AcquireOptions::timeout(Duration::from_secs(30)),
            )
            .await
            .expect("campaign")
            .expect("leads after the partitioned leader's lease expires");
        (leadership, Instant::now())
    });
    sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the successor waits for the leader");

    link.cut();
    let cut_at = Instant::now();
    let (second, led_at) = timeout(ttl * 4 + Duration::from_secs(10), waiting)
        .await
        .expect("the successor leads within a few TTLs")
        .expect("campaign task");
    let (reason, lost_at) = timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("the partitioned leader turns Lost")
        .expect("watch task");
    eprintln!(
        "partitioned leader Lost ({reason:?}) {:?} after the cut; successor led {:?} after it",
        lost_at - cut_at,
        led_at - cut_at
    );
    assert!(
        lost_at <= led_at,
        "the partitioned leader turned Lost {:?} after its successor led",
        lost_at - led_at
    );
    assert!(
        matches!(
            reason.without_side(),
            LostReason::Expired | LostReason::SessionExpired
        ),
        "unexpected reason {reason:?}"
    );
    assert!(
        second.term() > first.term(),
        "terms increase across leaders"
    );
    assert!(!first.is_leader());

    let (terms, mut observer) = observed.await.expect("observer task");
    assert_eq!(
        terms,
        vec![first.term(), second.term()],
        "the observer sees both leaders, in order"
    );
    // Healed: the old leader's client is back, but its lease is gone and so is its key;
    // no reader ever goes back to its term.
    link.heal();
    let proclaimed = first.proclaim("still here?").await;
    assert!(
        matches!(proclaimed, Err(lock_core::Error::Lost { .. })),
        "a partitioned leader's proclaim must fail with Lost, got {proclaimed:?}"
    );
    if let Ok(change) = timeout(Duration::from_secs(2), observer.next()).await {
        let change = change.expect("observe");
        assert!(
            change.is_none_or(|leader| leader.term >= second.term()),
            "the observer went back to an older term"
        );
    }
    drop(first);
    second.resign().await.expect("resign");
}
