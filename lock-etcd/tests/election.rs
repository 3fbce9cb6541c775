//! Elections on etcd beyond the conformance rules: the change feed (in place when
//! `changes` returns, its watch cancelled on drop) and one client campaigning twice on
//! one name.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{plain_client, raw_client, single, EtcdctlElect};
use etcd_client::PutOptions;
use lock_core::raw::Backend;
use lock_core::{AcquireOptions, Election, LockName, ReleaseOutcome};
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
        .campaign("first", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let second = tokio::spawn({
        let election = election.clone();
        async move {
            election
                .campaign("second", &AcquireOptions::timeout(Duration::from_secs(20)))
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

/// A mutex on an election's name leads it, as on every backend (see
/// [`lab::kinds::a_mutex_on_an_elections_name_leads`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "etcd shows a mutex holder's owner token as the leader's value, not an empty one"]
async fn a_mutex_on_an_elections_name_leads() {
    let Some(server) = single().await else {
        return;
    };
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = LockName::new(plain_name()).expect("name");
    lab::kinds::a_mutex_on_an_elections_name_leads(ours, &name).await;
}
