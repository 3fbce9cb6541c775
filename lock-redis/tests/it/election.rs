//! Leader elections on Redis beyond the conformance rules: the leader entry beside the
//! lock key (its fields, its TTL kept by renewal, gone with the hold), elections without
//! the queue, a broken leader, and RedLock's quorum view with servers down.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{AcquireOptions, DistributedLock, Election, FencingToken, LockOptions, LostReason};
use lock_redis::{KeyLayout, RedisLock, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use testkit::redis::{config_for, unique_name, with_ttl, RedisFactory};
use tokio::time::{sleep, timeout, Instant};

/// How soon a pushed change must reach a reader whose recheck is 20 s.
const PROMPT: Duration = Duration::from_secs(3);

/// The fields of a leader entry on one server: owner, term, value, version.
type Entry = (Option<String>, Option<u64>, Option<Vec<u8>>, Option<u64>);

async fn entry(conn: &mut MultiplexedConnection, key: &str) -> Entry {
    redis::cmd("HMGET")
        .arg(key)
        .arg("owner")
        .arg("term")
        .arg("value")
        .arg("version")
        .query_async(conn)
        .await
        .expect("HMGET")
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

fn election_on(client: &Arc<RedisLock>, name: &str) -> Election {
    let lock: Arc<dyn DistributedLock> = Arc::clone(client) as Arc<dyn DistributedLock>;
    Election::new(lock, name).expect("election")
}

/// Options whose recheck is long, so that only a push makes a reader act promptly.
fn push_only() -> LockOptions {
    let mut options = LockOptions::default();
    options.recheck = Duration::from_secs(20);
    options
}

/// A grant stores owner, term and value beside the lock key with its TTL, renewal keeps
/// it, a proclaim raises the version, and a resign removes it, on every server.
async fn entry_follows_the_hold(redlock: bool) {
    let Some(factory) = RedisFactory::single_or_redlock(redlock).await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let client = factory.make(with_ttl(ttl)).await;
    let name = unique_name("entry_follows_the_hold");
    let election = election_on(&client, name.as_str());
    let mut leadership = election
        .campaign_with("node-1", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let (lock_key, leader_key) = (keys.lock_key(&name), keys.leader_key(&name));
    let term = leadership.term().get();
    // Past two TTLs: renewal kept both keys.
    sleep(ttl * 2).await;
    let conns = factory.raw_all().await;
    let majority = conns.len() / 2 + 1;
    let (mut held, mut with_term) = (0, 0);
    for mut conn in conns {
        let owner: Option<String> = redis::cmd("GET")
            .arg(&lock_key)
            .query_async(&mut conn)
            .await
            .expect("GET");
        let (entry_owner, entry_term, value, version) = entry(&mut conn, &leader_key).await;
        // RedLock's rounds need a majority; a slower server may miss them.
        if owner.is_none() {
            assert_eq!(entry_owner, None, "no entry without the hold");
            continue;
        }
        held += 1;
        assert_eq!(entry_owner, owner, "the entry names the lock key's owner");
        if entry_term.is_some() {
            assert_eq!(
                entry_term,
                Some(term),
                "the entry's term is the grant's token"
            );
            with_term += 1;
        }
        assert_eq!(value.as_deref(), Some(&b"node-1"[..]));
        assert_eq!(version, Some(0));
        let left = pttl(&mut conn, &leader_key).await;
        assert!(
            left > 0 && left <= 1000,
            "the entry carries the lock's TTL, renewed with it: PTTL {left}"
        );
    }
    assert!(held >= majority, "the hold is on {held} servers");
    assert!(with_term >= majority, "the term is on {with_term} servers");
    let leader = election.leader().await.expect("read").expect("a leader");
    assert_eq!(
        (leader.term, leader.value.as_slice()),
        (FencingToken(term), &b"node-1"[..])
    );
    let since = leader.since.expect("the grant's server time");
    let ago = std::time::SystemTime::now()
        .duration_since(since)
        .unwrap_or_default();
    assert!(ago < Duration::from_secs(30), "led since {ago:?}");
    leadership.proclaim("node-1b").await.expect("proclaim");
    leadership.proclaim("node-1c").await.expect("proclaim");
    for mut conn in factory.raw_all().await {
        let (entry_owner, entry_term, value, version) = entry(&mut conn, &leader_key).await;
        if entry_owner.is_none() {
            continue;
        }
        assert!(
            entry_term.is_none_or(|t| t == term),
            "a proclaim keeps the term"
        );
        assert_eq!(value.as_deref(), Some(&b"node-1c"[..]));
        assert_eq!(version, Some(2));
    }
    leadership.resign().await.expect("resign");
    for mut conn in factory.raw_all().await {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&leader_key)
            .query_async(&mut conn)
            .await
            .expect("EXISTS");
        assert_eq!(exists, 0, "the entry goes with the hold");
    }
    assert_eq!(election.leader().await.expect("read"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_follows_the_hold_single() {
    entry_follows_the_hold(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_follows_the_hold_redlock() {
    entry_follows_the_hold(true).await;
}

/// Without the queue (`?queue=off`) a resign hands over by push, and an observer sees
/// each leader and vacancy by push too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_without_the_queue_are_pushed() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let addrs = factory.servers.addrs();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut config = config_for(&addrs, false, push_only());
        config.queue = false;
        clients.push(Arc::new(RedisLock::connect(config).await.expect("connect")));
    }
    let name = unique_name("without_the_queue");
    let (on_a, on_b, watched) = (
        election_on(&clients[0], name.as_str()),
        election_on(&clients[1], name.as_str()),
        election_on(&clients[2], name.as_str()),
    );
    let mut observer = watched.observe();
    assert_eq!(observer.next().await.expect("observe"), None);
    let first = on_a
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let seen = timeout(PROMPT, observer.next())
        .await
        .expect("the grant is pushed")
        .expect("observe")
        .expect("a leads");
    assert_eq!((seen.value_text(), seen.term), ("a".into(), first.term()));
    let waiting = tokio::spawn(async move {
        let led = on_b
            .campaign_with("b", &AcquireOptions::timeout(Duration::from_secs(30)))
            .await;
        (led, Instant::now())
    });
    sleep(Duration::from_millis(200)).await;
    let first_term = first.term();
    let resigned_at = Instant::now();
    first.resign().await.expect("resign");
    let (second, led_at) = waiting.await.expect("waiting candidate");
    let second = second.expect("campaign").expect("b leads");
    assert!(
        led_at - resigned_at < PROMPT,
        "the hand-over must be pushed"
    );
    assert!(second.term() > first_term);
    // The vacancy may be folded into the next leader; the next leader is reported.
    let deadline = Instant::now() + PROMPT;
    loop {
        let change = timeout(deadline - Instant::now(), observer.next())
            .await
            .expect("the hand-over is pushed")
            .expect("observe");
        if let Some(leader) = change {
            assert_eq!(
                (leader.value_text(), leader.term),
                ("b".into(), second.term())
            );
            break;
        }
    }
    second.resign().await.expect("resign");
}

/// Breaking a leader returns its term and value, removes its entry, tells observers by
/// push and turns the leader Lost (`Broken`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_leader_shows_and_removes_its_entry() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let leader_client = factory.make(with_ttl(Duration::from_secs(1))).await;
    let operator = factory.make(push_only()).await;
    let name = unique_name("break_leader");
    let election = election_on(&leader_client, name.as_str());
    let watched = election_on(&operator, name.as_str());
    let leadership = election
        .campaign_with("10.0.0.7:80", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let mut observer = watched.observe();
    let seen = observer.next().await.expect("observe").expect("a leader");
    assert_eq!(seen.term, leadership.term());
    let occupancy = operator.inspect(&name).await.expect("inspect");
    let holder = occupancy.holder.expect("held");
    assert_eq!(holder.fencing_token, Some(leadership.term()));
    assert_eq!(holder.value.as_deref(), Some(&b"10.0.0.7:80"[..]));
    let broken = operator
        .force_release(&name)
        .await
        .expect("break")
        .expect("a holder was removed");
    assert_eq!(broken.fencing_token, Some(leadership.term()));
    assert_eq!(broken.value.as_deref(), Some(&b"10.0.0.7:80"[..]));
    let change = timeout(PROMPT, observer.next())
        .await
        .expect("the break is pushed")
        .expect("observe");
    assert_eq!(change, None, "nobody leads after the break");
    let reason = timeout(Duration::from_secs(1) + PROMPT, leadership.lost())
        .await
        .expect("the broken leader turns Lost");
    assert_eq!(reason, LostReason::Broken);
    drop((leadership, observer));
    let deadline = Instant::now() + PROMPT;
    loop {
        let left = conformance::Factory::leftovers(&factory, std::slice::from_ref(&name)).await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

/// RedLock with two of five servers down: the leader's term and value are still read
/// from the majority, a proclaim still lands, and a new campaign is refused while it
/// leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_reads_the_leader_from_a_majority() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(2));
    options.request_timeout = Duration::from_secs(1);
    let a = factory.make(options.clone()).await;
    let b = factory.make(options).await;
    let name = unique_name("redlock_majority");
    let (on_a, on_b) = (
        election_on(&a, name.as_str()),
        election_on(&b, name.as_str()),
    );
    let mut leadership = on_a
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    // A grant needs only a majority: under load a slow server may have missed it. The two
    // servers killed are those without the hold where there are any, so that the hold
    // stays on a majority of the five, as the rule assumes.
    let lock_key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&name);
    let mut without_hold_first = Vec::new();
    for (index, mut conn) in factory.raw_all().await.into_iter().enumerate() {
        let owner: Option<String> = redis::cmd("GET")
            .arg(&lock_key)
            .query_async(&mut conn)
            .await
            .expect("GET");
        without_hold_first.push((owner.is_some(), index));
    }
    without_hold_first.sort();
    let controls = factory.servers.controls();
    for &(_, index) in &without_hold_first[..2] {
        controls[index].kill9().await.expect("kill");
    }
    let leader = on_b.leader().await.expect("read").expect("a leader");
    assert_eq!(
        (leader.value_text(), leader.term),
        ("a".into(), leadership.term())
    );
    leadership
        .proclaim("a2")
        .await
        .expect("proclaim on a majority");
    let leader = on_b.leader().await.expect("read").expect("a leader");
    assert_eq!(
        (leader.value_text(), leader.term),
        ("a2".into(), leadership.term())
    );
    assert!(on_b
        .campaign_with("b", &AcquireOptions::try_once())
        .await
        .expect("try")
        .is_none());
    assert!(leadership.is_leader(), "a majority keeps renewing");
    leadership.resign().await.expect("resign");
    assert_eq!(on_b.leader().await.expect("read"), None);
}

/// A mutex on an election's name leads it, as on every backend (see
/// [`lab::kinds::a_mutex_on_an_elections_name_leads`]).
async fn a_mutex_on_an_elections_name_leads(redlock: bool) {
    let Some(factory) = RedisFactory::single_or_redlock(redlock).await else {
        return;
    };
    let client = factory.make(with_ttl(Duration::from_secs(5))).await;
    let name = unique_name("mutex_leads");
    lab::kinds::a_mutex_on_an_elections_name_leads(client, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_on_an_elections_name_leads_single() {
    a_mutex_on_an_elections_name_leads(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_on_an_elections_name_leads_redlock() {
    a_mutex_on_an_elections_name_leads(true).await;
}

/// A leader entry lost behind the leader's back (evicted) and recreated by its next
/// proclaim still shows the leader: readers see its term and new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_entry_was_evicted_keeps_the_term() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let client = factory.make(with_ttl(Duration::from_secs(5))).await;
    let name = unique_name("proclaim_evicted");
    let election = election_on(&client, name.as_str());
    let mut leadership = election
        .campaign_with("first", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let mut conn = factory.raw_all().await.remove(0);
    let _: () = redis::cmd("DEL")
        .arg(KeyLayout::new(DEFAULT_PREFIX).leader_key(&name))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    leadership.proclaim("second").await.expect("proclaim");
    let leader = election.leader().await.expect("leader");
    let shown = leader.as_ref().map(|l| (l.term, l.value_text()));
    assert_eq!(shown, Some((leadership.term(), "second".to_owned())));
    leadership.resign().await.expect("resign");
}
