//! ZooKeeper-specific fault behaviour: ensemble members dying under a held lock, the
//! client cut off from the servers (shorter and longer than the session timeout), a
//! connection lost in the middle of the create, and a leader whose session expires.
//! The members' deaths are in `faults/members.rs`.

mod members;

use std::time::Duration;

use harness::proxy::ProxyMode;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, Election, LockName, LockState, LostReason,
    ReleaseOutcome,
};
use testkit::zookeeper::{
    queue, queue_len_reaches, record_states, seen, unique_name, with_ttl, ZkFactory,
};
use tokio::time::{sleep, timeout, Instant};

fn name(tag: &str) -> LockName {
    unique_name(&format!("faults/{tag}"))
}

/// Cut off longer than the session timeout: Suspect, then Lost before anyone else gets
/// the lock; after healing, the client works again on a new session.
async fn cut_off_long(factory: ZkFactory) {
    let ttl = Duration::from_secs(2);
    let (holder, proxies) = factory.proxied_client(with_ttl(ttl)).await;
    let other = factory.zk_client(with_ttl(ttl)).await;
    let lock = name("cut-long");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let states = record_states(&guard);
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let cut_at = Instant::now();
    let next = other
        .lock_timeout(lock.as_str(), ttl * 4)
        .await
        .expect("another client acquires after the session timeout");
    let acquired_at = Instant::now();
    let log = states.lock().expect("log").clone();
    let lost_at = log
        .iter()
        .find(|(_, s)| s.is_lost())
        .map(|(at, _)| *at)
        .unwrap_or_else(|| panic!("not lost when another client acquired: {log:?}"));
    assert!(lost_at <= acquired_at, "lost after the takeover: {log:?}");
    assert!(
        log.iter().any(|(_, s)| *s == LockState::Suspect),
        "suspect before lost: {log:?}"
    );
    assert!(
        lost_at - cut_at >= ttl / 3,
        "lost too early ({:?})",
        lost_at - cut_at
    );
    assert!(matches!(
        guard.watch().lost().await,
        LostReason::Expired | LostReason::SessionExpired
    ));
    eprintln!(
        "cut off at 0; lost at {:?}; other acquired at {:?}; states {:?}",
        lost_at - cut_at,
        acquired_at - cut_at,
        seen(&states)
    );
    next.release().await.expect("release");
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    // Heal: a new session (epoch 2) serves new acquisitions.
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Pass);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while holder.backend().session_epoch() < 2 || holder.backend().session_id().is_none() {
        assert!(Instant::now() < deadline, "no new session after healing");
        sleep(Duration::from_millis(100)).await;
    }
    let again = holder
        .lock_timeout(lock.as_str(), Duration::from_secs(5))
        .await
        .expect("acquire on the new session");
    again.release().await.expect("release");
}

/// Standalone: cut off longer than the session timeout ends in Lost, then a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_longer_than_session_timeout_ends_in_lost() {
    if let Some(factory) = ZkFactory::start().await {
        cut_off_long(factory).await;
    }
}

/// Ensemble: cut off from every member longer than the session timeout ends in Lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_cut_off_longer_than_session_timeout_ends_in_lost() {
    if let Some(factory) = ZkFactory::start_ensemble().await {
        cut_off_long(factory).await;
    }
}

/// Cut off shorter than the session timeout: Suspect while cut off, Held again after,
/// never Lost, and nobody else gets the lock meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_cut_off_keeps_the_lock() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(6);
    let (holder, proxies) = factory.proxied_client(with_ttl(ttl)).await;
    let other = factory.zk_client(with_ttl(ttl)).await;
    let lock = name("cut-short");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let states = record_states(&guard);
    let sid = holder.backend().session_id();
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let cut_at = Instant::now();
    while cut_at.elapsed() < ttl / 2 {
        assert!(
            other.try_lock(lock.as_str()).await.expect("try").is_none(),
            "second holder while cut off"
        );
        sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        guard.state(),
        LockState::Suspect,
        "suspect while cut off: {:?}",
        seen(&states)
    );
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Pass);
    }
    timeout(Duration::from_secs(5), async {
        while guard.state() != LockState::Held {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("held again after healing: {:?}", seen(&states)));
    assert_eq!(holder.backend().session_id(), sid, "same session");
    assert!(other.try_lock(lock.as_str()).await.expect("try").is_none());
    let log = seen(&states);
    assert!(!log.iter().any(|s| s.is_lost()), "never lost: {log:?}");
    assert!(log.contains(&LockState::Suspect), "{log:?}");
    eprintln!("states through a {:?} cut-off: {log:?}", ttl / 2);
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A reply lost in the middle of the create: the outcome of the create is unknown, so
/// the client looks for its node by its uuid and adopts it (owned by its session) rather
/// than queueing a second node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_during_create_adopts_own_node() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    // A long session keeps pings rare (every 3 s idle), so the dropped reply is the create's.
    let mut options = with_ttl(Duration::from_secs(20));
    options.request_timeout = Duration::from_secs(1);
    let (client, proxies) = factory.proxied_client(options).await;
    let other = factory.zk_client(with_ttl(Duration::from_secs(20))).await;
    let proxy = &proxies[0];
    for round in 0..3 {
        let lock = name("protected");
        // A round trip just before, so no ping is due.
        let warm = name("warm");
        client
            .try_lock(warm.as_str())
            .await
            .expect("warm-up")
            .expect("free")
            .release()
            .await
            .expect("release");
        let accepted = proxy.accepted();
        proxy.set_mode(ProxyMode::DropNextReply);
        let started = Instant::now();
        let guard = client
            .lock_timeout(lock.as_str(), Duration::from_secs(15))
            .await
            .expect("acquire through a lost reply");
        let took = started.elapsed();
        let nodes = queue(factory.admin(), &lock).await;
        assert_eq!(nodes.len(), 1, "round {round}: one node only: {nodes:?}");
        assert!(
            took >= Duration::from_secs(1) || proxy.accepted() > accepted,
            "round {round}: the reply was not lost (took {took:?}, no reconnect)"
        );
        eprintln!(
            "round {round}: acquired through a lost create reply in {took:?}, reconnects {}",
            proxy.accepted() - accepted
        );
        assert!(other.try_lock(lock.as_str()).await.expect("try").is_none());
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        assert!(queue(factory.admin(), &lock).await.is_empty());
    }
}

/// A leader cut off longer than the session timeout turns Lost before the next candidate
/// leads; its client's campaigns never lead through a node of the expired session
/// (CURATOR-696): a campaign that waited across the expiry, and a new one, lead only
/// after the new leader resigns, with a greater term, through a node of the new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leader_never_leads_through_an_old_session() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let (cut, proxies) = factory.proxied_client(with_ttl(ttl)).await;
    let other = factory.zk_client(with_ttl(ttl)).await;
    let lock = name("election-expiry");
    let on_cut = Election::new(cut.clone(), lock.as_str()).expect("election");
    let on_other = Election::new(other.clone(), lock.as_str()).expect("election");
    let old_sid = cut.backend().session_id().expect("connected");

    let first = on_cut
        .campaign_with("cut-1", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let states = record_states(first.guard());
    // A second candidate of the same client, queued on the old session.
    let waiting_cut = tokio::spawn({
        let on_cut = Election::new(cut.clone(), lock.as_str()).expect("election");
        async move {
            let led = on_cut
                .campaign_with("cut-2", &AcquireOptions::timeout(Duration::from_secs(60)))
                .await;
            (led, Instant::now())
        }
    });
    queue_len_reaches(&factory, &lock, 2).await;
    let waiting_other = tokio::spawn(async move {
        let led = on_other
            .campaign_with("other", &AcquireOptions::timeout(Duration::from_secs(60)))
            .await;
        (on_other, led, Instant::now())
    });
    queue_len_reaches(&factory, &lock, 3).await;

    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let (on_other, second, other_led_at) = timeout(ttl * 6, waiting_other)
        .await
        .expect("the other candidate leads once the cut-off session expired")
        .expect("campaign task");
    let second = second.expect("campaign").expect("leads");
    let log = states.lock().expect("log").clone();
    let lost_at = log
        .iter()
        .find(|(_, s)| s.is_lost())
        .map(|(at, _)| *at)
        .unwrap_or_else(|| panic!("not lost when the next candidate led: {log:?}"));
    assert!(
        lost_at <= other_led_at,
        "lost after the next one led: {log:?}"
    );
    assert!(second.term() > first.term(), "terms increase");

    // Heal: the client gets a new session; the expired one's nodes are gone.
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Pass);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cut.backend().session_epoch() < 2 || cut.backend().session_id().is_none() {
        assert!(Instant::now() < deadline, "no new session after healing");
        sleep(Duration::from_millis(100)).await;
    }
    let new_sid = cut.backend().session_id().expect("connected");
    assert_ne!(new_sid, old_sid, "a new session");
    assert!(
        on_cut
            .campaign_with("cut-3", &AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "led on the new session while another leads"
    );
    let leader = on_cut.leader().await.expect("read").expect("a leader");
    assert_eq!(
        leader.value_text(),
        "other",
        "the other candidate still leads"
    );
    let other_term = second.term();
    let resigned_at = Instant::now();
    assert_eq!(
        second.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    drop(on_other);

    // The candidate that waited across the expiry starts over on the new session (or gives
    // up); if it leads, it is through a node of the new session, with a greater term.
    let (led, led_at) = timeout(Duration::from_secs(30), waiting_cut)
        .await
        .expect("the waiting campaign ends")
        .expect("campaign task");
    match led {
        Ok(Some(leadership)) => {
            assert!(led_at > resigned_at, "led while the other candidate led");
            assert!(leadership.term() > other_term, "terms increase");
            let leader = on_cut.leader().await.expect("read").expect("a leader");
            assert_eq!(leader.term, leadership.term());
            assert_eq!(
                leader.participant.session,
                Some(format!("0x{new_sid:x}")),
                "led through a node of the new session"
            );
            leadership.resign().await.expect("resign");
        }
        Ok(None) => panic!("a waiting campaign never ends in `None`"),
        Err(err) => eprintln!("the campaign that waited across the expiry gave up: {err}"),
    }
    let again = on_cut
        .campaign_with("cut-4", &AcquireOptions::timeout(Duration::from_secs(10)))
        .await
        .expect("campaign")
        .expect("leads on the new session");
    assert!(again.term() > other_term, "terms increase");
    let leader = on_cut.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.participant.session, Some(format!("0x{new_sid:x}")));
    again.resign().await.expect("resign");
    assert!(queue(factory.admin(), &lock).await.is_empty());
    drop(first);
}

/// A change feed outlives a session expiry (it watches again on the next session and
/// fires at a change made there), and ends, without firing forever or panicking, when
/// its client closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_feed_follows_a_new_session_and_ends_with_the_client() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let (cut, proxies) = factory.proxied_client(with_ttl(ttl)).await;
    let other = factory.zk_client(with_ttl(ttl)).await;
    let lock = name("feed-expiry");
    let mut feed = cut.changes(&lock).await.expect("subscribe");
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    sleep(ttl * 2).await;
    for proxy in proxies.iter() {
        proxy.set_mode(ProxyMode::Pass);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cut.backend().session_epoch() < 2 || cut.backend().session_id().is_none() {
        assert!(Instant::now() < deadline, "no new session after healing");
        sleep(Duration::from_millis(100)).await;
    }
    // Fires for the expiry and the new watch (spurious, allowed): drain them.
    while timeout(Duration::from_millis(500), feed.next())
        .await
        .is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "the feed keeps firing for nothing"
        );
    }
    let guard = other.lock(lock.as_str()).await.expect("acquire");
    timeout(Duration::from_secs(2), feed.next())
        .await
        .expect("the feed fires at a change on the new session");
    guard.release().await.expect("release");
    timeout(Duration::from_secs(2), feed.next())
        .await
        .expect("and at the next");

    cut.close().await.expect("close");
    // Closed: at most the close itself fires, then the feed ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    while feed.is_live() {
        assert!(Instant::now() < deadline, "the feed ends with its client");
        let _ = timeout(Duration::from_millis(200), feed.next()).await;
    }
}
