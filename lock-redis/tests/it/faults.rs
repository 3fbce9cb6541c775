//! RedLock with servers down: a majority still grants and excludes; without a majority
//! acquire fails with `Unavailable` and never grants twice.

use std::time::Duration;

use conformance::FencedResource;
use lock_core::{DistributedLockExt, ErrorKind, LockState, LostReason, ReleaseOutcome};
use lock_redis::{KeyLayout, DEFAULT_PREFIX};
use testkit::redis::{unique_name as name, with_ttl, RedisFactory};
use tokio::time::{sleep, timeout, Instant};

/// With 2 of 5 servers killed, RedLock still grants, excludes, hands over and fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_down_still_grants_and_excludes() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let a = factory.make(with_ttl(Duration::from_secs(2))).await;
    let b = factory.make(with_ttl(Duration::from_secs(2))).await;
    factory.servers.member(0).kill9().await.expect("kill 0");
    factory.servers.member(3).kill9().await.expect("kill 3");
    let lock = name("two_down");

    let held = a
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("granted by 3 of 5");
    assert!(
        b.try_lock(lock.as_str()).await.expect("try").is_none(),
        "excluded"
    );
    // Renewals keep working on the majority.
    sleep(Duration::from_millis(1500)).await;
    assert_eq!(held.state(), LockState::Held);
    assert!(
        b.try_lock(lock.as_str()).await.expect("try").is_none(),
        "still excluded"
    );

    let resource = FencedResource::new();
    let section = resource.begin(held.fencing_token()).expect("first token");
    section.end();
    let waiter = tokio::spawn({
        let (b, lock) = (b.clone(), lock.clone());
        async move { b.lock(lock.as_str()).await.expect("waiter acquires") }
    });
    sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = timeout(Duration::from_secs(3), waiter)
        .await
        .expect("hand-off is pushed, not polled")
        .expect("waiter");
    println!(
        "hand-off with 2 of 5 servers down: {:?}",
        released_at.elapsed()
    );
    let section = resource
        .begin(next.fencing_token())
        .expect("token increases");
    section.end();
    assert!(resource.check().is_safe());
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// With 3 of 5 servers down, acquire fails with `Unavailable` (try and wait alike), the
/// holder's guard goes Suspect then Lost, and nobody else is granted meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_down_is_unavailable_and_never_grants_twice() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let holder = factory.make(with_ttl(ttl)).await;
    let other = factory.make(with_ttl(ttl)).await;
    let lock = name("three_down");
    let held = holder
        .lock(lock.as_str())
        .await
        .expect("acquire with all servers up");
    let mut watch = held.watch();
    for i in [1, 2, 4] {
        factory.servers.member(i).kill9().await.expect("kill");
    }
    let killed_at = Instant::now();

    let err = other
        .try_lock(lock.as_str())
        .await
        .expect_err("no majority");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    let err = other
        .lock_timeout(lock.as_str(), Duration::from_secs(1))
        .await
        .expect_err("no majority when waiting either");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let free = name("three_down_free");
    let err = other
        .try_lock(free.as_str())
        .await
        .expect_err("not even a free name");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    // The holder cannot renew on a majority: Suspect, then Lost at its deadline, and
    // the other client is refused all along (never a second grant).
    let first = timeout(ttl, watch.changed())
        .await
        .expect("renewal fails within ttl");
    assert_eq!(
        first,
        LockState::Suspect,
        "failing renewals make the hold suspect first"
    );
    let reason = timeout(ttl + Duration::from_secs(3), watch.lost())
        .await
        .expect("the holder's guard is lost by its deadline");
    println!(
        "holder lost ({reason:?}) {:?} after 3 of 5 servers died",
        killed_at.elapsed()
    );
    assert!(held.valid_until() <= Instant::now());
    for _ in 0..5 {
        let attempt = other.try_lock(lock.as_str()).await;
        assert!(
            matches!(&attempt, Err(e) if e.kind() == ErrorKind::Unavailable),
            "a minority must never grant: {attempt:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    drop(held);
}

/// The fencing read rides on the acquire: a holder whose token reached only a bare
/// majority ({0, 1, 2}) is still seen by a later holder whose majority is {2, 3, 4}, through
/// the one server they share; the acquire only reads the counters (no `INCR` on RedLock
/// servers) and the write-back stores exactly max + 1 on the granting majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_read_on_acquire_sees_the_previous_majority() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let a = factory.make(with_ttl(Duration::from_secs(2))).await;
    let b = factory.make(with_ttl(Duration::from_secs(2))).await;
    let lock = name("fence_intersection");
    let fence_key = KeyLayout::new(DEFAULT_PREFIX).fence_key(&lock);
    let mut raw = factory.raw_all().await;

    let first = a.try_lock(lock.as_str()).await.expect("try").expect("free");
    let t1 = first.fencing_token().0;
    assert!(
        t1 > 1_000_000_000_000_000,
        "a missing counter reads as the server clock in microseconds: {t1}"
    );
    assert_eq!(
        first.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    // A previous holder whose write-back reached only servers 0, 1 and 2, with a token an
    // hour ahead of the clock (so the counters decide, not the clock in the readings).
    let previous = t1 + 3_600_000_000;
    for conn in &mut raw[..3] {
        let () = redis::cmd("SET")
            .arg(&fence_key)
            .arg(previous)
            .query_async(conn)
            .await
            .expect("SET counter");
    }
    for conn in &mut raw[3..] {
        let () = redis::cmd("SET")
            .arg(&fence_key)
            .arg(t1)
            .query_async(conn)
            .await
            .expect("SET counter");
    }
    factory.servers.member(0).kill9().await.expect("kill 0");
    factory.servers.member(1).kill9().await.expect("kill 1");

    let next = b
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("granted by 3 of 5");
    assert_eq!(
        next.fencing_token().0,
        previous + 1,
        "max over the granting majority + 1"
    );
    for conn in &mut raw[2..] {
        let stored: u64 = redis::cmd("GET")
            .arg(&fence_key)
            .query_async(conn)
            .await
            .expect("GET counter");
        assert_eq!(stored, previous + 1, "written back once, never incremented");
    }
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Renewal decides each hold on its own: one hold whose key is gone from servers 0 and 1
/// while servers 3 and 4 are stopped has one confirmation and two silent servers
/// (undecided), yet the client's other holds, confirmed by servers 0, 1 and 2, stay Held
/// through every renewal; only the undecided hold turns Suspect (then Lost once its
/// validity runs out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_undecided_hold_leaves_the_others_held() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let mut options = with_ttl(ttl);
    options.request_timeout = Duration::from_millis(500);
    let client = factory.make(options).await;
    let names = [name("undecided"), name("decided_1"), name("decided_2")];
    let mut guards = Vec::new();
    for lock in &names {
        guards.push(client.lock(lock.as_str()).await.expect("acquire"));
    }
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let mut raw = factory.raw_all().await;
    // An acquire does not wait for the servers beyond its majority: put each key on the
    // servers it did not reach yet, so that every hold starts on all five.
    for lock in &names {
        let key = keys.lock_key(lock);
        let mut owners = Vec::new();
        for conn in &mut raw {
            let owner: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(conn)
                .await
                .expect("GET");
            owners.push(owner);
        }
        let owner = owners.iter().flatten().next().expect("held").clone();
        for (conn, _) in raw.iter_mut().zip(&owners).filter(|(_, o)| o.is_none()) {
            let () = redis::cmd("SET")
                .arg(&key)
                .arg(&owner)
                .arg("PX")
                .arg(u64::try_from(ttl.as_millis()).expect("ms"))
                .query_async(conn)
                .await
                .expect("SET");
        }
    }
    let undecided_key = keys.lock_key(&names[0]);
    for conn in &mut raw[..2] {
        let deleted: i64 = redis::cmd("DEL")
            .arg(&undecided_key)
            .query_async(conn)
            .await
            .expect("DEL");
        assert_eq!(deleted, 1);
    }
    for i in [3, 4] {
        factory.servers.member(i).pause().expect("pause");
    }
    // Each hold's states, in the order they were seen, until the undecided hold's
    // validity ends (it is never renewed again: several renewals of the others).
    let mut seen: Vec<Vec<LockState>> = vec![Vec::new(); guards.len()];
    let until = guards[0].valid_until() - Duration::from_millis(50);
    while Instant::now() < until {
        for (states, guard) in seen.iter_mut().zip(&guards) {
            let state = guard.state();
            if states.last() != Some(&state) {
                states.push(state);
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    let undecided = timeout(ttl, guards[0].lost()).await;
    for i in [3, 4] {
        factory.servers.member(i).resume().expect("resume");
    }
    assert_eq!(
        &seen[1..],
        [vec![LockState::Held], vec![LockState::Held]],
        "holds confirmed by a majority did not stay Held (the undecided one went {:?})",
        seen[0]
    );
    assert_eq!(
        seen[0],
        [LockState::Held, LockState::Suspect],
        "the undecided hold"
    );
    assert_eq!(
        undecided.ok(),
        Some(LostReason::Expired),
        "the undecided hold ends when its validity does"
    );
    for guard in guards {
        let _ = guard.release().await;
    }
}

/// Clients connected to the server behind `conn` (`conn` included).
async fn connected_clients(conn: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines().count()
}

/// One server listed twice, even under two names (`localhost` and `127.0.0.1`), would
/// count as two votes: `redlock://` refuses it at connect with `InvalidConfig`, before
/// opening any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_server_twice_is_rejected_by_resolved_address() {
    let Some(factory) = RedisFactory::redlock(2).await else {
        return;
    };
    let (a, b) = (
        factory.servers.member(0).port(),
        factory.servers.member(1).port(),
    );
    let mut watch = factory.raw_all().await;
    let before = connected_clients(&mut watch[0]).await;
    for url in [
        format!("redlock://localhost:{a},127.0.0.1:{a},127.0.0.1:{b}"),
        format!("redlock://127.0.0.1:{a},127.0.0.1:{b},LOCALHOST:{b}"),
        format!("redlock://127.0.0.1:{a},127.0.0.1:{a},127.0.0.1:{b}"),
    ] {
        match lock_core::connect(&url).await {
            Ok(client) => panic!("{url}: connected with one server listed twice: {client}"),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
                assert!(err.to_string().contains("twice"), "{url}: {err}");
            }
        }
    }
    assert_eq!(
        connected_clients(&mut watch[0]).await,
        before,
        "a rejected configuration left connections behind"
    );
    let distinct = format!("redlock://localhost:{a},127.0.0.1:{b}");
    lock_core::connect(&distinct)
        .await
        .expect("two distinct servers");
}
