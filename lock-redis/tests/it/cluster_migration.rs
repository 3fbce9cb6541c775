//! Redis Cluster slot moves: a held and contended name whose slot migrates (renewal,
//! acquire and release through `ASK`, then `MOVED`), releases and acquires while the slot
//! is migrating, and an election's leader whose entry moves with its slot.

use std::sync::Arc;
use std::time::Duration;

use conformance::lock_patiently;
use lock_core::{DistributedLockExt, ErrorKind, LockState};
use testkit::redis::{
    asking_calls, await_shard_channels, key, key_on, name_on, raw, release_leaving_nothing,
    shard_channels, with_ttl, ClusterFactory,
};
use tokio::time::{sleep, timeout, Instant};

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
    release_leaving_nothing(&factory, next, &lock).await;
    let (left, _) = key_on(&factory, 0, &lock_key).await;
    assert!(left.is_none(), "nothing on the old primary");
    await_shard_channels(&factory, 1, &lock, 0).await;
}

/// Half-way through a slot move (every key on the new primary, the slot still the old
/// one's), a renewal, an acquire of the held, contended name by another client and the
/// release each reach the new primary through `ASK` (each sends `ASKING` there, counted
/// with nothing else running) and act on the keys there: the lease extended, the name
/// busy, the holder's key gone (handed to the waiter). The waiter holds once the move is
/// complete.
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
    let pttl_on_target = || {
        let lock_key = lock_key.clone();
        let addr = factory.cluster.server(1).addr();
        async move {
            let mut conn = raw(addr).await;
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().cmd("PTTL");
            pipe.arg(&lock_key);
            let (seen,): (i64,) = pipe.query_async(&mut conn).await.expect("ASKING");
            seen
        }
    };

    let before = asking_calls(&factory, 1).await;
    let longer = ttl * 2;
    guard.extend_for(longer).await.expect("renewed through ASK");
    let renewal = asking_calls(&factory, 1).await - before;
    let pttl = pttl_on_target().await;
    assert!(
        u128::try_from(pttl).expect("a lease") > ttl.as_millis(),
        "the lease on the new primary is extended: PTTL {pttl}"
    );

    let before = asking_calls(&factory, 1).await;
    let busy = other.try_lock(lock.as_str()).await;
    assert!(matches!(busy, Ok(None)), "held: {busy:?}");
    let acquire = asking_calls(&factory, 1).await - before;

    let held_by = || {
        let lock_key = lock_key.clone();
        let addr = factory.cluster.server(1).addr();
        async move {
            let mut conn = raw(addr).await;
            let (owner,): (Option<String>,) = redis::pipe()
                .cmd("ASKING")
                .ignore()
                .cmd("GET")
                .arg(&lock_key)
                .query_async(&mut conn)
                .await
                .expect("ASKING");
            owner
        }
    };
    let holder_token = held_by().await.expect("held on the new primary");
    let before = asking_calls(&factory, 1).await;
    guard.release().await.expect("released through ASK");
    let release = asking_calls(&factory, 1).await - before;
    // The release hands the lock to the queued waiter there (or leaves it free).
    assert_ne!(
        held_by().await.as_deref(),
        Some(holder_token.as_str()),
        "the holder's key is gone"
    );
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
    release_leaving_nothing(&factory, next, &lock).await;
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
        release_leaving_nothing(&factory, next, &lock).await;
    }
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
    release_leaving_nothing(&factory, guard, &lock).await;
}

/// A leader whose slot moves to another primary keeps leading with its entry: the
/// entry moves with the lock key (same hash slot), renewal keeps both alive on the new
/// primary, the observers' change channel is subscribed there again, and a proclaim and
/// the resign reach them by push; nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_keeps_its_entry_when_its_slot_moves() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let ttl = Duration::from_millis(1500);
    let leader_client: Arc<dyn lock_core::DistributedLock> = factory.make(with_ttl(ttl)).await;
    let mut push_only = with_ttl(ttl);
    push_only.recheck = Duration::from_secs(20);
    let watcher: Arc<dyn lock_core::DistributedLock> = factory.make(push_only).await;
    let name = name_on(&factory, "leader_moves", 0).await;
    let on_leader = lock_core::Election::new(leader_client, name.as_str()).expect("election");
    let watched = lock_core::Election::new(watcher, name.as_str()).expect("election");
    let mut leadership = on_leader
        .campaign_with("node-a", &lock_core::AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let mut observer = watched.observe();
    let seen = observer.next().await.expect("observe").expect("a leader");
    assert_eq!(seen.term, leadership.term());
    await_shard_channels(&factory, 0, &name, 1).await;

    let slot = factory.cluster.slot_of(&key(&name)).await.expect("slot");
    let moving = factory.cluster.begin_move(slot, 1).await.expect("begin");
    let moved = factory.cluster.move_keys(&moving).await.expect("move");
    assert!(
        moved >= 3,
        "the lock key, its fencing counter and the leader entry move: {moved}"
    );
    factory.cluster.finish_move(&moving).await.expect("finish");
    await_shard_channels(&factory, 1, &name, 1).await;
    sleep(ttl).await;
    assert!(leadership.is_leader(), "renewed after the move");
    let leader_key = lock_redis::KeyLayout::new(lock_redis::DEFAULT_PREFIX).leader_key(&name);
    let mut conn = raw(factory.cluster.server(1).addr()).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&leader_key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(
        pttl > 0 && u64::try_from(pttl).expect("ms") <= 1500,
        "the entry lives on the new primary with the lock's TTL: PTTL {pttl}"
    );

    leadership.proclaim("node-a2").await.expect("proclaim");
    let seen = timeout(Duration::from_secs(3), observer.next())
        .await
        .expect("the proclaim is pushed from the new primary")
        .expect("observe")
        .expect("a leader");
    assert_eq!(
        (seen.value_text(), seen.term),
        ("node-a2".to_owned(), leadership.term())
    );
    leadership.resign().await.expect("resign");
    let seen = timeout(Duration::from_secs(3), observer.next())
        .await
        .expect("the resign is pushed")
        .expect("observe");
    assert_eq!(seen, None);
    drop(observer);
    await_shard_channels(&factory, 1, &name, 0).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&leader_key)
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0, "the entry goes with the hold");
}
