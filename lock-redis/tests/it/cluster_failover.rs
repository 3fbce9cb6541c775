//! Redis Cluster failovers: a primary killed while its locks are held and contended
//! (replicated holds kept, the others lost, never two valid holders), and the renewal
//! that follows a failover, batched on the promoted replica.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{DistributedLockExt, LockName, LockState};
use lock_redis::RedisLock;
use testkit::redis::{
    across_failover, cut_replicas, end_holds, key, key_on, kill_primary, name_on, raw, with_ttl,
    ClusterFactory,
};
use tokio::time::{sleep, Instant};

/// A cluster whose primaries fail over when killed, and a client of it with holds of [`TTL`].
async fn start() -> Option<(ClusterFactory, Arc<RedisLock>)> {
    let factory = ClusterFactory::start_for_failover().await?;
    let client = factory.make(with_ttl(TTL)).await;
    Some((factory, client))
}

/// Waits for the replica that takes over `name`'s slot from the killed `primary`: its
/// index.
async fn promoted(factory: &ClusterFactory, name: &LockName, primary: usize) -> usize {
    let slot = factory.cluster.slot_of(&key(name)).await.expect("slot");
    factory
        .cluster
        .wait_for_new_owner(slot, primary, FAILOVER)
        .await
        .expect("the replica is promoted")
}

/// TTL of the holds: longer than a promotion (~2.5 s) and a renewal.
const TTL: Duration = Duration::from_secs(6);

/// Bound on a replica's promotion after its primary is killed.
const FAILOVER: Duration = Duration::from_secs(30);

/// The primary serving two names is killed (SIGKILL) while one client holds both and
/// another waits for both. One hold's key had reached the replica, the other's had not
/// (its replica was paused and its link closed while it was granted). The replica is
/// promoted; the hold whose key was lost turns Lost at its next renewal and its waiter
/// takes the name with a higher fencing token; the replicated hold stays Held (its key on
/// the promoted replica, renewed there) or turns Lost, never two valid holders. Fenced
/// writes never see a token go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_replicated_holds_and_loses_the_others() {
    let Some((factory, holder)) = start().await else {
        return;
    };
    // Long enough for a replicated hold to stay Held.
    let ttl = TTL;
    let waiter = factory.make(with_ttl(ttl)).await;
    let (primary, replica) = (0, 3);
    let kept = name_on(&factory, "kept", primary).await;
    let dropped = name_on(&factory, "dropped", primary).await;

    let kept_guard = holder.lock(kept.as_str()).await.expect("acquire kept");
    let give_up = Instant::now() + Duration::from_secs(5);
    while key_on(&factory, replica, &key(&kept)).await.0.is_none() {
        assert!(Instant::now() < give_up, "kept never reached the replica");
        // A replica answers MOVED unless asked READONLY: read it through its own view.
        let mut conn = raw(factory.cluster.server(replica).addr()).await;
        let _: () = redis::cmd("READONLY")
            .query_async(&mut conn)
            .await
            .expect("READONLY");
        let seen: Option<String> = redis::cmd("GET")
            .arg(key(&kept))
            .query_async(&mut conn)
            .await
            .expect("GET on the replica");
        if seen.is_some() {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    factory
        .cluster
        .server(replica)
        .pause()
        .expect("pause the replica");
    cut_replicas(factory.cluster.server(primary).addr()).await;
    let dropped_guard = holder
        .lock(dropped.as_str())
        .await
        .expect("acquire dropped");
    let (kept_token, dropped_token) = (kept_guard.fencing_token(), dropped_guard.fencing_token());

    let mut run = across_failover(
        &waiter,
        (kept_guard, dropped_guard),
        (&kept, &dropped),
        Duration::from_secs(10),
        FAILOVER * 2,
    )
    .await;

    kill_primary(factory.cluster.server(primary)).await;
    let killed = Instant::now();
    factory
        .cluster
        .server(replica)
        .resume()
        .expect("resume the replica");
    let promoted = promoted(&factory, &dropped, primary).await;
    assert_eq!(promoted, replica);
    let promotion = killed.elapsed();

    let (reason, lost_at, dropped_next) = run.dropped_lost(ttl * 2, FAILOVER).await;
    let lost_after = lost_at - killed;
    assert!(
        dropped_next.fencing_token() > dropped_token,
        "tokens never go back"
    );

    let mut kept_state = run.kept_watch.state();
    if kept_state != LockState::Held && !kept_state.is_lost() {
        sleep(ttl / 2).await;
        kept_state = run.kept_watch.state();
    }
    let (owner, pttl) = key_on(&factory, promoted, &key(&kept)).await;
    println!(
        "cluster failover: replica promoted {promotion:?} after the kill; the unreplicated \
         hold lost ({reason:?}) after {lost_after:?}; the replicated hold is {kept_state:?} \
         (key on the promoted replica: {}, PTTL {pttl} ms)",
        owner.is_some()
    );
    let kept_next = end_holds(&mut run, kept_state, owner, kept_token, FAILOVER).await;
    for (what, fence) in [("kept", &run.kept_fence), ("dropped", &run.dropped_fence)] {
        let report = fence.check();
        assert!(report.tokens_backwards.is_empty(), "{what}: {report:?}");
    }
    assert!(run.kept_fence.check().is_safe());
    drop((kept_next, dropped_next));
}

/// 300 holds of one client on one primary, which is killed: once its replica is promoted,
/// the renewal round that finds the old primary dead reloads the slot map once and renews
/// the holds on the promoted replica in one batch (`INFO commandstats` there), not with
/// one call per hold; every hold stays Held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_after_a_failover_is_batched_on_the_new_primary() {
    let Some((factory, client)) = start().await else {
        return;
    };
    let (primary, replica, ttl) = (0, 3, TTL);
    let mut names = Vec::new();
    for _ in 0..300 {
        names.push(name_on(&factory, "batched", primary).await);
    }
    let guards = join_all(names.iter().map(|lock| client.lock(lock.as_str()))).await;
    let guards: Vec<_> = guards.into_iter().map(|g| g.expect("hold")).collect();
    let mut primary_conn = raw(factory.cluster.server(primary).addr()).await;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut primary_conn)
        .await
        .expect("WAIT");
    assert_eq!(acked, 1, "every key reached the replica");
    let before = factory.cluster.command_calls(replica, "evalsha").await;
    kill_primary(factory.cluster.server(primary)).await;
    let promoted = promoted(&factory, &names[0], primary).await;
    assert_eq!(promoted, replica);
    let give_up = Instant::now() + ttl;
    while !guards.iter().all(|g| g.state() == LockState::Held) {
        assert!(Instant::now() < give_up, "every hold is renewed again");
        sleep(Duration::from_millis(20)).await;
    }
    // One more interval: the round after is a batch as well.
    sleep(ttl / 3).await;
    let calls = factory.cluster.command_calls(replica, "evalsha").await - before;
    println!("renewal of 300 holds after a failover: {calls} script calls on the promoted replica");
    assert!(
        calls <= 8,
        "one batch per round, not one call per hold: {calls}"
    );
    assert!(guards.iter().all(|g| g.state() == LockState::Held));
    join_all(guards.into_iter().map(|g| g.release())).await;
}
