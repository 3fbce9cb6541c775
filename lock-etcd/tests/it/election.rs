//! Elections on etcd beyond the conformance rules: the change feed (in place when
//! `changes` returns, its watch cancelled on drop), one client campaigning twice on
//! one name, and proposals shaped like the entries of other kinds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::PutOptions;
use lock_core::raw::backend::Backend;
use lock_core::{
    AcquireOptions, DistributedLock, Election, ErrorKind, LockName, ReleaseOutcome, RwLock,
    Semaphore,
};
use lock_etcd::EtcdLock;
use testkit::etcd::{plain_client, raw_client, single, EtcdctlElect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

fn plain_name() -> String {
    format!("election-{}", uuid::Uuid::new_v4().simple())
}

/// The number of watchers etcd at `addr` has (its `etcd_debugging_mvcc_watcher_total`
/// gauge, from `/metrics` on the client port).
async fn watchers(addr: SocketAddr) -> u64 {
    let mut stream = TcpStream::connect(addr).await.expect("connect for metrics");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the metrics request");
    let mut answer = String::new();
    timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .expect("metrics answer in time")
        .expect("read metrics");
    let line = answer
        .lines()
        .find(|line| line.starts_with("etcd_debugging_mvcc_watcher_total "))
        .expect("the watcher gauge");
    let value = line.rsplit(' ').next().expect("a value");
    // Prometheus prints a gauge as a float; a count of watchers is a whole number.
    let value = value.strip_suffix(".0").unwrap_or(value);
    value.parse().expect("a whole number of watchers")
}

/// A feed fires for a put made right after `changes` returns (its watch is in place), for
/// a put in the range by anyone, and for a delete; each dropped feed's watcher is gone
/// from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_feed_is_in_place_and_cancelled_on_drop() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours = plain_client(server.addr()).await;
    let name = LockName::new(plain_name()).expect("name");
    let key = format!("{name}/1f");
    let before = watchers(server.addr()).await;

    let mut feeds = Vec::new();
    for _ in 0..3 {
        feeds.push(ours.backend().changes(&name).await.expect("subscribe"));
    }
    assert!(feeds.iter().all(|feed| feed.is_live()));
    // Right after `changes` returned: the put must come on every feed.
    let mut kv = admin.kv_client();
    kv.put(key.as_str(), "v", None::<PutOptions>)
        .await
        .expect("put");
    for feed in &mut feeds {
        timeout(Duration::from_secs(2), feed.next())
            .await
            .expect("the put right after changes() fires the feed");
    }
    kv.delete(key.as_str(), None).await.expect("delete");
    for feed in &mut feeds {
        timeout(Duration::from_secs(2), feed.next())
            .await
            .expect("a delete fires the feed");
    }
    // A key outside the range does not.
    kv.put(format!("{name}x/1f"), "v", None::<PutOptions>)
        .await
        .expect("put outside");
    assert!(
        timeout(Duration::from_millis(300), feeds[0].next())
            .await
            .is_err(),
        "a key of another name fired the feed"
    );

    assert!(
        watchers(server.addr()).await >= before + 3,
        "each feed has a watcher on the server"
    );
    drop(feeds);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = watchers(server.addr()).await;
        if now <= before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dropped feeds left {} watchers on the server",
            now - before
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// One client campaigning twice on one name: the second campaign queues under
/// `<lease hex>_1` behind the first, `etcdctl elect -l` shows the first as the leader,
/// and the second leads only once the first resigns, with a greater term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_campaigning_twice_leads_once_at_a_time() {
    let Some(server) = single().await else {
        return;
    };
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = plain_name();
    let election = Election::new(ours.clone(), &name).expect("election");
    let first = election
        .campaign_with("first", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let second = tokio::spawn({
        let election = election.clone();
        async move {
            election
                .campaign_with("second", &AcquireOptions::timeout(Duration::from_secs(20)))
                .await
                .expect("campaign")
                .expect("leads after the first resigns")
        }
    });
    let lease = ours.backend().lease_id().expect("a live lease");
    let mut listener = EtcdctlElect::listen(server.addr(), &name);
    assert_eq!(
        listener.next_leader(Duration::from_secs(10)).await,
        Some((format!("{name}/{lease:x}"), "first".to_owned()))
    );
    let occupancy = ours
        .backend()
        .inspect(&LockName::new(name.as_str()).expect("name"))
        .await
        .expect("inspect");
    assert_eq!(occupancy.waiters.len(), 1, "{occupancy:?}");
    assert_eq!(
        occupancy.waiters[0].value.as_deref(),
        Some(&b"second"[..]),
        "the second campaign waits under a key of its own"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "two leaders in one client");
    let first_term = first.term();
    assert_eq!(
        first.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    let second = timeout(Duration::from_secs(5), second)
        .await
        .expect("the second campaign leads promptly")
        .expect("campaign task");
    assert!(second.term() > first_term);
    assert_eq!(
        listener.next_leader(Duration::from_secs(5)).await,
        Some((format!("{name}/{lease:x}_1"), "second".to_owned())),
        "etcdctl elect -l follows to the second campaign's key"
    );
    second.resign().await.expect("resign");
    listener.interrupt().await;
}

/// Proposals shaped like what the entries of a mutex (an owner token, a dual lock's
/// too), a reader, a writer and a permit of 2 store.
fn tag_shaped() -> [String; 5] {
    let token = uuid::Uuid::new_v4();
    [
        token.to_string(),
        format!("dual-{token}"),
        format!("read/{token}"),
        format!("write/{token}"),
        format!("permit/2/{token}"),
    ]
}

/// While a candidate proposing `value` leads `name`: `leader()` shows `value` exactly (and
/// no owner token), a later candidate's try finds a leader (no conflict), and a reader, a
/// writer and a permit of 2 on the name are each refused as another primitive (none holds
/// beside the leader).
async fn leads_as_a_proposal(lock: &Arc<EtcdLock>, name: &str, value: &str) {
    let election = Election::new(lock.clone(), name).expect("election");
    // Every way it goes wrong, not only the first.
    let mut wrong = Vec::new();
    let leader = election.leader().await.expect("read").expect("a leader");
    if leader.value_text() != value || leader.participant.owner_token.is_some() {
        wrong.push(format!("leader() shows {leader:?}"));
    }
    let later = election
        .campaign_with("later", &AcquireOptions::try_once())
        .await;
    if !matches!(later, Ok(None)) {
        wrong.push(format!("a later candidate's try: {later:?}"));
    }
    let shared: Arc<dyn DistributedLock> = lock.clone();
    let rw = RwLock::new(Arc::clone(&shared), name).expect("rwlock");
    let sem = Semaphore::new(shared, name, 2).expect("semaphore");
    let once = AcquireOptions::try_once();
    let tries = [
        (
            "a reader",
            rw.read_with(&once).await.map(|held| held.is_some()),
        ),
        (
            "a writer",
            rw.write_with(&once).await.map(|held| held.is_some()),
        ),
        (
            "a permit",
            sem.acquire_with(&once).await.map(|held| held.is_some()),
        ),
    ];
    for (what, tried) in tries {
        if !matches!(&tried, Err(err) if err.kind() == ErrorKind::Conflict) {
            wrong.push(format!("{what}: {tried:?}"));
        }
    }
    assert!(wrong.is_empty(), "leading with {value}: {wrong:#?}");
}

/// A campaign whose proposal reads like a mutex's, a reader's, a writer's or a permit's
/// entry is a candidate like any other: see [`leads_as_a_proposal`]; and a campaign of another
/// client waits behind it, then leads once it resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_shaped_proposals_are_plain_values() {
    let Some(server) = single().await else {
        return;
    };
    let first = Arc::new(plain_client(server.addr()).await);
    let other = Arc::new(plain_client(server.addr()).await);
    for value in tag_shaped() {
        let name = plain_name();
        let election = Election::new(first.clone(), &name).expect("election");
        let leadership = election
            .campaign_with(value.as_str(), &AcquireOptions::try_once())
            .await
            .expect("campaign")
            .expect("leads a free election");
        leads_as_a_proposal(&first, &name, &value).await;
        let next = tokio::spawn({
            let election = Election::new(other.clone(), &name).expect("election");
            async move {
                election
                    .campaign_with("next", &AcquireOptions::timeout(Duration::from_secs(20)))
                    .await
            }
        });
        sleep(Duration::from_millis(300)).await;
        assert!(!next.is_finished(), "a second leader beside {value}");
        leadership.resign().await.expect("resign");
        let next = timeout(Duration::from_secs(5), next)
            .await
            .expect("the next candidate leads promptly")
            .expect("campaign task")
            .expect("campaign")
            .expect("leads");
        let leader = election.leader().await.expect("read").expect("a leader");
        assert_eq!(leader.value_text(), "next");
        next.resign().await.expect("resign");
    }
}

/// A leader proclaiming a value that reads like a mutex's, a reader's, a writer's or a
/// permit's entry stays a candidate like any other (see [`leads_as_a_proposal`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_shaped_proclaims_are_plain_values() {
    let Some(server) = single().await else {
        return;
    };
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = plain_name();
    let election = Election::new(ours.clone(), &name).expect("election");
    let mut leadership = election
        .campaign_with("plain", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads a free election");
    for value in tag_shaped() {
        leadership.proclaim(value.as_str()).await.expect("proclaim");
        leads_as_a_proposal(&ours, &name, &value).await;
        assert!(leadership.is_leader());
    }
    leadership.resign().await.expect("resign");
}

/// A mutex on an election's name leads it, as on every backend (see
/// [`lab::kinds::a_mutex_on_an_elections_name_leads`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_on_an_elections_name_leads() {
    let Some(server) = single().await else {
        return;
    };
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = LockName::new(plain_name()).expect("name");
    lab::kinds::a_mutex_on_an_elections_name_leads(ours, &name).await;
}
