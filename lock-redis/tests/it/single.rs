//! One server: restarts with and without persistence, interoperation with plain
//! `SET NX` holders, and the cost model (one subscription connection per client, one
//! renewal call per interval).

use std::sync::Arc;
use std::time::Duration;

use harness::{or_skip, RedisOptions, RedisServer};
use lock_core::{DistributedLockExt, LockName, LockState, LostReason, ReleaseOutcome};
use lock_redis::{KeyLayout, RedisConfig, RedisLock, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use testkit::redis::{
    assert_released, command_calls, raw, unique_name as name, with_ttl, RedisFactory,
};
use tokio::time::{sleep, timeout, Instant};

async fn client_of(
    server: &RedisServer,
    ttl: Duration,
    prefix: &str,
) -> Arc<lock_redis::RedisLock> {
    let mut config = RedisConfig::single("127.0.0.1", server.port());
    config.options = with_ttl(ttl);
    config.prefix = prefix.to_owned();
    Arc::new(RedisLock::connect(config).await.expect("connect"))
}

/// A server restarted without persistence has forgotten the lock: the holder's Lost
/// signal fires at its next renewal, another client can take the lock (the reason
/// single-server Redis is an efficiency lock), and fencing tokens still increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_loses_the_lock_and_signals_it() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let ttl = Duration::from_secs(3);
    let holder = client_of(&server, ttl, DEFAULT_PREFIX).await;
    let other = client_of(&server, ttl, DEFAULT_PREFIX).await;
    let lock = name("restart_volatile");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let old_token = guard.fencing_token();
    server.restart().await.expect("restart");
    let restarted_at = Instant::now();

    let reason = timeout(ttl, guard.lost())
        .await
        .expect("the holder learns of the loss at a renewal, well before its TTL");
    println!(
        "lost signal {:?} after the restart ({reason:?})",
        restarted_at.elapsed()
    );
    assert_eq!(reason, LostReason::Vanished);
    let next = other
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("the forgotten lock is free for anyone");
    assert!(
        next.fencing_token() > old_token,
        "tokens keep increasing across the lost counter: {} after {old_token}",
        next.fencing_token()
    );
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::Vanished)
    ));
    assert_released(next).await;
}

/// A fleet of waiters cut off by a server restart comes back spread out: their retries
/// back off with jitter, so the clients that failed together re-acquire at instants spread
/// over the backoff's ceiling, not in lockstep on the restarted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reacquires_spread_out_after_a_server_restart() {
    const CLIENTS: usize = 20;
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(client_of(&server, Duration::from_secs(5), DEFAULT_PREFIX).await);
    }
    server.kill9().await.expect("kill");
    let waiters: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let (client, lock) = (Arc::clone(client), name(&format!("fleet_{i}")));
            tokio::spawn(async move {
                let guard = client
                    .lock_timeout(lock.as_str(), Duration::from_secs(30))
                    .await
                    .expect("re-acquires once the server is back");
                let at = Instant::now();
                guard.release().await.expect("release");
                at
            })
        })
        .collect();
    // Long enough for every retry to back off to its ceiling.
    sleep(Duration::from_secs(4)).await;
    server.restart().await.expect("restart");
    let mut at = Vec::new();
    for waiter in waiters {
        at.push(waiter.await.expect("the waiter ends"));
    }
    at.sort();
    let offsets: Vec<u128> = at.iter().map(|t| (*t - at[0]).as_millis()).collect();
    // The most re-acquires within any 20 ms.
    let crowd = (0..CLIENTS)
        .map(|i| {
            offsets[i..]
                .iter()
                .take_while(|&&o| o - offsets[i] <= 20)
                .count()
        })
        .max()
        .unwrap_or(0);
    println!("re-acquired at +{offsets:?} ms; at most {crowd} within 20 ms");
    assert!(
        offsets[CLIENTS - 1] >= 200 && crowd <= CLIENTS / 2,
        "the fleet re-acquired in lockstep: at +{offsets:?} ms"
    );
}

/// With `appendonly yes` + `appendfsync always`, a restart keeps the lock: the holder stays
/// Held and others stay excluded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_persistence_keeps_the_lock() {
    let Some(server) =
        or_skip(RedisServer::start_with(RedisOptions::default().persistence(true)).await)
    else {
        return;
    };
    let ttl = Duration::from_secs(3);
    let holder = client_of(&server, ttl, DEFAULT_PREFIX).await;
    let other = client_of(&server, ttl, DEFAULT_PREFIX).await;
    let lock = name("restart_durable");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    server.restart().await.expect("restart");
    // Two renewal intervals later the hold is still ours.
    sleep(ttl * 2 / 3 + Duration::from_millis(300)).await;
    assert!(other.try_lock(lock.as_str()).await.expect("try").is_none());
    assert_eq!(guard.state(), LockState::Held);
    assert_released(guard).await;
}

/// `SET key their-token NX PX 800`, as another Redis lock library takes a lock: the reply.
async fn their_set(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("SET")
        .arg(key)
        .arg("their-token")
        .arg("NX")
        .arg("PX")
        .arg(800)
        .query_async(conn)
        .await
        .expect("SET")
}

/// A plain `SET key token NX PX` holder (as redis-py's `Lock` writes it) excludes us,
/// and our hold excludes it; with `prefix=` empty the lock key is the bare name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_set_nx_holders_and_ours_exclude_each_other() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let mut conn = raw(server.addr()).await;
    let ours = client_of(&server, Duration::from_secs(5), "").await;
    let lock = LockName::new(format!("interop-{}", uuid::Uuid::new_v4().simple())).expect("name");
    let key = KeyLayout::new("").lock_key(&lock);
    assert_eq!(key, lock.as_str(), "plain names map to the bare key");

    // Theirs blocks ours.
    let set = their_set(&mut conn, &key).await;
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(ours.try_lock(lock.as_str()).await.expect("try").is_none());
    // A waiter gets it once their key expires (PTTL-bounded wait, no release message).
    let started = Instant::now();
    let guard = ours
        .lock_timeout(lock.as_str(), Duration::from_secs(5))
        .await
        .expect("acquired after their TTL");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(800) + Duration::from_millis(500),
        "{waited:?}"
    );

    // Ours blocks theirs; the key holds our owner token with our TTL.
    let value: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(value, guard.owner_token().as_str());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(pttl > 0 && pttl <= 5000, "{pttl}");
    let set = their_set(&mut conn, &key).await;
    assert_eq!(set, None, "our hold must block a plain SET NX");
    assert_released(guard).await;
    let set = their_set(&mut conn, &key).await;
    assert_eq!(set.as_deref(), Some("OK"), "free after our release");
}

/// Many waiters of one client share one subscription connection. Queued, they all hear
/// their wake-ups on the client's one channel; without the queue, on one channel per name,
/// each left when its last waiter goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscription_connection() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    for queue in [true, false] {
        let holder = factory.make(with_ttl(Duration::from_secs(10))).await;
        let mut config = testkit::redis::config_for(
            &factory.servers.addrs(),
            false,
            with_ttl(Duration::from_secs(10)),
        );
        config.queue = queue;
        let waiter = Arc::new(RedisLock::connect(config).await.expect("connect"));
        let mut conn = raw(factory.servers.addrs()[0]).await;
        let names: Vec<LockName> = (0..20)
            .map(|i| name(&format!("shared_sub_{queue}_{i}")))
            .collect();
        let mut guards = Vec::new();
        for n in &names {
            guards.push(holder.lock(n.as_str()).await.expect("acquire"));
        }
        let mut tasks = Vec::new();
        for n in names.iter().cycle().take(40) {
            let (waiter, n) = (waiter.clone(), n.clone());
            tasks.push(tokio::spawn(async move {
                let _ = waiter
                    .lock_timeout(n.as_str(), Duration::from_secs(2))
                    .await;
            }));
        }
        sleep(Duration::from_millis(500)).await;
        let (channels, queued) = if queue { (1, 40) } else { (20, 0) };
        assert_eq!(
            waiter.backend().wakeup_channels(),
            channels,
            "queue {queue}"
        );
        assert_eq!(waiter.backend().queued_waiters(), queued, "queue {queue}");
        let pubsub_conns = subscription_connections(&mut conn).await;
        assert_eq!(
            pubsub_conns.lines().count(),
            1,
            "40 waiters on 20 names use one subscription connection: {pubsub_conns}"
        );
        for task in tasks {
            task.await.expect("waiter task");
        }
        assert_eq!(waiter.backend().queued_waiters(), 0, "bells are left");
        assert_eq!(
            waiter.backend().wakeup_channels(),
            usize::from(queue),
            "the client's channel stays, the names' channels are left with their waiters"
        );
        drop(guards);
        drop(waiter);
        // The dropped client's subscription connection goes with it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let list = subscription_connections(&mut conn).await;
            if list.lines().count() == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "subscription connection left: {list}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The server's list of subscription connections (`CLIENT LIST TYPE pubsub`).
async fn subscription_connections(conn: &mut MultiplexedConnection) -> String {
    redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT LIST")
}

/// Renewal cost does not grow with the number of holds: 200 holds of one client are
/// renewed with one script call per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_one_call_per_interval_for_all_holds() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let ttl = Duration::from_millis(600);
    let client = factory.make(with_ttl(ttl)).await;
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(
            client
                .lock(name(&format!("batch_{i}")).as_str())
                .await
                .expect("acquire"),
        );
    }
    let before = command_calls(&mut conn, "evalsha").await;
    let window = ttl * 3;
    sleep(window).await;
    let calls = command_calls(&mut conn, "evalsha").await - before;
    println!("{calls} renewal calls for 200 holds over {window:?} (TTL {ttl:?})");
    // About one call per TTL/3: 9 in the window; a per-hold renewal would need 1,800.
    assert!(calls >= 5, "holds were not renewed: {calls}");
    assert!(calls <= 20, "renewal is not batched: {calls} calls");
    for guard in &guards {
        assert_eq!(guard.state(), LockState::Held);
    }
    for guard in guards {
        assert_released(guard).await;
    }
}

/// Holds taken one after another, as a server taking locks for its requests takes them,
/// are renewed in a few batches per interval, not in one call per hold as each comes due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_new_holds_is_renewed_in_batches() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let ttl = Duration::from_millis(600);
    let client = factory.make(with_ttl(ttl)).await;
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let holds = 100;
    let window = ttl * 3;
    let started = Instant::now();
    let before = command_calls(&mut conn, "evalsha").await;
    let mut guards = Vec::new();
    for i in 0..holds {
        guards.push(
            client
                .lock(name(&format!("stream_{i}")).as_str())
                .await
                .expect("acquire"),
        );
        sleep(Duration::from_millis(4)).await;
    }
    sleep((started + window).saturating_duration_since(Instant::now())).await;
    let calls = command_calls(&mut conn, "evalsha").await - before - holds;
    println!(
        "{calls} renewal calls for {holds} holds taken over {:?}, in {:?} (TTL {ttl:?})",
        guards[guards.len() - 1].acquired_at() - guards[0].acquired_at(),
        started.elapsed()
    );
    // A batch takes every hold due within a quarter of the TTL, so batches come at least
    // that far apart: 13 in the window at most, whatever the holds' spread.
    assert!(calls <= 13, "renewals are not batched: {calls} calls");
    for guard in guards {
        assert_eq!(guard.state(), LockState::Held);
        assert_released(guard).await;
    }
}

/// A lost reply (the proxy drops it) costs one request timeout: a lost acquire reply is
/// cleaned up in the background (its SET did happen), a lost renewal reply makes the hold
/// Suspect until the next renewal on a fresh connection, and no later reply is paired
/// with the wrong request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_are_cleaned_up_and_recovered_from() {
    use harness::proxy::{FaultProxy, ProxyMode};
    use lock_core::ErrorKind;

    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let mut config = RedisConfig::single("127.0.0.1", proxy.port());
    config.options = with_ttl(Duration::from_secs(3));
    config.options.request_timeout = Duration::from_millis(300);
    let client = RedisLock::connect(config).await.expect("connect");
    let other = client_of(&server, Duration::from_secs(3), DEFAULT_PREFIX).await;
    let mut conn = raw(server.addr()).await;

    // The acquire's reply is lost after its SET happened.
    let lock = name("lost_acquire_reply");
    let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock);
    proxy.set_mode(ProxyMode::DropNextReply);
    let err = client.try_lock(lock.as_str()).await.expect_err("no reply");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("EXISTS");
        if exists == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned SET was not cleaned up"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let guard = other
        .try_lock(lock.as_str())
        .await
        .expect("try")
        .expect("free again");
    guard.release().await.expect("release");

    // A renewal's reply is lost: Suspect, then Held again.
    let lock = name("lost_renew_reply");
    let guard = client.lock(lock.as_str()).await.expect("acquire");
    let mut watch = guard.watch();
    sleep(Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::DropNextReply);
    let state = timeout(Duration::from_secs(3), watch.changed())
        .await
        .expect("renewal at TTL/3");
    assert_eq!(state, LockState::Suspect);
    let state = timeout(Duration::from_secs(2), watch.changed())
        .await
        .expect("next renewal");
    assert_eq!(state, LockState::Held);
    assert!(other.try_lock(lock.as_str()).await.expect("try").is_none());
    assert_released(guard).await;
}
