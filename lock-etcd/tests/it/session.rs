//! The etcd session: one lease per client, the key layout, turn-taking inside one
//! client, waiters and holds whose key or lease disappears, authentication.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conformance::FencedResource;
use etcd_client::LeaseTimeToLiveOptions;
use futures::future::join_all;
use lock_core::{DistributedLockExt, ErrorKind, LockName, LostReason, ReleaseOutcome};
use lock_etcd::EtcdConfig;
use testkit::etcd::{client, enable_auth, keys_under, raw_client, single, with_ttl, PREFIX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

fn range(name: &str) -> String {
    EtcdConfig::default()
        .with_prefix(PREFIX)
        .lock_prefix(&LockName::new(name).expect("valid"))
}

/// Every hold of a client lives on the client's one lease, under
/// `<prefix>/<escaped name>/<lease hex>.kind`, with the key's create revision as fencing token;
/// closing the client revokes the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lease_per_client_and_the_mutex_layout() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let locks = client(&[server.addr()], with_ttl(Duration::from_secs(5))).await;
    let names = ["layout/a", "layout/b", "plain"];
    let mut guards = Vec::new();
    for name in names {
        guards.push(locks.lock(name).await.expect("acquire"));
    }
    let lease = locks.backend().lease_id().expect("a live lease");
    for (name, guard) in names.iter().zip(&guards) {
        let keys = keys_under(&admin, &range(name)).await;
        let expected = format!("{}{lease:x}.kind", range(name));
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(keys[0].0, expected);
        assert_eq!(
            guard.fencing_token().get(),
            u64::try_from(keys[0].1).expect("positive"),
            "fencing token is the create revision"
        );
    }
    assert_eq!(range("layout/a"), "conformance/layout%2Fa/");
    let mut leases = admin.lease_client();
    let live = leases
        .time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .expect("lease time-to-live");
    assert_eq!(live.keys().len(), names.len(), "all holds on one lease");
    assert_eq!(
        admin
            .lease_client()
            .leases()
            .await
            .expect("leases")
            .leases()
            .len(),
        1
    );

    for guard in guards {
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    drop(locks);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = admin.lease_client().leases().await.expect("leases");
        if left.leases().iter().all(|l| l.id() != lease) {
            break;
        }
        assert!(Instant::now() < deadline, "the lease outlived its client");
        sleep(Duration::from_millis(50)).await;
    }
}

/// Acquisitions of one name on one client queue under keys of their own: mutual
/// exclusion holds across tasks of one client and another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_on_one_client_takes_turns() {
    let Some(server) = single().await else {
        return;
    };
    let shared = client(&[server.addr()], with_ttl(Duration::from_secs(5))).await;
    let other = client(&[server.addr()], with_ttl(Duration::from_secs(5))).await;
    let resource = FencedResource::new();

    let first = shared.lock("turns").await.expect("acquire");
    let second = tokio::spawn({
        let shared = Arc::clone(&shared);
        async move { shared.lock("turns").await.expect("second acquire") }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "a second local acquire waits its turn"
    );
    assert!(
        shared.try_lock("turns").await.expect("try").is_none(),
        "a local try while held is refused"
    );
    let token = first.fencing_token();
    first.release().await.expect("release");
    let second = timeout(Duration::from_secs(3), second)
        .await
        .expect("second local acquire follows promptly")
        .expect("task");
    assert!(second.fencing_token() > token);
    second.release().await.expect("release");

    let mut tasks = Vec::new();
    for locks in [&shared, &shared, &shared, &other] {
        let (locks, resource) = (Arc::clone(locks), resource.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let guard = locks
                    .lock_timeout("turns", Duration::from_secs(30))
                    .await
                    .expect("acquire under contention");
                let written = resource
                    .hold_section(&guard, sleep(Duration::from_millis(2)))
                    .await;
                assert_eq!(written, Ok(true), "the holder's write is accepted");
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender");
    }
    let report = resource.check();
    assert!(report.is_safe(), "{report:?}");
    assert_eq!(report.sections, 32);
    assert_eq!(report.counter, 32);
}

/// A second acquisition of one name on one client queues on the server at once, under
/// a key of its own, so it keeps its FIFO place ahead of a later waiter of another
/// client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_local_waiter_keeps_its_place_on_the_server() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let local = client(&[server.addr()], with_ttl(Duration::from_secs(5))).await;
    let remote = client(&[server.addr()], with_ttl(Duration::from_secs(5))).await;
    let name = "fifo/local-second";
    let granted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiter = |locks: Arc<lock_etcd::EtcdLock>, who: &'static str| {
        let granted = Arc::clone(&granted);
        tokio::spawn(async move {
            let guard = locks
                .lock_timeout(name, Duration::from_secs(20))
                .await
                .expect("acquire");
            granted.lock().expect("order").push(who);
            sleep(Duration::from_millis(200)).await;
            guard.release().await.expect("release");
        })
    };

    let first = local.lock(name).await.expect("acquire");
    let second = waiter(Arc::clone(&local), "second local");
    sleep(Duration::from_millis(300)).await;
    let later = waiter(Arc::clone(&remote), "remote");
    sleep(Duration::from_millis(300)).await;
    let queued = keys_under(&admin, &range(name)).await;
    first.release().await.expect("release");
    for task in [second, later] {
        timeout(Duration::from_secs(20), task)
            .await
            .expect("both waiters get the lock")
            .expect("waiter");
    }
    let order = granted.lock().expect("order").clone();
    eprintln!("queued keys {queued:?}; granted {order:?}");
    assert_eq!(
        order,
        ["second local", "remote"],
        "FIFO across clients; queued keys {queued:?}"
    );
    assert_eq!(
        queued.len(),
        3,
        "every waiter queues on the server: {queued:?}"
    );
    let lease = local.backend().lease_id().expect("a live lease");
    assert_eq!(queued[0].0, format!("{}{lease:x}.kind", range(name)));
    assert_eq!(queued[1].0, format!("{}{lease:x}_1.kind", range(name)));

    // A second local acquire that gives up leaves nothing behind.
    let held = local.lock(name).await.expect("acquire");
    let gave_up = local.lock_timeout(name, Duration::from_millis(300)).await;
    assert_eq!(gave_up.expect_err("times out").kind(), ErrorKind::Timeout);
    let deadline = Instant::now() + Duration::from_secs(5);
    while keys_under(&admin, &range(name)).await.len() > 1 && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(keys_under(&admin, &range(name)).await.len(), 1);
    held.release().await.expect("release");
    assert!(keys_under(&admin, &range(name)).await.is_empty());
}

/// A waiter whose own key disappears stops waiting with a Lost error instead of
/// waiting forever on a key that no longer queues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_vanishes_stops() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let holder = client(&[server.addr()], with_ttl(Duration::from_secs(5))).await;
    let mut options = with_ttl(Duration::from_secs(5));
    options.recheck = Duration::from_millis(300);
    let waiter = client(&[server.addr()], options).await;
    let guard = holder.lock("vanish").await.expect("acquire");
    let waiting = tokio::spawn(async move { waiter.lock("vanish").await });
    let deadline = Instant::now() + Duration::from_secs(5);
    let waiter_key = loop {
        let keys = keys_under(&admin, &range("vanish")).await;
        if let Some((key, _)) = keys
            .iter()
            .max_by_key(|(_, revision)| *revision)
            .filter(|_| keys.len() == 2)
        {
            break key.clone();
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        sleep(Duration::from_millis(20)).await;
    };
    admin
        .kv_client()
        .delete(waiter_key.as_str(), None)
        .await
        .expect("delete the waiter's key");
    let outcome = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter stops within its re-check interval")
        .expect("task");
    let err = outcome.expect_err("the waiter must not acquire");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(guard.is_held(), "the holder is untouched");
    guard.release().await.expect("release");
}

/// A lease revoked behind the client's back ends every hold on it (session expired or
/// key gone) within the renewal interval; the next acquire gets a new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_ends_every_hold_and_a_new_one_follows() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ttl = Duration::from_secs(3);
    let locks = client(&[server.addr()], with_ttl(ttl)).await;
    let a = locks.lock("revoke/a").await.expect("acquire a");
    let b = locks.lock("revoke/b").await.expect("acquire b");
    let old = locks.backend().lease_id().expect("lease");
    admin.lease_client().revoke(old).await.expect("revoke");
    for guard in [&a, &b] {
        let reason = timeout(ttl, guard.lost())
            .await
            .expect("lost within the renewal interval");
        assert!(
            matches!(reason, LostReason::SessionExpired | LostReason::Vanished),
            "{reason:?}"
        );
    }
    let c = locks
        .lock("revoke/c")
        .await
        .expect("acquire on a new lease");
    let new = locks.backend().lease_id().expect("lease");
    assert_ne!(new, old);
    assert!(matches!(
        a.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    drop(b);
    assert_eq!(
        c.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// User/password authentication from the URL works; a wrong password is a clear
/// configuration error; the password never shows in errors, `Display` or `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_from_the_url() {
    const PASSWORD: &str = "s3cret-pw";
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    enable_auth(&admin, PASSWORD, &[]).await;
    lock_core::raw::driver::register::<lock_etcd::EtcdBackend>();
    let url = format!("etcd://root:{PASSWORD}@{}/secured?ttl=5s", server.addr());
    let locks = lock_core::connect(&url)
        .await
        .expect("connect with credentials");
    let shown = format!("{locks} {locks:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    let guard = locks.lock("auth").await.expect("acquire with credentials");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    let wrong = format!("etcd://root:wrong-{PASSWORD}@{}/secured", server.addr());
    let err = lock_core::connect(&wrong)
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!format!("{err} {err:?}").contains(PASSWORD));

    let anonymous = lock_core::connect(&format!("etcd://{}/secured", server.addr()))
        .await
        .expect("connect without credentials (the status request needs none)");
    let err = anonymous
        .try_lock("auth")
        .await
        .expect_err("no credentials");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
}

/// A waiter queued longer than the TTL keeps its own lease alive (it holds nothing the
/// watchdog would renew), so its place in the queue survives and it gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_lease_alive_while_it_queues() {
    let Some(server) = single().await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let holder = client(&[server.addr()], with_ttl(ttl)).await;
    let mut options = with_ttl(ttl);
    options.recheck = Duration::from_secs(20);
    let waiter = client(&[server.addr()], options).await;
    let guard = holder.lock("long-wait").await.expect("acquire");
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock_timeout("long-wait", Duration::from_secs(20))
            .await;
        (waiter, guard)
    });
    sleep(ttl * 4).await;
    assert!(!waiting.is_finished(), "the waiter must still wait");
    assert!(
        guard.is_held(),
        "the holder keeps its lock through renewals"
    );
    guard.release().await.expect("release");
    let (waiter, next) = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter takes over promptly")
        .expect("task");
    let next = next.expect("the waiter's key survived four TTLs of waiting");
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    drop(waiter);
}

/// gRPC messages the member at `addr` has received so far, from its `/metrics` (the
/// HTTP request for them is not a gRPC message, so it does not count itself).
async fn grpc_messages_received(addr: SocketAddr) -> u64 {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = timeout(Duration::from_secs(5), exchange)
        .await
        .expect("metrics answer in time")
        .expect("metrics read");
    let total: f64 = text
        .lines()
        .filter(|line| line.starts_with("grpc_server_msg_received_total{"))
        .map(|line| {
            line.rsplit(' ')
                .next()
                .and_then(|value| value.parse::<f64>().ok())
                .expect("a counter value")
        })
        .sum();
    assert!(
        text.contains("grpc_server_msg_received_total{"),
        "no gRPC counters in /metrics"
    );
    format!("{total:.0}").parse().expect("a whole number")
}

/// Requests one client sends per renewal interval while it holds `locks` locks (and
/// nothing else talks to the member), after the acquisitions' traffic has settled.
async fn renewal_requests(addr: SocketAddr, locks: usize, ttl: Duration, intervals: u32) -> u64 {
    let client = client(&[addr], with_ttl(ttl)).await;
    let names: Vec<String> = (0..locks).map(|i| format!("renew-cost/{i}")).collect();
    let guards: Vec<_> = join_all(names.iter().map(|name| client.lock(name)))
        .await
        .into_iter()
        .map(|guard| guard.expect("acquire"))
        .collect();
    let interval = ttl / 3;
    sleep(interval * 2).await;
    let before = grpc_messages_received(addr).await;
    sleep(interval * intervals).await;
    let after = grpc_messages_received(addr).await;
    assert!(
        guards.iter().all(|guard| guard.is_held()),
        "renewal keeps every lock held"
    );
    for outcome in join_all(guards.into_iter().map(|guard| guard.release())).await {
        assert_eq!(outcome.expect("release"), ReleaseOutcome::Released);
    }
    drop(client);
    after - before
}

/// Renewal costs O(1) requests per interval however many locks the client holds: one
/// keep-alive and one lease time-to-live query (DESIGN rule 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_requests_do_not_grow_with_the_number_of_locks() {
    let Some(server) = single().await else {
        return;
    };
    let ttl = Duration::from_secs(3);
    let intervals = 6;
    let few = renewal_requests(server.addr(), 10, ttl, intervals).await;
    let many = renewal_requests(server.addr(), 300, ttl, intervals).await;
    eprintln!(
        "requests in {intervals} renewal intervals: {few} holding 10 locks, {many} holding 300"
    );
    let most = 3 * u64::from(intervals);
    assert!(
        few <= most,
        "{few} requests in {intervals} intervals holding 10 locks"
    );
    assert!(
        many <= most,
        "{many} requests in {intervals} intervals holding 300 locks"
    );
    assert!(
        many <= few + 4,
        "renewal traffic grows with the lock count: {few} requests for 10 locks, {many} for 300"
    );
}

/// When the lease's key list does not fit one answer (gRPC's 4 MiB limit: here 3000
/// holds of ~1.5 KB keys), renewal checks the holds by reads instead: every hold stays
/// held, and a key deleted behind the client's back still ends its hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_checks_by_reads_when_the_key_list_is_too_large() {
    const LOCKS: usize = 3000;
    testkit::etcd::trace();
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ttl = Duration::from_secs(6);
    let locks = client(&[server.addr()], with_ttl(ttl)).await;
    // `/` is escaped to `%2F`: a 512-byte name makes a ~1.5 KB key.
    let names: Vec<String> = (0..LOCKS)
        .map(|i| format!("{}{i:06}", "/".repeat(506)))
        .collect();
    let mut guards = Vec::with_capacity(LOCKS);
    for chunk in names.chunks(200) {
        for guard in join_all(chunk.iter().map(|name| locks.lock(name))).await {
            guards.push(guard.expect("acquire"));
        }
    }
    let lease = locks.backend().lease_id().expect("a live lease");
    let listed = admin
        .lease_client()
        .time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await;
    let err =
        listed.expect_err("the key list must not fit one answer for this test to mean anything");
    assert!(err.to_string().contains("too large"), "{err}");
    let stolen = format!("{}{lease:x}.kind", range(&names[0]));
    let deleted = admin
        .kv_client()
        .delete(stolen.as_str(), None)
        .await
        .expect("delete a held key");
    assert_eq!(deleted.deleted(), 1, "{stolen} was held");
    let reason = timeout(ttl, guards[0].lost())
        .await
        .expect("the hold whose key vanished is lost within the renewal interval");
    assert_eq!(reason, LostReason::Vanished);
    sleep(ttl / 3).await;
    let held = guards.iter().filter(|guard| guard.is_held()).count();
    assert_eq!(held, LOCKS - 1, "every other hold is renewed");
}
