//! Redis behind Sentinel (`redis+sentinel://`), what the conformance suite cannot show: a
//! failover while locks are held and contended, replica-acknowledged grants
//! (`wait_replicas`) with a replica paused, discovery with Sentinels paused, writes
//! sent to a replica, and an election whose leader a failover forgets.

use std::sync::Arc;
use std::time::Duration;

use conformance::lock_patiently;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, Election, ErrorKind, LockName, LockState,
    LostReason,
};
use lock_redis::{KeyLayout, DEFAULT_PREFIX};
use testkit::redis::{
    across_failover, cut_replicas, end_holds, kill_primary, raw, unique_name as name, with_ttl,
    SentinelFactory,
};
use tokio::time::{sleep, timeout, Instant};

/// Bound on the Sentinels' failover after the primary is killed.
const FAILOVER: Duration = Duration::from_secs(30);
/// Bound on a client's first grant once the Sentinels name the new primary.
const FOLLOW: Duration = Duration::from_secs(5);

/// The lock key of `name` on the server at data index `i`.
async fn key_on(factory: &SentinelFactory, i: usize, name: &LockName) -> Option<String> {
    let mut conn = raw(factory.deployment.server(i).addr()).await;
    redis::cmd("GET")
        .arg(KeyLayout::new(DEFAULT_PREFIX).lock_key(name))
        .query_async(&mut conn)
        .await
        .expect("GET")
}

/// The primary is killed (SIGKILL) while one client holds two names and two others wait
/// for them. One hold's key had reached the replicas, the other's had not (replication was
/// held back while it was granted). The Sentinels promote a replica and the clients
/// follow: a fresh name is granted within [`FOLLOW`] of the promotion. The replicated hold
/// is still Held with its key on the new primary (or Lost, never two valid holders: its
/// waiter is granted only after its release); the hold whose key was lost turns Lost
/// (`Vanished`) at its next renewal and its waiter takes the name with a higher fencing
/// token (the new primary had no counter: the clock took over). Tokens never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_and_fencing_tokens_never_go_back() {
    let Some(factory) = SentinelFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let holder = factory.make(with_ttl(ttl)).await;
    let waiter = factory.make(with_ttl(ttl)).await;
    let (kept, dropped) = (name("kept"), name("dropped"));

    let kept_guard = holder.lock(kept.as_str()).await.expect("acquire kept");
    let give_up = Instant::now() + Duration::from_secs(5);
    for replica in [1, 2] {
        while key_on(&factory, replica, &kept).await.is_none() {
            assert!(
                Instant::now() < give_up,
                "kept never reached replica {replica}"
            );
            sleep(Duration::from_millis(10)).await;
        }
    }
    // Replication stops: the replicas are paused, then their links are closed (they
    // cannot reconnect while paused; what was sent before is already in their sockets).
    for replica in [1, 2] {
        factory.deployment.server(replica).pause().expect("pause");
    }
    cut_replicas(factory.deployment.server(0).addr()).await;
    let dropped_guard = holder
        .lock(dropped.as_str())
        .await
        .expect("acquire dropped");
    let (kept_token, dropped_token) = (kept_guard.fencing_token(), dropped_guard.fencing_token());
    let dropped_owner = dropped_guard.owner_token().as_str().to_owned();

    // The holder works on both resources across the failover; the waiter waits for both.
    let mut run = across_failover(
        &waiter,
        (kept_guard, dropped_guard),
        (&kept, &dropped),
        Duration::from_secs(12),
        FAILOVER * 2,
    )
    .await;

    kill_primary(factory.deployment.server(0)).await;
    let killed = Instant::now();
    for replica in [1, 2] {
        factory.deployment.server(replica).resume().expect("resume");
    }
    let primary = factory
        .deployment
        .wait_for_new_primary(0, FAILOVER)
        .await
        .expect("the Sentinels promote a replica");
    let promoted = killed.elapsed();
    // The key is gone, or already the waiter's (it may be granted at once).
    let on_new_primary = key_on(&factory, primary, &dropped).await;
    assert_ne!(
        on_new_primary.as_deref(),
        Some(dropped_owner.as_str()),
        "dropped was never replicated"
    );

    // New acquisitions work within a bound of the promotion.
    let fresh = lock_patiently(&*holder, &name("fresh"), FOLLOW).await;
    let followed = killed.elapsed();
    assert!(
        fresh.fencing_token() > dropped_token,
        "tokens never go back"
    );
    fresh.release().await.expect("release fresh");

    // The hold whose key was lost turns Lost at its next renewal, and its waiter takes
    // the name with a higher token.
    let (reason, lost_at, dropped_next) = run.dropped_lost(ttl, FAILOVER).await;
    let lost_after = lost_at - killed;
    assert!(
        dropped_next.fencing_token() > dropped_token,
        "token {} after {dropped_token} on the promoted replica",
        dropped_next.fencing_token()
    );

    // The replicated hold: Held with its key on the new primary, or Lost; its waiter
    // gets the name only after the release.
    let kept_state = run.kept_watch.state();
    if kept_state != LockState::Held && !kept_state.is_lost() {
        // Suspect: renewal has not reached the new primary yet; it must settle.
        sleep(ttl / 2).await;
    }
    let kept_state = run.kept_watch.state();
    let owner = key_on(&factory, primary, &kept).await;
    println!(
        "failover: promoted server {primary} {promoted:?} after the kill, a fresh name granted \
         after {followed:?}; the unreplicated hold lost ({reason:?}) after {lost_after:?}; the \
         replicated hold is {kept_state:?} (key on the new primary: {})",
        owner.is_some()
    );
    let kept_next = end_holds(&mut run, kept_state, owner, kept_token, FAILOVER).await;

    let kept_report = run.kept_fence.check();
    assert!(kept_report.is_safe(), "kept: {kept_report:?}");
    let dropped_report = run.dropped_fence.check();
    assert!(
        dropped_report.tokens_backwards.is_empty() && dropped_report.lost_updates() == 0,
        "the fence keeps the resource consistent: {dropped_report:?}"
    );
    println!(
        "unreplicated hold: {} overlapping claims (a second holder while the first guard \
         still vouched), {} stale writes turned away",
        dropped_report.overlaps.len(),
        dropped_report.rejected_writes
    );
    kept_next.release().await.expect("release");
    dropped_next.release().await.expect("release");
}

/// `wait_replicas=2`: a grant is returned once both replicas have its key; with one
/// replica paused (SIGSTOP) the grant is given back after `wait_timeout` with
/// `Unavailable` and leaves no key; `wait_replicas=1` is still granted then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_grant_is_given_back() {
    let Some(factory) = SentinelFactory::start().await else {
        return;
    };
    let client = |replicas: u32| {
        let mut config = factory.config(
            factory.deployment.sentinels(),
            with_ttl(Duration::from_secs(5)),
        );
        config.wait_replicas = Some(replicas);
        // Long enough for two replicas on two busy cores (300 ms missed under load).
        config.wait_timeout = Some(Duration::from_secs(2));
        factory.make_with(config)
    };
    let (both, one) = (client(2).await, client(1).await);

    let acked = name("acked");
    let guard = both
        .try_lock(acked.as_str())
        .await
        .expect("try")
        .expect("free");
    for replica in [1, 2] {
        assert_eq!(
            key_on(&factory, replica, &acked).await.as_deref(),
            Some(guard.owner_token().as_str()),
            "the grant came back only once replica {replica} had it"
        );
    }
    guard.release().await.expect("release");

    factory
        .deployment
        .server(2)
        .pause()
        .expect("pause replica 2");
    let refused = name("refused");
    let started = Instant::now();
    let err = both
        .try_lock(refused.as_str())
        .await
        .expect_err("one replica cannot acknowledge");
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(5),
        "gave back after {waited:?}"
    );
    assert_eq!(
        key_on(&factory, 0, &refused).await,
        None,
        "the grant was given back"
    );
    println!("an unacknowledged grant given back after {waited:?}: {err}");

    let guard = one
        .try_lock(refused.as_str())
        .await
        .expect("one replica acknowledges")
        .expect("the name is free again");
    assert_eq!(
        key_on(&factory, 1, &refused).await.as_deref(),
        Some(guard.owner_token().as_str())
    );
    factory.deployment.server(2).resume().expect("resume");
    guard.release().await.expect("release");
}

/// With the default replica wait (one replica, the default deadline), a grant whose
/// replicas are slow to acknowledge (both paused for 400 ms, as a loaded machine or a
/// replica's fsync can stall them) is still granted, once they acknowledge: the default
/// deadline is not a latency budget a busy replica misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_acknowledgement_is_awaited_by_default() {
    let Some(factory) = SentinelFactory::start().await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(10));
    options.request_timeout = Duration::from_secs(5);
    let client = factory
        .make_with(factory.config(factory.deployment.sentinels(), options))
        .await;
    let slow = name("slow_ack");
    // Warm: the client knows its primary and the primary its replicas.
    let guard = client.lock(slow.as_str()).await.expect("lock");
    guard.release().await.expect("release");
    replicas_attached(&factory, 2).await;
    for replica in [1, 2] {
        factory
            .deployment
            .server(replica)
            .pause()
            .expect("pause a replica");
    }
    let stall = Duration::from_millis(400);
    let resume = async {
        sleep(stall).await;
        for replica in [1, 2] {
            factory
                .deployment
                .server(replica)
                .resume()
                .expect("resume a replica");
        }
    };
    let started = Instant::now();
    let (granted, ()) = tokio::join!(
        async {
            let granted = client.try_lock(slow.as_str()).await;
            (granted, started.elapsed())
        },
        resume
    );
    let (granted, waited) = granted;
    let guard = granted
        .expect("a slow acknowledgement is awaited, not refused")
        .expect("the name is free");
    assert!(
        waited >= stall,
        "granted after {waited:?}, before the replicas were back"
    );
    // The grant waited for one replica's acknowledgement (the default): one has it at
    // once, the other follows.
    let owner = Some(guard.owner_token().as_str().to_owned());
    let mut at_once = 0;
    for replica in [1, 2] {
        if key_on(&factory, replica, &slow).await == owner {
            at_once += 1;
        }
    }
    assert!(at_once >= 1, "no replica had the grant when it was granted");
    for replica in [1, 2] {
        let deadline = Instant::now() + Duration::from_secs(5);
        while key_on(&factory, replica, &slow).await != owner {
            assert!(
                Instant::now() < deadline,
                "replica {replica} lacks the grant 5 s after it"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
    println!("granted after {waited:?} once a paused replica acknowledged");
    guard.release().await.expect("release");
}

/// Waits (at most 10 s) until the primary (server 0) lists `count` replicas in `ROLE`: a
/// fresh deployment's replicas attach after it starts, and a grant waits only for the
/// replicas the primary lists.
async fn replicas_attached(factory: &SentinelFactory, count: usize) {
    let mut conn = raw(factory.deployment.server(0).addr()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .expect("ROLE");
        let listed = match role.get(2) {
            Some(redis::Value::Array(replicas)) => replicas.len(),
            _ => 0,
        };
        if listed >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the primary lists {listed} of {count} replicas after 10 s"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Discovery asks every Sentinel at once, each within the request deadline: with one
/// Sentinel paused (SIGSTOP) a client still connects at once through the others, from a
/// URL (`connect`, with query options); with all of them paused connecting fails with a
/// retryable error once `request_timeout` has passed. A Sentinel password the Sentinels
/// refuse is `InvalidConfig`, and never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_is_bounded_by_the_deadline() {
    let Some(factory) = SentinelFactory::start().await else {
        return;
    };
    let sentinels = factory.deployment.sentinels();
    sentinels.member(0).pause().expect("pause a Sentinel");
    // A grant waits for a replica as long as a request may take (the default is half of
    // it: with 500 ms requests a loaded machine's acknowledgement can take longer, which
    // is not tested here).
    let url = format!(
        "{}?request_timeout=500ms&wait_replicas=1&wait_timeout=500ms",
        factory.deployment.url()
    );
    let err = lock_core::connect(&format!("{url}&sentinel_password=s3cret"))
        .await
        .expect_err("the Sentinels have no password");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    let started = Instant::now();
    let client = lock_core::connect(&url)
        .await
        .expect("connect through the others");
    let connected = started.elapsed();
    assert!(
        connected < Duration::from_millis(400),
        "connected after {connected:?}"
    );
    let guard = client
        .try_lock(name("through_the_others").as_str())
        .await
        .expect("try")
        .expect("free");
    guard.release().await.expect("release");

    for i in 1..sentinels.len() {
        sentinels.member(i).pause().expect("pause a Sentinel");
    }
    let started = Instant::now();
    let err = lock_core::connect(&url)
        .await
        .expect_err("no Sentinel answers");
    let failed = started.elapsed();
    assert!(err.is_retryable(), "{err}");
    assert!(
        failed >= Duration::from_millis(450) && failed < Duration::from_secs(2),
        "failed after {failed:?}"
    );
    println!("one Sentinel paused: connected in {connected:?}; all paused: {err} after {failed:?}");
    for i in 0..sentinels.len() {
        sentinels.member(i).resume().expect("resume");
    }
}

/// A client pointed at a replica (`redis://`, no Sentinel to ask) is refused with a
/// retryable `Unavailable` (`READONLY`, sent once more on a fresh connection, refused
/// again), and the replica keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_a_replica_is_unavailable() {
    let Some(factory) = SentinelFactory::start().await else {
        return;
    };
    let replica = factory.deployment.server(1).addr();
    let client = lock_core::connect(&format!("redis://{replica}"))
        .await
        .expect("a replica answers PING");
    let lock = name("on_a_replica");
    let err = client
        .try_lock(lock.as_str())
        .await
        .expect_err("a replica refuses writes");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.is_retryable() && err.to_string().contains("read only replica"),
        "{err}"
    );
    assert_eq!(key_on(&factory, 1, &lock).await, None);
    assert_eq!(key_on(&factory, 0, &lock).await, None);
}

/// `rediss+sentinel://` end to end: the Sentinels and the data servers serve TLS and speak
/// it to each other (replication and monitoring). A client given only the Sentinels' TLS
/// ports finds the primary at its TLS port, locks, and after the primary is killed follows
/// the failover to the promoted replica's TLS port with a higher fencing token. Those
/// ports refuse plain clients: `redis+sentinel://` to the same Sentinels fails, and so
/// does a plain PING to the primary's TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_locks_over_tls_only_and_follows_a_failover() {
    let Some(factory) = SentinelFactory::start_tls().await else {
        return;
    };
    let deployment = &factory.deployment;
    let url = deployment.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    // The Sentinels name the primary at its TLS port (`primary` matches that address).
    assert_eq!(deployment.primary().await.expect("a primary"), 0);
    let tls_primary = deployment.server(0).client_addr();
    assert_ne!(tls_primary, deployment.server(0).addr());

    let hosts = url
        .strip_prefix("rediss+sentinel://")
        .and_then(|rest| rest.split('/').next())
        .expect("the Sentinels' hosts");
    let plain = format!(
        "redis+sentinel://{hosts}/{}?request_timeout=1s",
        deployment.master_name()
    );
    let err = lock_core::connect(&plain)
        .await
        .expect_err("plain Sentinel discovery on the TLS ports");
    println!("redis+sentinel:// to the TLS ports: {err}");
    let plain_ping = timeout(Duration::from_secs(2), async {
        let client = redis::Client::open(format!("redis://{tls_primary}"))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    })
    .await;
    assert!(
        !matches!(plain_ping, Ok(Ok(_))),
        "the TLS port answered a plain PING"
    );

    let client = lock_core::connect(&format!("{url}&request_timeout=2s"))
        .await
        .expect("connect over TLS");
    let before = client
        .lock_timeout(name("tls_before").as_str(), Duration::from_secs(5))
        .await
        .expect("lock over TLS");
    let token = before.fencing_token();
    before.release().await.expect("release");

    kill_primary(deployment.server(0)).await;
    let promoted = deployment
        .wait_for_new_primary(0, FAILOVER)
        .await
        .expect("failover");
    let after = lock_patiently(&*client, &name("tls_before"), FOLLOW).await;
    assert!(after.fencing_token() > token);
    println!("failover to server {promoted}, followed over TLS");
    after.release().await.expect("release");
}

/// A leader whose grant never reached the replicas is forgotten by a failover: the
/// waiting candidate leads on the promoted replica with a greater term (the clock floor
/// of the token), the old leader turns Lost (`Vanished`) at its next renewal, and an
/// observer that saw the old leader follows to the new one, never reporting an older term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_leader_is_followed_by_a_greater_term() {
    let Some(factory) = SentinelFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(3);
    let lock = name("leader_failover");
    let mut elections = Vec::new();
    for _ in 0..3 {
        let client: Arc<dyn DistributedLock> = factory.make(with_ttl(ttl)).await;
        elections.push(Election::new(client, lock.as_str()).expect("election"));
    }
    let watched = elections.pop().expect("watcher");
    let on_b = elections.pop().expect("b");
    let on_a = elections.pop().expect("a");
    for replica in [1, 2] {
        factory.deployment.server(replica).pause().expect("pause");
    }
    cut_replicas(factory.deployment.server(0).addr()).await;
    let first = on_a
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("a leads");
    let mut observer = watched.observe();
    let seen = observer.next().await.expect("observe").expect("a leads");
    assert_eq!(
        (seen.value_text(), seen.term),
        ("a".to_owned(), first.term())
    );
    let waiting = tokio::spawn(async move {
        on_b.campaign_with("b", &AcquireOptions::timeout(FAILOVER * 2))
            .await
    });

    kill_primary(factory.deployment.server(0)).await;
    for replica in [1, 2] {
        factory.deployment.server(replica).resume().expect("resume");
    }
    factory
        .deployment
        .wait_for_new_primary(0, FAILOVER)
        .await
        .expect("the Sentinels promote a replica");
    let second = waiting
        .await
        .expect("candidate task")
        .expect("campaign")
        .expect("b leads on the promoted replica");
    assert!(
        second.term() > first.term(),
        "terms never go back: {} after {}",
        second.term(),
        first.term()
    );
    let reason = timeout(ttl + FOLLOW, first.lost())
        .await
        .expect("the forgotten leader turns Lost");
    // Vanished if its renewal came before b's grant on the promoted replica, Taken after.
    assert!(
        matches!(reason, LostReason::Vanished | LostReason::Taken),
        "{reason:?}"
    );
    // The observer ends at b; whatever it reports on the way never goes back.
    let mut last = seen.term;
    loop {
        let change = timeout(FOLLOW + ttl, observer.next())
            .await
            .expect("the observer follows the failover")
            .expect("observe");
        let Some(leader) = change else {
            continue;
        };
        assert!(leader.term > last, "an older term after a newer one");
        last = leader.term;
        if leader.value_text() == "b" {
            assert_eq!(leader.term, second.term());
            break;
        }
    }
    second.resign().await.expect("resign");
    drop(first);
}
