//! Redis Cluster (`redis+cluster://`): the whole conformance suite on three primaries
//! with a replica each, and what the suite cannot show: holds and waiters across shards,
//! a failover while locks are held and contended, a slot moving while a lock is held and
//! contended, renewal cost per shard, replica-acknowledged grants, and bad seeds.

mod common;

/// The conformance suite on a cluster of its own per test.
mod suite {
    conformance::conformance_suite!(async { crate::common::ClusterFactory::start().await });
}

use std::sync::Arc;
use std::time::Duration;

use common::{
    end_holds, fenced_waiter, hold_sections, raw, unique_name as name, with_ttl, ClusterFactory,
};
use conformance::{lock_patiently, Factory, FencedResource};
use futures::future::join_all;
use lab::harness::RedisServer;
use lock_core::{DistributedLockExt, ErrorKind, LockName, LockState, ReleaseOutcome};
use lock_redis::{KeyLayout, RedisLock, DEFAULT_PREFIX};
use tokio::time::{sleep, timeout, Instant};

/// Bound on a replica's promotion after its primary is killed.
const FAILOVER: Duration = Duration::from_secs(30);

/// The lock key of `name`.
fn key(name: &LockName) -> String {
    KeyLayout::new(DEFAULT_PREFIX).lock_key(name)
}

/// A fresh name for `test` whose lock key server `owner` serves.
async fn name_on(factory: &ClusterFactory, test: &str, owner: usize) -> LockName {
    for _ in 0..1000 {
        let candidate = name(test);
        if factory
            .cluster
            .owner_of_key(&key(&candidate))
            .await
            .expect("owner")
            == owner
        {
            return candidate;
        }
    }
    panic!("no name of server {owner} in 1000 tries");
}

/// `key`'s value and PTTL on server `i` (`None` when it is not there).
async fn key_on(factory: &ClusterFactory, i: usize, key: &str) -> (Option<String>, i64) {
    let mut conn = raw(factory.cluster.server(i).addr()).await;
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    // A node that does not serve the key answers MOVED: then it is not there.
    pipe.query_async(&mut conn).await.unwrap_or((None, -2))
}

/// The sharded channels of `name` (its wake-up channels, `<prefix>{<lock key>}:*`) that
/// server `i` has subscribers for.
async fn shard_channels(factory: &ClusterFactory, i: usize, name: &LockName) -> Vec<String> {
    let mut conn = raw(factory.cluster.server(i).addr()).await;
    redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(format!("{DEFAULT_PREFIX}{{{}}}:*", key(name)))
        .query_async(&mut conn)
        .await
        .expect("PUBSUB SHARDCHANNELS")
}

/// Polls until server `i` has `want` sharded channels of `name` subscribed, for at most
/// 2 s: how long it took.
async fn await_shard_channels(
    factory: &ClusterFactory,
    i: usize,
    name: &LockName,
    want: usize,
) -> Duration {
    let started = Instant::now();
    loop {
        let seen = shard_channels(factory, i, name).await;
        if seen.len() == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "server {i}: sharded channels of {name}: {seen:?}, want {want}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// One client holds a name on each of the three primaries while another waits for all
/// three; each release wakes the waiter of that name on its own shard, well before the
/// waiter's recheck would (push, not polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_and_waiters_across_shards() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(5));
    options.recheck = Duration::from_secs(10);
    let holder = factory.make(options.clone()).await;
    let waiter = factory.make(options).await;
    let mut names = Vec::new();
    for owner in 0..3 {
        names.push(name_on(&factory, "shards", owner).await);
    }
    let mut guards = Vec::new();
    for lock in &names {
        guards.push(holder.lock(lock.as_str()).await.expect("hold"));
    }
    let waiting: Vec<_> = names
        .iter()
        .map(|lock| {
            let waiter = Arc::clone(&waiter);
            let lock = lock.clone();
            tokio::spawn(async move {
                let guard = waiter
                    .lock_timeout(lock.as_str(), Duration::from_secs(20))
                    .await
                    .expect("granted after the release");
                (guard, Instant::now())
            })
        })
        .collect();
    // Each waiter listens on the shard of its name (a sharded channel), nowhere else.
    for (owner, lock) in names.iter().enumerate() {
        await_shard_channels(&factory, owner, lock, 1).await;
        for other in (0..3).filter(|o| *o != owner) {
            assert!(shard_channels(&factory, other, lock).await.is_empty());
        }
        let mut conn = raw(factory.cluster.server(owner).addr()).await;
        let plain: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut conn)
            .await
            .expect("PUBSUB CHANNELS");
        assert!(plain.is_empty(), "no cluster-wide channel: {plain:?}");
    }
    let mut latencies = Vec::new();
    for ((guard, waiting), lock) in guards.into_iter().zip(waiting).zip(&names) {
        let token = guard.fencing_token();
        let released = Instant::now();
        guard.release().await.expect("release");
        let (next, granted) = timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter is woken, not left to its 10 s recheck")
            .expect("waiter task");
        assert!(next.fencing_token() > token, "{lock}");
        latencies.push(granted - released);
        next.release().await.expect("release");
    }
    println!("wake-up latency per shard (release sent -> next holder has it): {latencies:?}");
    assert!(
        latencies.iter().all(|l| *l < Duration::from_secs(2)),
        "{latencies:?}"
    );
    assert!(factory.leftovers(&names).await.is_empty());
}

/// The primary serving two names is killed (SIGKILL) while one client holds both and
/// another waits for both. One hold's key had reached the replica, the other's had not
/// (its replica was paused and its link closed while it was granted). The replica is
/// promoted; the hold whose key was lost turns Lost at its next renewal and its waiter
/// takes the name with a higher fencing token; the replicated hold stays Held (its key on
/// the promoted replica, renewed there) or turns Lost, never two valid holders. Fenced
/// writes never see a token go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_replicated_holds_and_loses_the_others() {
    let Some(factory) = ClusterFactory::start_for_failover().await else {
        return;
    };
    // Longer than a promotion (~2.5 s) and a renewal: a replicated hold can stay Held.
    let ttl = Duration::from_secs(6);
    let holder = factory.make(with_ttl(ttl)).await;
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
    let mut primary_conn = raw(factory.cluster.server(primary).addr()).await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut primary_conn)
        .await
        .expect("CLIENT KILL TYPE replica");
    let dropped_guard = holder
        .lock(dropped.as_str())
        .await
        .expect("acquire dropped");
    let (kept_token, dropped_token) = (kept_guard.fencing_token(), dropped_guard.fencing_token());

    let (kept_fence, dropped_fence) = (FencedResource::new(), FencedResource::new());
    let kept_watch = kept_guard.watch();
    let mut dropped_watch = dropped_guard.watch();
    let holding = hold_sections(
        (kept_guard, dropped_guard),
        (kept_fence.clone(), dropped_fence.clone()),
        Duration::from_secs(10),
    );
    let kept_waiter = fenced_waiter(&waiter, &kept, &kept_fence, FAILOVER * 2);
    let dropped_waiter = fenced_waiter(&waiter, &dropped, &dropped_fence, FAILOVER * 2);
    sleep(Duration::from_millis(300)).await;

    factory
        .cluster
        .server(primary)
        .kill9()
        .await
        .expect("kill the primary");
    let killed = Instant::now();
    factory
        .cluster
        .server(replica)
        .resume()
        .expect("resume the replica");
    let slot = factory.cluster.slot_of(&key(&dropped)).await.expect("slot");
    let promoted = factory
        .cluster
        .wait_for_new_owner(slot, primary, FAILOVER)
        .await
        .expect("the replica is promoted");
    assert_eq!(promoted, replica);
    let promotion = killed.elapsed();

    let reason = timeout(ttl * 2, dropped_watch.lost())
        .await
        .expect("the hold of a lost key turns Lost by its next renewal");
    let lost_after = killed.elapsed();
    let dropped_next = timeout(FAILOVER, dropped_waiter)
        .await
        .expect("the waiter of the lost key is granted")
        .expect("waiter task");
    assert!(
        dropped_next.fencing_token() > dropped_token,
        "tokens never go back"
    );

    let mut kept_state = kept_watch.state();
    if kept_state != LockState::Held && !kept_state.is_lost() {
        sleep(ttl / 2).await;
        kept_state = kept_watch.state();
    }
    let (owner, pttl) = key_on(&factory, promoted, &key(&kept)).await;
    println!(
        "cluster failover: replica promoted {promotion:?} after the kill; the unreplicated \
         hold lost ({reason:?}) after {lost_after:?}; the replicated hold is {kept_state:?} \
         (key on the promoted replica: {}, PTTL {pttl} ms)",
        owner.is_some()
    );
    let kept_next = end_holds(
        holding,
        kept_state,
        owner,
        kept_waiter,
        kept_token,
        FAILOVER,
    )
    .await;
    for (what, fence) in [("kept", &kept_fence), ("dropped", &dropped_fence)] {
        let report = fence.check();
        assert!(report.tokens_backwards.is_empty(), "{what}: {report:?}");
    }
    assert!(kept_fence.check().is_safe());
    drop((kept_next, dropped_next));
}

/// A held and contended name's slot moves to another primary. Half-way (its keys on the
/// new primary, the slot still the old one's) each renewal round's batch to the old
/// primary answers "elsewhere" for the hold, which is sent again alone: `ASK`, then
/// `ASKING` and the renewal on the new primary (counted there; the waiter sends nothing
/// meanwhile). Once the move is complete, renewals follow `MOVED`. After the release the
/// waiter is woken and granted on the new primary; nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moves_while_held_and_contended() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let ttl = Duration::from_millis(1500);
    let holder = factory.make(with_ttl(ttl)).await;
    // Woken by the release, not by its recheck.
    let mut waiter_options = with_ttl(ttl);
    waiter_options.recheck = Duration::from_secs(10);
    let waiter = factory.make(waiter_options).await;
    let lock = name_on(&factory, "moving", 0).await;
    let lock_key = key(&lock);
    let guard = holder.lock(lock.as_str()).await.expect("hold");
    let token = guard.fencing_token();
    let waiting = {
        let (waiter, lock) = (Arc::clone(&waiter), lock.clone());
        tokio::spawn(async move {
            let guard = lock_patiently(&*waiter, &lock, Duration::from_secs(30)).await;
            (guard, Instant::now())
        })
    };
    await_shard_channels(&factory, 0, &lock, 1).await;

    let slot = factory.cluster.slot_of(&lock_key).await.expect("slot");
    let moving = factory
        .cluster
        .begin_move(slot, 1)
        .await
        .expect("begin the move");
    let moved = factory
        .cluster
        .move_keys(&moving)
        .await
        .expect("move the keys");
    assert!(
        moved >= 2,
        "the lock key and its fencing counter move: {moved}"
    );
    // Half-way: two renewals must reach the key on the new primary, through ASK.
    let asked = asking_calls(&factory, 1).await;
    sleep(ttl).await;
    assert_eq!(guard.state(), LockState::Held, "renewed through ASK");
    let asked = asking_calls(&factory, 1).await - asked;
    assert!(
        asked >= 2,
        "renewals sent ASKING to the new primary: {asked}"
    );
    let (owner, pttl) = {
        let mut conn = raw(factory.cluster.server(1).addr()).await;
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").ignore().cmd("GET").arg(&lock_key);
        pipe.cmd("ASKING").ignore().cmd("PTTL").arg(&lock_key);
        let seen: (Option<String>, i64) = pipe.query_async(&mut conn).await.expect("ASKING GET");
        seen
    };
    assert_eq!(owner.as_deref(), Some(guard.owner_token().as_str()));
    let half_way_pttl = pttl;
    assert!(
        u64::try_from(pttl).expect("a lease") > u64::try_from(ttl.as_millis()).expect("ms") / 2,
        "renewed on the new primary: PTTL {pttl}"
    );

    factory
        .cluster
        .finish_move(&moving)
        .await
        .expect("finish the move");
    // The old primary ends the waiter's subscription; it is made again on the new one.
    let resubscribed = await_shard_channels(&factory, 1, &lock, 1).await;
    assert!(shard_channels(&factory, 0, &lock).await.is_empty());
    sleep(ttl).await;
    assert_eq!(guard.state(), LockState::Held, "renewed after MOVED");
    let (_, pttl) = key_on(&factory, 1, &lock_key).await;
    assert!(pttl > 0, "the key lives on the new primary: PTTL {pttl}");

    let released = Instant::now();
    guard.release().await.expect("release on the new primary");
    let (next, granted) = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted after the release")
        .expect("waiter task");
    assert!(next.fencing_token() > token, "tokens never go back");
    assert!(
        granted - released < Duration::from_secs(2),
        "woken, not rechecked"
    );
    println!(
        "slot move: renewed through ASK ({asked} ASKING, PTTL {half_way_pttl} ms on the new \
         primary) and after MOVED; the waiter's channel subscribed on the new primary {resubscribed:?} \
         after the move; the waiter granted {:?} after the release",
        granted - released
    );
    next.release().await.expect("release");
    assert!(factory
        .leftovers(std::slice::from_ref(&lock))
        .await
        .is_empty());
    let (left, _) = key_on(&factory, 0, &lock_key).await;
    assert!(left.is_none(), "nothing on the old primary");
    await_shard_channels(&factory, 1, &lock, 0).await;
}

/// `ASKING` calls on server `i` (`INFO commandstats`).
async fn asking_calls(factory: &ClusterFactory, i: usize) -> u64 {
    factory.cluster.command_calls(i, "asking").await
}

/// Half-way through a slot move (every key on the new primary, the slot still the old
/// one's), a renewal, an acquire of the held, contended name by another client and the
/// release each reach the new primary through `ASK` (each sends `ASKING` there, counted
/// with nothing else running) and act on the keys there: the lease extended, the name
/// busy, the key gone. The waiter is granted once the move is complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_keys_that_went_ahead_follow_ask() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    // No automatic renewal within the test: only the requests made here send ASKING.
    let ttl = Duration::from_secs(30);
    let holder = factory.make(with_ttl(ttl)).await;
    let other = factory.make(with_ttl(ttl)).await;
    let lock = name_on(&factory, "asked", 0).await;
    let lock_key = key(&lock);
    let guard = holder.lock(lock.as_str()).await.expect("hold");
    // Queued (its recheck after the test): the acquire script's keys all exist.
    let mut waiter_options = with_ttl(ttl);
    waiter_options.recheck = Duration::from_secs(60);
    let waiter = factory.make(waiter_options).await;
    let waiting = {
        let (waiter, lock) = (Arc::clone(&waiter), lock.clone());
        tokio::spawn(async move { lock_patiently(&*waiter, &lock, Duration::from_secs(30)).await })
    };
    await_shard_channels(&factory, 0, &lock, 1).await;
    let slot = factory.cluster.slot_of(&lock_key).await.expect("slot");
    let moving = factory.cluster.begin_move(slot, 1).await.expect("begin");
    factory
        .cluster
        .move_keys(&moving)
        .await
        .expect("move the keys");
    let asked_on_target = |pttl_of: bool| {
        let lock_key = lock_key.clone();
        let addr = factory.cluster.server(1).addr();
        async move {
            let mut conn = raw(addr).await;
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING")
                .ignore()
                .cmd(if pttl_of { "PTTL" } else { "EXISTS" });
            pipe.arg(&lock_key);
            let (seen,): (i64,) = pipe.query_async(&mut conn).await.expect("ASKING");
            seen
        }
    };

    let before = asking_calls(&factory, 1).await;
    let longer = ttl * 2;
    guard.extend_for(longer).await.expect("renewed through ASK");
    let renewal = asking_calls(&factory, 1).await - before;
    let pttl = asked_on_target(true).await;
    assert!(
        u128::try_from(pttl).expect("a lease") > ttl.as_millis(),
        "the lease on the new primary is extended: PTTL {pttl}"
    );

    let before = asking_calls(&factory, 1).await;
    let busy = other.try_lock(lock.as_str()).await;
    assert!(matches!(busy, Ok(None)), "held: {busy:?}");
    let acquire = asking_calls(&factory, 1).await - before;

    let before = asking_calls(&factory, 1).await;
    guard.release().await.expect("released through ASK");
    let release = asking_calls(&factory, 1).await - before;
    assert_eq!(asked_on_target(false).await, 0, "the key is gone");
    println!(
        "half-way through a slot move: ASKING on the new primary per request: renewal \
         {renewal}, acquire of the held name {acquire}, release {release}"
    );
    for (what, asked) in [
        ("renewal", renewal),
        ("acquire", acquire),
        ("release", release),
    ] {
        assert!(asked >= 1, "the {what} went through ASK");
    }
    factory.cluster.finish_move(&moving).await.expect("finish");
    let next = timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter is granted after the move")
        .expect("waiter task");
    next.release().await.expect("release");
    assert!(factory
        .leftovers(std::slice::from_ref(&lock))
        .await
        .is_empty());
}

/// A held and contended name is released and asked for while its slot is being migrated:
/// once before any key moved (the source serves it) and once after all its keys moved
/// (ASK to the target), and uncontended before any key moved (the queue's release then
/// falls back to the lock key's). Each release answers at once (not after the migration
/// ends), each try-lock of the still held, contended name answers promptly, and the next
/// holder is granted once the move is complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_in_a_migrating_slot_answer_at_once() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(3);
    let holder = factory.make(with_ttl(ttl)).await;
    let other = factory.make(with_ttl(ttl)).await;
    let waiter = factory.make(with_ttl(ttl)).await;
    // Uncontended, the queue's keys are missing: its release falls back to the lock key's.
    for (phase, keys_moved, contended) in [
        ("before the keys move", false, true),
        ("after", true, true),
        ("uncontended, before the keys move", false, false),
    ] {
        let lock = name_on(&factory, "migrating", 0).await;
        let guard = holder.lock(lock.as_str()).await.expect("hold");
        let token = guard.fencing_token();
        let waiting = contended.then(|| {
            let (waiter, lock) = (Arc::clone(&waiter), lock.clone());
            tokio::spawn(
                async move { lock_patiently(&*waiter, &lock, Duration::from_secs(30)).await },
            )
        });
        if contended {
            await_shard_channels(&factory, 0, &lock, 1).await;
        }
        let slot = factory.cluster.slot_of(&key(&lock)).await.expect("slot");
        let moving = factory.cluster.begin_move(slot, 1).await.expect("begin");
        if keys_moved {
            factory
                .cluster
                .move_keys(&moving)
                .await
                .expect("move the keys");
        }
        let started = Instant::now();
        if contended {
            let busy = timeout(Duration::from_secs(2), other.try_lock(lock.as_str()))
                .await
                .unwrap_or_else(|_| panic!("{phase}: a try-lock of a held name answers"));
            assert!(
                matches!(busy, Ok(None)),
                "{phase}: held elsewhere: {busy:?}"
            );
        }
        timeout(Duration::from_secs(2), guard.release())
            .await
            .unwrap_or_else(|_| panic!("{phase}: the release answers within 2 s"))
            .unwrap_or_else(|err| panic!("{phase}: released: {err}"));
        let took = started.elapsed();
        if !keys_moved {
            factory
                .cluster
                .move_keys(&moving)
                .await
                .expect("move the keys");
        }
        factory
            .cluster
            .finish_move(&moving)
            .await
            .expect("finish the move");
        let next = match waiting {
            Some(waiting) => timeout(Duration::from_secs(15), waiting)
                .await
                .expect("the waiter is granted after the move")
                .expect("waiter task"),
            None => other
                .try_lock(lock.as_str())
                .await
                .expect("granted after the move")
                .expect("free"),
        };
        assert!(
            next.fencing_token() > token,
            "{phase}: tokens never go back"
        );
        println!("migrating slot, {phase}: try-lock and release took {took:?}");
        next.release().await.expect("release");
        assert!(factory
            .leftovers(std::slice::from_ref(&lock))
            .await
            .is_empty());
    }
}

/// Runs ACL command `args` on every node (each node keeps its users alone).
async fn acl_on_every_node(factory: &ClusterFactory, args: &[&str]) {
    for server in factory.cluster.servers() {
        let mut conn = raw(server.addr()).await;
        let _: redis::Value = redis::cmd(args[0])
            .arg(&args[1..])
            .query_async(&mut conn)
            .await
            .expect("ACL command");
    }
}

/// A waiter whose sharded subscription is refused (its ACL user may use no channel) is
/// subscribed once it may: the refusal is tried again after a pause, not forgotten, and
/// the release then wakes it well before its 10 s recheck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_tried_again() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let deaf = [
        "ACL",
        "SETUSER",
        "deaf",
        "on",
        ">secret",
        "~*",
        "resetchannels",
        "+@all",
    ];
    acl_on_every_node(&factory, &deaf).await;
    let ttl = Duration::from_secs(3);
    let holder = factory.make(with_ttl(ttl)).await;
    let mut options = with_ttl(ttl);
    options.recheck = Duration::from_secs(10);
    let mut config = factory.config(options);
    config.username = Some("deaf".to_owned());
    config.password = Some("secret".to_owned());
    let waiter = factory.make_with(config).await;
    let lock = name_on(&factory, "refused", 0).await;
    let guard = holder.lock(lock.as_str()).await.expect("hold");
    let waiting = {
        let (waiter, lock) = (Arc::clone(&waiter), lock.clone());
        tokio::spawn(async move {
            let guard = lock_patiently(&*waiter, &lock, Duration::from_secs(30)).await;
            (guard, Instant::now())
        })
    };
    sleep(Duration::from_millis(500)).await;
    assert!(
        shard_channels(&factory, 0, &lock).await.is_empty(),
        "refused"
    );
    acl_on_every_node(&factory, &["ACL", "SETUSER", "deaf", "&*"]).await;
    let retried = await_shard_channels(&factory, 0, &lock, 1).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    let (next, granted) = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is granted")
        .expect("waiter task");
    println!(
        "refused subscription: subscribed {retried:?} after the permission; granted {:?} \
         after the release",
        granted - released
    );
    assert!(
        granted - released < Duration::from_secs(2),
        "woken, not rechecked"
    );
    next.release().await.expect("release");
}

/// An acquire of a free name whose slot is migrating (no key moved: the source answers
/// `ASK`, the target `TRYAGAIN` after `ASKING`) is retried until the request deadline,
/// not given up after a number of redirections, and fails with a retryable
/// `Unavailable` naming the slot; once the move ends it is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_in_a_migrating_slot_waits_for_its_deadline() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(3));
    options.request_timeout = Duration::from_secs(2);
    let client = factory.make(options).await;
    let lock = name_on(&factory, "importing", 0).await;
    let slot = factory.cluster.slot_of(&key(&lock)).await.expect("slot");
    let moving = factory.cluster.begin_move(slot, 1).await.expect("begin");
    let started = Instant::now();
    let err = client
        .try_lock(lock.as_str())
        .await
        .expect_err("refused while the slot migrates");
    let took = started.elapsed();
    println!("acquire in a migrating slot: {err} after {took:?}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        err.to_string()
            .contains(&format!("hash slot {slot} is being migrated")),
        "{err}"
    );
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(4),
        "retried until the deadline: {took:?}"
    );
    factory.cluster.finish_move(&moving).await.expect("finish");
    let guard = client
        .try_lock(lock.as_str())
        .await
        .expect("granted after the move")
        .expect("free");
    guard.release().await.expect("release");
    assert!(factory
        .leftovers(std::slice::from_ref(&lock))
        .await
        .is_empty());
}

/// 1,000 holds of one client spread over the three primaries are renewed with one script
/// call per primary per renewal interval (`INFO commandstats` on each primary), not one
/// per hold or per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_costs_one_call_per_shard_per_interval() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    // Renewal every second: a busy machine delays a call, not an interval's worth.
    let ttl = Duration::from_secs(3);
    let client: Arc<RedisLock> = factory.make(with_ttl(ttl)).await;
    let names: Vec<LockName> = (0..1000).map(|_| name("renewal")).collect();
    let guards = join_all(names.iter().map(|lock| client.lock(lock.as_str()))).await;
    let guards: Vec<_> = guards.into_iter().map(|g| g.expect("hold")).collect();
    let calls = || async {
        let mut calls = Vec::new();
        for primary in 0..3 {
            calls.push(factory.cluster.command_calls(primary, "evalsha").await);
        }
        calls
    };
    let before = calls().await;
    let intervals: u64 = 8;
    let window = ttl / 3 * 8;
    sleep(window).await;
    let after = calls().await;
    let per_shard: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    println!(
        "renewal of 1000 holds: script calls per primary over {intervals} intervals: {per_shard:?}"
    );
    for calls in &per_shard {
        assert!(
            (intervals - 2..=intervals + 2).contains(calls),
            "one call per shard per interval: {per_shard:?}"
        );
    }
    assert!(guards.iter().all(|g| g.state() == LockState::Held));
    join_all(guards.into_iter().map(|g| g.release())).await;
}

/// One client holds names on two primaries, one of which is stopped (SIGSTOP) for twice
/// the TTL (short of the cluster's node timeout, so nothing fails over): the holds on the
/// other primary stay Held throughout, their renewals answered at once and not held up by
/// the stopped primary's, while the holds on the stopped primary are Lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_primary_delays_only_its_own_holds() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let client = factory.make(with_ttl(ttl)).await;
    let (healthy, stopped) = (0, 1);
    let mut names = Vec::new();
    for owner in [healthy, stopped] {
        for _ in 0..5 {
            names.push((owner, name_on(&factory, "slow_primary", owner).await));
        }
    }
    let guards = join_all(names.iter().map(|(_, lock)| client.lock(lock.as_str()))).await;
    let guards: Vec<_> = guards.into_iter().map(|g| g.expect("hold")).collect();
    // A renewal round of all of them first, so that they are due together.
    sleep(ttl / 2).await;
    let stop = ttl * 2;
    let server = factory.cluster.server(stopped);
    server.pause().expect("pause");
    let paused = Instant::now();
    // Every change of state while the server is stopped, by server.
    let mut states: Vec<LockState> = guards.iter().map(|g| g.state()).collect();
    let mut changes = [Vec::new(), Vec::new()];
    while paused.elapsed() < stop {
        for (((owner, lock), guard), last) in names.iter().zip(&guards).zip(&mut states) {
            let state = guard.state();
            if state != *last {
                changes[*owner].push(format!("+{:?}: {lock} {state:?}", paused.elapsed()));
                *last = state;
            }
        }
        sleep(Duration::from_millis(10)).await;
    }
    server.resume().expect("resume");
    println!("while server {stopped} was stopped: {changes:#?}");
    assert!(
        changes[healthy].is_empty(),
        "the holds on the healthy primary stay Held: {:#?}",
        changes[healthy]
    );
    for ((owner, lock), state) in names.iter().zip(&states) {
        if *owner == stopped {
            assert!(
                state.is_lost(),
                "{lock} on the stopped primary is Lost: {state:?}"
            );
        }
    }
    for ((owner, _), guard) in names.iter().zip(guards) {
        let released = guard.release().await;
        if *owner == healthy {
            let released = released.expect("release");
            assert_eq!(released, ReleaseOutcome::Released, "a healthy hold");
        }
    }
}

/// Bad seeds fail fast with a typed error: none reachable (Connection, within the request
/// timeout), or a seed that is a plain server, not a cluster node (InvalidConfig).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_seeds_are_typed_errors() {
    lock_core::raw::register::<lock_redis::RedisBackend>();
    let port = lab::harness::free_port().expect("a free port");
    let started = Instant::now();
    let err = lock_core::connect(&format!(
        "redis+cluster://127.0.0.1:{port}?request_timeout=500ms"
    ))
    .await
    .expect_err("no seed answers");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let Some(plain) = lab::harness::or_skip(RedisServer::start().await) else {
        return;
    };
    let started = Instant::now();
    let err = lock_core::connect(&format!("redis+cluster://{}", plain.addr()))
        .await
        .expect_err("a plain server is no cluster node");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(
        err.to_string().contains("not a Redis Cluster node"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// `wait_replicas=1` on a cluster: a grant waits for the slot's replica (`WAIT` on the
/// slot primary's connection); with that replica paused the grant is given back and the
/// acquire fails with a retryable `Unavailable`, leaving no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledged_grants_wait_for_the_slots_replica() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let mut config = factory.config(with_ttl(Duration::from_secs(5)));
    config.wait_replicas = 1;
    config.wait_timeout = Duration::from_millis(200);
    let client = factory.make_with(config).await;
    let acknowledged = name_on(&factory, "acked", 1).await;
    let guard = client
        .lock(acknowledged.as_str())
        .await
        .expect("acknowledged");
    guard.release().await.expect("release");

    factory
        .cluster
        .server(4)
        .pause()
        .expect("pause the replica of server 1");
    let refused = name_on(&factory, "refused", 1).await;
    let started = Instant::now();
    let err = client
        .try_lock(refused.as_str())
        .await
        .expect_err("no replica acknowledges");
    let took = started.elapsed();
    factory.cluster.server(4).resume().expect("resume");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(factory.leftovers(&[acknowledged, refused]).await.is_empty());
}

/// 300 holds of one client on one primary, which is killed: once its replica is promoted,
/// the renewal round that finds the old primary dead reloads the slot map once and renews
/// the holds on the promoted replica in one batch (`INFO commandstats` there), not with
/// one call per hold; every hold stays Held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_after_a_failover_is_batched_on_the_new_primary() {
    let Some(factory) = ClusterFactory::start_for_failover().await else {
        return;
    };
    // Longer than a promotion (~2.5 s) and a renewal.
    let ttl = Duration::from_secs(6);
    let client = factory.make(with_ttl(ttl)).await;
    let (primary, replica) = (0, 3);
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
    factory
        .cluster
        .server(primary)
        .kill9()
        .await
        .expect("kill the primary");
    let slot = factory
        .cluster
        .slot_of(&key(&names[0]))
        .await
        .expect("slot");
    let promoted = factory
        .cluster
        .wait_for_new_owner(slot, primary, FAILOVER)
        .await
        .expect("the replica is promoted");
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
