//! ZooKeeper-specific election behaviour beyond the conformance rules: the change feed's
//! watch and task end with the feed, a candidate whose client also observes the name is
//! handed over by push, and operators see and break an election like a lock.

use std::sync::Arc;
use std::time::Duration;

use lock_core::migration::{is_dual_token, DUAL_TOKEN_PREFIX};
use lock_core::raw::{
    backend::{AcquireRequest, Backend, HoldKind},
    driver::Connect,
};
use lock_core::{
    AcquireOptions, DistributedLock, Election, LockName, LockOptions, LostReason, OwnerToken,
    ReleaseOutcome,
};
use lock_zookeeper::ZkBackend;
use testkit::zookeeper::{config, queue_len_reaches, unique_name, with_ttl, Servers, ZkFactory};
use tokio::runtime::Handle;
use tokio::time::{sleep, timeout, Instant};

/// Options whose recheck is long: a wait that ends promptly was pushed.
fn push_only() -> LockOptions {
    let mut options = with_ttl(Duration::from_secs(10));
    options.recheck = Duration::from_secs(20);
    options
}

/// The server's count of watches (`wchs`: "Total watches:N").
async fn server_watches(factory: &ZkFactory) -> usize {
    let Servers::Single(server) = &*factory.servers else {
        panic!("needs a standalone server");
    };
    let out = server.four_letter("wchs").await.expect("wchs");
    out.lines()
        .find_map(|line| line.strip_prefix("Total watches:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no watch count in {out:?}"))
}

/// Change feeds fire on a change after they were made; dropped, their tasks end and the
/// server forgets their watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_feeds_end_with_their_watch_when_dropped() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let client = factory.zk_client(push_only()).await;
    let name = unique_name("election/feed");
    let writer = Election::new(client.clone(), name.as_str()).expect("election");
    // Settle the client's own tasks and watches first.
    writer
        .campaign_with("warm", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads")
        .resign()
        .await
        .expect("resign");
    sleep(Duration::from_millis(300)).await;
    let tasks = Handle::current().metrics().num_alive_tasks();
    let watches = server_watches(&factory).await;

    let mut feeds = Vec::new();
    for _ in 0..5 {
        feeds.push(client.changes(&name).await.expect("subscribe"));
    }
    assert!(
        server_watches(&factory).await > watches,
        "a watch on the server"
    );
    let leadership = writer
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    for feed in &mut feeds {
        timeout(Duration::from_secs(2), feed.next())
            .await
            .expect("a feed fires at a grant after it was made");
    }
    drop(feeds);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Handle::current().metrics().num_alive_tasks() > tasks {
        assert!(
            Instant::now() < deadline,
            "the feeds' tasks end within 10 s"
        );
        sleep(Duration::from_millis(50)).await;
    }
    while server_watches(&factory).await > watches {
        assert!(
            Instant::now() < deadline,
            "the server forgets the feeds' watch within 10 s"
        );
        sleep(Duration::from_millis(50)).await;
    }
    leadership.resign().await.expect("resign");
}

/// A candidate waits on a client that also follows the name's changes (a persistent
/// recursive watch on the directory beside its one-shot watch on its predecessor): the
/// resign still reaches it by push, and the observer sees the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_on_an_observing_client_is_handed_over_by_push() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = unique_name("election/observing");
    let first: Arc<dyn DistributedLock> = factory.zk_client(push_only()).await;
    let second: Arc<dyn DistributedLock> = factory.zk_client(push_only()).await;
    let on_first = Election::new(first, name.as_str()).expect("election");
    let on_second = Election::new(second, name.as_str()).expect("election");
    let leadership = on_first
        .campaign_with("first", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let mut observer = on_second.observe();
    let seen = timeout(Duration::from_secs(5), observer.next())
        .await
        .expect("the current state")
        .expect("observe")
        .expect("a leader");
    assert_eq!(seen.value_text(), "first");
    let waiting = tokio::spawn(async move {
        let led = on_second
            .campaign_with("second", &AcquireOptions::timeout(Duration::from_secs(30)))
            .await;
        (led, Instant::now())
    });
    queue_len_reaches(&factory, &name, 2).await;
    sleep(Duration::from_millis(300)).await;
    let resigned_at = Instant::now();
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    let (led, led_at) = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("handed over by push, not at the 20 s recheck")
        .expect("campaign task");
    let led = led.expect("campaign").expect("leads");
    eprintln!("hand-over by push in {:?}", led_at - resigned_at);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let change = timeout(deadline - Instant::now(), observer.next())
            .await
            .expect("the observer sees the new leader by push")
            .expect("observe");
        if change
            .as_ref()
            .is_some_and(|leader| leader.value_text() == "second")
        {
            assert_eq!(change.expect("leader").term, led.term());
            break;
        }
    }
    led.resign().await.expect("resign");
}

/// An election's name is listed, inspected (the leader with its value and term, the other
/// candidates with theirs, in order) and broken like a lock's: the broken leader turns
/// Lost (Broken), the next candidate leads by push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_and_break_an_election() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let name = LockName::new(format!("{}/x", unique_name("election/ops").as_str())).expect("name");
    let operator = factory.zk_client(push_only()).await;
    let mut elections = Vec::new();
    for _ in 0..3 {
        let client: Arc<dyn DistributedLock> = factory.zk_client(push_only()).await;
        elections.push(Election::new(client, name.as_str()).expect("election"));
    }
    let leadership = elections[0]
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let mut waiting = Vec::new();
    for (i, value) in [(1, "b"), (2, "c")] {
        let election = elections[i].clone();
        waiting.push(tokio::spawn(async move {
            election
                .campaign_with(value, &AcquireOptions::timeout(Duration::from_secs(30)))
                .await
        }));
        queue_len_reaches(&factory, &name, i + 1).await;
    }
    let occupancy = operator.inspect(&name).await.expect("inspect");
    let holder = occupancy.holder.expect("a leader");
    assert_eq!(holder.value.as_deref(), Some(&b"a"[..]));
    assert_eq!(holder.fencing_token, Some(leadership.term()));
    let values: Vec<Option<&[u8]>> = occupancy
        .waiters
        .iter()
        .map(|w| w.value.as_deref())
        .collect();
    assert_eq!(values, [Some(&b"b"[..]), Some(&b"c"[..])]);
    let prefix = name.as_str().trim_end_matches("/x");
    assert_eq!(
        operator.list(prefix).await.expect("list"),
        std::slice::from_ref(&name),
        "the election is listed"
    );

    let broken = operator
        .force_release(&name)
        .await
        .expect("break")
        .expect("a leader to break");
    assert_eq!(broken.fencing_token, Some(leadership.term()));
    let reason = timeout(Duration::from_secs(10), leadership.lost())
        .await
        .expect("the broken leader turns Lost");
    assert_eq!(reason.without_side(), LostReason::Broken);
    let next = timeout(Duration::from_secs(5), waiting.remove(0))
        .await
        .expect("the next candidate leads by push")
        .expect("campaign task")
        .expect("campaign")
        .expect("leads");
    assert!(next.term() > leadership.term());
    assert_eq!(
        operator
            .inspect(&name)
            .await
            .expect("inspect")
            .holder
            .and_then(|h| h.value),
        Some(b"b".to_vec())
    );
    drop(leadership);
    next.resign().await.expect("resign");
    let last = timeout(Duration::from_secs(5), waiting.remove(0))
        .await
        .expect("the last candidate leads")
        .expect("campaign task")
        .expect("campaign")
        .expect("leads");
    last.resign().await.expect("resign");
}

/// A dual (migration) campaign's node carries the dual lock's `dual-` owner token in its
/// protected id (`_c_dual-<uuid>-latch-<seq>`), which inspect shows beside the value, so
/// the advance check sights dual candidates as it sights dual lock holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_candidate_is_marked_like_a_dual_holder() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let backend = ZkBackend::open(config(factory.servers.hosts(), push_only()))
        .await
        .expect("connect");
    let name = unique_name("election/dual");
    let dual = OwnerToken::from_string(format!("{DUAL_TOKEN_PREFIX}{}", OwnerToken::generate()));
    let plain = OwnerToken::generate();
    let kind = |value: &str| HoldKind::Candidate {
        value: value.as_bytes().to_vec(),
    };
    let (dual_kind, plain_kind) = (kind("dual"), kind("plain"));
    let request = |token, kind, wait| AcquireRequest {
        name: &name,
        token,
        ttl: Duration::from_secs(10),
        wait,
        fence_at_least: None,
        kind,
    };
    let leader = backend
        .acquire(request(&dual, &dual_kind, false))
        .await
        .expect("campaign")
        .expect("leads");
    assert!(
        leader.hold.path().contains("/_c_dual-"),
        "{}",
        leader.hold.path()
    );
    assert!(
        leader.hold.path().contains("-latch-"),
        "{}",
        leader.hold.path()
    );
    assert!(backend
        .acquire(request(&plain, &plain_kind, false))
        .await
        .expect("try")
        .is_none());
    let occupancy = backend.inspect(&name).await.expect("inspect");
    let holder = occupancy.holder.expect("a leader");
    let owner = holder.owner_token.as_deref().expect("an owner token");
    assert!(is_dual_token(owner), "{owner}");
    assert_eq!(owner, dual.as_str());
    assert_eq!(holder.value.as_deref(), Some(&b"dual"[..]));
    assert_eq!(holder.fencing_token, Some(leader.fencing_token));
    backend.release(&leader.hold).await.expect("release");
    backend.close().await.expect("close");
}

/// A mutex on an election's name leads it, as on every backend (see
/// [`lab::kinds::a_mutex_on_an_elections_name_leads`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_on_an_elections_name_leads() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let client = factory.zk_client(with_ttl(Duration::from_secs(5))).await;
    let name = unique_name("election/mutex_leads");
    lab::kinds::a_mutex_on_an_elections_name_leads(client, &name).await;
}
