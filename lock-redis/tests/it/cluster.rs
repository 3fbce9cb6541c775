//! Redis Cluster (`redis+cluster://`): the whole conformance suite on three primaries
//! with a replica each, and what the suite cannot show: holds and waiters across shards,
//! renewal cost per shard, a stopped primary, a refused subscription, replica-acknowledged
//! grants, and bad seeds. Failovers are in `cluster_failover.rs`, slot moves in
//! `cluster_migration.rs`.

/// The conformance suite on a cluster of its own per test.
mod suite {
    conformance::conformance_suite!(async { testkit::redis::ClusterFactory::start().await });
}

use std::sync::Arc;
use std::time::Duration;

use conformance::{lock_patiently, Factory};
use futures::future::join_all;
use harness::RedisServer;
use lock_core::{DistributedLockExt, ErrorKind, LockName, LockState, ReleaseOutcome};
use lock_redis::RedisLock;
use testkit::redis::{
    await_shard_channels, name_on, raw, shard_channels, unique_name as name, until_queued,
    with_ttl, ClusterFactory,
};
use tokio::time::{sleep, timeout, Instant};

/// Two clients that hand a name back and forth subscribe their channel for it once each:
/// a client that queues again soon after its last wait finds the channel still live, so
/// it pays no subscription round trip and no re-check when the channel goes live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_queuing_again_keeps_its_channel() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(5));
    let clients = [
        factory.make(options.clone()).await,
        factory.make(options).await,
    ];
    let lock = name_on(&factory, "again", 0).await;
    let mut conn = raw(factory.cluster.server(0).addr()).await;
    let before = factory.cluster.command_calls(0, "ssubscribe").await;
    let mut held = clients[0].lock(lock.as_str()).await.expect("hold");
    let hand_offs = 20;
    for round in 1..=hand_offs {
        let next = Arc::clone(&clients[round % 2]);
        let name = lock.clone();
        let waiting = tokio::spawn(async move { next.lock(name.as_str()).await });
        until_queued(&mut conn, &lock, 1).await;
        held.release().await.expect("release");
        held = timeout(Duration::from_secs(10), waiting)
            .await
            .expect("handed over")
            .expect("waiter task")
            .expect("acquire");
    }
    held.release().await.expect("release");
    let subscribed = factory.cluster.command_calls(0, "ssubscribe").await - before;
    println!("{subscribed} SSUBSCRIBE for {hand_offs} hand-offs between two clients");
    // Per client, its first wait: the subscription, and the subscriber connection's start
    // (which subscribes what is placed on it).
    assert!(
        subscribed <= 4,
        "each client subscribes its channel once, not per wait: {subscribed}"
    );
}

/// A waiter a release handed the lock to, whose next round runs before it takes the
/// grant, gets the token it was handed, on the primary of its name's slot (see
/// [`handed_waiter_keeps_its_token`](super::migration::handed_waiter_keeps_its_token)).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_waiter_takes_the_token_it_was_handed() {
    let Some(factory) = ClusterFactory::start().await else {
        return;
    };
    use lock_core::raw::driver::Connect;
    let backend = lock_redis::RedisBackend::open(factory.config(with_ttl(Duration::from_secs(10))))
        .await
        .expect("connect");
    let lock = name("handed_waiter");
    let conn = factory.raw_owner(&testkit::redis::key(&lock)).await;
    super::migration::handed_waiter_keeps_its_token(&backend, conn, &lock, "cluster").await;
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
    lock_core::raw::driver::register::<lock_redis::RedisBackend>();
    let port = harness::free_port().expect("a free port");
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

    let Some(plain) = harness::or_skip(RedisServer::start().await) else {
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
    config.wait_replicas = Some(1);
    config.wait_timeout = Some(Duration::from_millis(200));
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
