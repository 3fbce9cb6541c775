//! The operator's calls on etcd beyond what the conformance rule sees: breaking an
//! `etcdctl lock` holder, names with `/` and `%` listed exactly, a listing of several
//! pages, the marks of broken holds (their bounded lease, never listed, never a
//! contender, revoked by the broken hold's release), a hold that ends during a break
//! (not hit), and typed errors (refused permissions, a dead server).

use std::sync::Arc;
use std::time::Duration;

use conformance::inspection::{inspect_until, release, wait_for};
use conformance::rules::{eventually_empty, unique_name};
use etcd_client::{Client, ConnectOptions, PutOptions};
use harness::proxy::ProxyMode;
use lab::chaos::ChaosTarget;
use lock_core::{
    DistributedLock, DistributedLockExt, ErrorKind, FencingToken, LockGuard, LockName, LockOptions,
    LostReason, Participant, ReleaseOutcome, RenewalMode,
};
use lock_etcd::EtcdLock;
use testkit::etcd::{
    client, config, enable_auth, go_key, go_lease, keys_under, plain_client, raw_client, single,
    with_ttl, EtcdFactory, EtcdctlLock, GoKey, PREFIX,
};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// The mark a broken hold of `key` (under [`PREFIX`], or under no prefix) leaves, as the
/// crate's layout documents it.
fn mark_of(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        format!("%broken/{key}")
    } else {
        let rest = key
            .strip_prefix(&format!("{prefix}/"))
            .expect("under the prefix");
        format!("{prefix}/%broken/{rest}")
    }
}

/// The value and lease of `key`, if it exists.
async fn read(admin: &Client, key: &str) -> Option<(String, i64)> {
    let answer = admin.kv_client().get(key, None).await.expect("read");
    answer
        .kvs()
        .first()
        .map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease()))
}

/// What lease `id` was granted and has left, in seconds; `None` once it is gone.
async fn lease_ttl(admin: &Client, id: i64) -> Option<(i64, i64)> {
    let answer = admin
        .lease_client()
        .time_to_live(id, None)
        .await
        .expect("lease time to live");
    (answer.ttl() > 0).then(|| (answer.granted_ttl(), answer.ttl()))
}

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

/// Breaks `lock` through `operator`, which must find a holder; returns the holder
/// removed and the guard that `waiter` gets at once (2 s at most).
async fn break_for(
    operator: &EtcdLock,
    lock: &LockName,
    waiter: JoinHandle<LockGuard>,
) -> (Participant, LockGuard) {
    let broken_at = Instant::now();
    let broken = operator
        .force_release(lock)
        .await
        .expect("break")
        .expect("the lock had a holder");
    let guard = timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter gets the broken lock at once")
        .expect("waiter task");
    eprintln!("the waiter held {:?} after the break", broken_at.elapsed());
    (broken, guard)
}

/// Breaking a name that `etcdctl lock` holds removes etcdctl's key and shows it as etcd
/// keeps it (no owner token, its create revision, its lease, no time); our waiter gets
/// the lock at once; the mark names etcdctl's key under `%broken/` and is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_an_etcdctl_holder_hands_the_lock_to_our_waiter() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours = Arc::new(plain_client(server.addr()).await);
    let operator = plain_client(server.addr()).await;
    let lock = name(&format!("break-{}", uuid::Uuid::new_v4().simple()));

    let mut etcdctl = EtcdctlLock::spawn(server.addr(), lock.as_str());
    let their_key = etcdctl
        .held_key(Duration::from_secs(10))
        .await
        .expect("etcdctl acquires a free lock");
    let (_, their_revision) = keys_under(&admin, &format!("{lock}/"))
        .await
        .into_iter()
        .find(|(key, _)| *key == their_key)
        .expect("etcdctl's key is in our lock's range");
    let their_lease = their_key.rsplit('/').next().expect("a lease").to_owned();
    let waiter = wait_for(&ours, &lock);
    inspect_until(&operator, &lock, 2).await;

    let (broken, guard) = break_for(&operator, &lock, waiter).await;
    assert_eq!(broken.owner_token, None, "etcdctl stores no owner token");
    let their_token = FencingToken(u64::try_from(their_revision).expect("positive"));
    assert_eq!(broken.fencing_token, Some(their_token));
    assert_eq!(broken.session.as_deref(), Some(their_lease.as_str()));
    assert!(
        broken
            .lease_left
            .is_some_and(|left| left <= Duration::from_secs(10)),
        "{broken:?}"
    );
    assert_eq!(broken.since, None, "etcd keeps no time");
    assert!(guard.fencing_token() > their_token);

    let (value, mark_lease) = read(&admin, &mark_of("", &their_key))
        .await
        .expect("the mark of etcdctl's key");
    assert_eq!(value, their_revision.to_string());
    assert_ne!(mark_lease, 0, "the mark lives on a lease");
    // Under no prefix the listing reads the whole key space: the mark is not a lock.
    assert_eq!(operator.list("").await.expect("list"), vec![lock.clone()]);
    assert_eq!(operator.list("%").await.expect("list"), Vec::new());

    release(guard).await;
    etcdctl.interrupt().await;
    assert_eq!(operator.list("").await.expect("list"), Vec::new());
}

/// Names with `/` and `%` (and ones that look like escapes or like the marks' segment)
/// are listed exactly as they were locked, under every prefix of them; keys in the
/// range that are no queue key (no lease, another layout, a leaf that is not the
/// key's lease) never are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_slash_and_percent_are_listed_exactly() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let holder = client(&factory.servers.addrs(), with_ttl(Duration::from_secs(10))).await;
    let base = format!("list-{}", uuid::Uuid::new_v4().simple());
    let under = |rest: &str| name(&format!("{base}/{rest}"));
    let held = [
        under("a"),
        under("a/b"),
        under("50%"),
        under("%2F"),
        under("%broken"),
        under("x%25y"),
        under("日本/語"),
        name(&format!("{base}-outside")),
    ];
    let mut guards = Vec::new();
    for lock in &held {
        guards.push(holder.lock(lock.as_str()).await.expect("acquire"));
    }
    // Keys in the listed range that are not queue keys.
    let admin = factory.admin();
    let lease = go_lease(admin, 30).await;
    let on_lease = Some(PutOptions::new().with_lease(lease));
    for (key, options) in [
        (format!("{PREFIX}/{base}%2Fplain"), None),
        (
            format!("{}zz", factory.range(&under("junk"))),
            on_lease.clone(),
        ),
        (
            format!("{}{lease:x}", factory.range(&under("nolease"))),
            None,
        ),
        (
            format!("{}{lease:x}/x", factory.range(&under("deeper"))),
            on_lease.clone(),
        ),
        (
            format!("{PREFIX}/{base}%2Fa%41/{lease:x}"),
            on_lease.clone(),
        ),
    ] {
        admin
            .kv_client()
            .put(key.as_str(), "", options)
            .await
            .expect("put a key that is no lock's");
    }

    let sorted = |mut names: Vec<LockName>| {
        names.sort();
        names
    };
    let list = |prefix: String| {
        let holder = Arc::clone(&holder);
        async move { holder.list(&prefix).await.expect("list") }
    };
    assert_eq!(list(format!("{base}/")).await, sorted(held[..7].to_vec()));
    assert_eq!(list(base.clone()).await, sorted(held.to_vec()));
    assert_eq!(
        list(format!("{base}/a")).await,
        vec![under("a"), under("a/b")]
    );
    assert_eq!(list(format!("{base}/a/")).await, vec![under("a/b")]);
    assert_eq!(
        list(format!("{base}/%")).await,
        vec![under("%2F"), under("%broken")]
    );
    assert_eq!(list(format!("{base}/%2")).await, vec![under("%2F")]);
    assert_eq!(list(format!("{base}/5")).await, vec![under("50%")]);
    assert_eq!(list(format!("{base}/日本/")).await, vec![under("日本/語")]);
    assert_eq!(list(format!("{base}/zz")).await, Vec::new());

    for guard in guards {
        release(guard).await;
    }
    assert_eq!(list(base).await, Vec::new());
}

/// The mark of a broken hold lives on a lease of its own, granted three times the
/// holder's lease TTL and at least `mark_ttl` (60 s by default); nothing lists it nor
/// queues behind it (names spelled like its path lock at once and inspect empty); a holder
/// that never comes back leaves it to that TTL, after which it is gone (seen with a
/// client whose `mark_ttl` is 3 s, where three times the holder's 2 s lease TTL rules).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclaimed_mark_is_no_lock_and_ends_with_its_lease() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let addrs = factory.servers.addrs();
    let operator = client(&addrs, with_ttl(Duration::from_secs(2))).await;
    let lock = unique_name("operate_mark");
    let admin = factory.admin();
    let GoKey { key, revision, .. } = go_key(admin, &factory.range(&lock), 5).await;

    let broken = operator
        .force_release(&lock)
        .await
        .expect("break")
        .expect("a holder");
    assert_eq!(
        broken.fencing_token.map(FencingToken::get),
        u64::try_from(revision).ok()
    );
    let mark = mark_of(PREFIX, &key);
    let (value, mark_lease) = read(admin, &mark).await.expect("the mark");
    assert_eq!(value, revision.to_string());
    let (granted, left) = lease_ttl(admin, mark_lease)
        .await
        .expect("the mark's lease");
    assert_eq!(granted, 60, "3 x 5 s, at least 60 s");
    assert!(left <= granted);
    assert!(keys_under(admin, &factory.range(&lock)).await.is_empty());

    // Not a lock, not a contender: names spelled like the marks' path.
    assert_eq!(operator.list("").await.expect("list"), Vec::new());
    let rest = mark
        .strip_prefix(&format!("{PREFIX}/"))
        .expect("under the prefix");
    let lookalikes = [
        name("%broken"),
        name(rest),
        name(&format!("%broken/{lock}")),
        lock.clone(),
    ];
    for lookalike in &lookalikes {
        let seen = operator.inspect(lookalike).await.expect("inspect");
        assert_eq!(seen.holder, None, "{lookalike:?}: {seen:?}");
        let guard = operator
            .try_lock(lookalike.as_str())
            .await
            .expect("try")
            .unwrap_or_else(|| panic!("{lookalike:?} is free"));
        release(guard).await;
    }

    // Nobody claims a mark: it lasts its lease's TTL, then it is gone.
    let mut short = config(&addrs, with_ttl(Duration::from_secs(2)));
    short.mark_ttl = Duration::from_secs(3);
    let quick = EtcdLock::connect(short).await.expect("connect");
    let lock = unique_name("operate_mark_ends");
    let GoKey { key, .. } = go_key(admin, &factory.range(&lock), 2).await;
    quick
        .force_release(&lock)
        .await
        .expect("break")
        .expect("a holder");
    let broken_at = Instant::now();
    let mark = mark_of(PREFIX, &key);
    let (_, mark_lease) = read(admin, &mark).await.expect("the mark");
    let (granted, _) = lease_ttl(admin, mark_lease)
        .await
        .expect("the mark's lease");
    assert_eq!(granted, 6, "3 x 2 s, above a mark_ttl of 3 s");
    let deadline = broken_at + Duration::from_secs(10);
    while read(admin, &mark).await.is_some() {
        assert!(Instant::now() < deadline, "the mark outlived its lease");
        sleep(Duration::from_millis(100)).await;
    }
    let lasted = broken_at.elapsed();
    eprintln!("the unclaimed mark lasted {lasted:?}");
    assert!(lasted >= Duration::from_secs(5), "gone early: {lasted:?}");
    assert_eq!(lease_ttl(admin, mark_lease).await, None);
}

/// A broken hold's release, before any renewal ran (manual renewal), says it was
/// broken, even with the next holder in place, and revokes the mark's lease: nothing
/// of the break is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_holds_release_says_so_and_removes_the_mark() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let addrs = factory.servers.addrs();
    let mut manual = with_ttl(Duration::from_secs(10));
    manual.renewal = RenewalMode::Manual;
    let holder = client(&addrs, manual).await;
    let next = Arc::new(client(&addrs, with_ttl(Duration::from_secs(10))).await);
    let lock = unique_name("operate_release");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let waiter = wait_for(&next, &lock);
    inspect_until(&holder, &lock, 2).await;
    let key = keys_under(factory.admin(), &factory.range(&lock))
        .await
        .first()
        .map(|(key, _)| key.clone())
        .expect("the holder's key");

    let (_, successor) = break_for(&holder, &lock, waiter).await;
    let mark = mark_of(PREFIX, &key);
    let (_, mark_lease) = read(factory.admin(), &mark).await.expect("the mark");
    assert!(
        guard.is_held(),
        "no renewal ran: the guard does not know yet"
    );
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::Broken)
    );
    assert!(successor.is_held());
    let deadline = Instant::now() + Duration::from_secs(5);
    while read(factory.admin(), &mark).await.is_some()
        || lease_ttl(factory.admin(), mark_lease).await.is_some()
    {
        assert!(Instant::now() < deadline, "the mark outlived the release");
        sleep(Duration::from_millis(50)).await;
    }
    release(successor).await;
}

/// A user who may read the locks but not write them cannot break one: a typed
/// configuration error, the holder's key untouched and no mark nor mark lease left; a
/// prefix no name can start with is an invalid name; one who may not read the locks
/// cannot list them. With the server down, listing and breaking
/// fail with retryable connection errors within their deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_a_dead_server_are_typed_errors() {
    const PASSWORD: &str = "operate-pw";
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let lock = unique_name("operate_denied");
    let range = config(&[server.addr()], LockOptions::default()).lock_prefix(&lock);
    let GoKey { key, .. } = go_key(&admin, &range, 60).await;
    let locks = format!("{PREFIX}/");
    enable_auth(
        &admin,
        PASSWORD,
        &[("reader", &locks), ("stranger", "elsewhere/")],
    )
    .await;
    let as_user = |user: &str| {
        config(&[server.addr()], with_ttl(Duration::from_secs(5))).with_credentials(user, PASSWORD)
    };
    let root = Client::connect(
        [format!("http://{}", server.addr())],
        Some(ConnectOptions::new().with_user("root", PASSWORD)),
    )
    .await
    .expect("root connects");
    let leases_before = root
        .lease_client()
        .leases()
        .await
        .expect("leases")
        .leases()
        .len();

    let reader = EtcdLock::connect(as_user("reader")).await.expect("connect");
    assert_eq!(
        reader.list("").await.expect("the reader lists"),
        vec![lock.clone()]
    );
    let err = reader
        .force_release(&lock)
        .await
        .expect_err("no write permission");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable());
    assert_eq!(keys_under(&root, &range).await.len(), 1, "{key} stays");
    assert!(read(&root, &mark_of(PREFIX, &key)).await.is_none());
    let deadline = Instant::now() + Duration::from_secs(5);
    while root
        .lease_client()
        .leases()
        .await
        .expect("leases")
        .leases()
        .len()
        > leases_before
    {
        assert!(Instant::now() < deadline, "the refused break left a lease");
        sleep(Duration::from_millis(50)).await;
    }

    // A prefix no name can start with is refused before anything is sent.
    for bad in [
        "a\nb".to_owned(),
        "x".repeat(lock_core::raw::names::MAX_NAME_BYTES + 1),
    ] {
        let err = reader.list(&bad).await.expect_err("a bad prefix");
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
    }

    let stranger = EtcdLock::connect(as_user("stranger"))
        .await
        .expect("connect");
    let err = stranger.list("").await.expect_err("no read permission");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");

    server.kill9().await.expect("kill etcd");
    let started = Instant::now();
    for err in [
        reader.list("").await.expect_err("the server is down"),
        reader
            .force_release(&lock)
            .await
            .expect_err("the server is down"),
    ] {
        assert!(
            matches!(err.kind(), ErrorKind::Connection | ErrorKind::Unavailable),
            "{err}"
        );
        assert!(err.is_retryable(), "{err}");
    }
    // Each within its deadline (a few request timeouts of 5 s).
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// A listing larger than one page (1000 keys) reads every page: 2,100 held names, each
/// a queue key on one lease, are all listed, sorted, and a name prefix narrows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_spans_pages() {
    const NAMES: usize = 2100;
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let operator = client(&factory.servers.addrs(), with_ttl(Duration::from_secs(5))).await;
    let admin = factory.admin();
    let lease = go_lease(admin, 60).await;
    let base = format!("pages-{}", uuid::Uuid::new_v4().simple());
    let mut names: Vec<LockName> = (0..NAMES).map(|i| name(&format!("{base}/{i}"))).collect();
    for chunk in names.chunks(lock_etcd::MAX_TXN_OPS) {
        let puts: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|lock| {
                let key = format!("{}{lease:x}", factory.range(lock));
                etcd_client::TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease)))
            })
            .collect();
        admin
            .kv_client()
            .txn(etcd_client::Txn::new().and_then(puts))
            .await
            .expect("put queue keys");
    }
    names.sort();
    let started = Instant::now();
    assert_eq!(operator.list(&base).await.expect("list"), names);
    eprintln!("listed {NAMES} names (3 pages) in {:?}", started.elapsed());
    let tens: Vec<LockName> = names
        .iter()
        .filter(|lock| lock.as_str().starts_with(&format!("{base}/10")))
        .cloned()
        .collect();
    assert_eq!(tens.len(), 11 + 100);
    assert_eq!(
        operator.list(&format!("{base}/10")).await.expect("list"),
        tens
    );
    admin.lease_client().revoke(lease).await.expect("revoke");
    assert_eq!(operator.list(&base).await.expect("list"), Vec::new());
}

/// A hold that ends while a break is under way (here released and taken again by the
/// same client, under the very same key) is not hit: the break's transaction compares
/// the create revision it read, so it removes nothing, returns `None`, leaves no mark,
/// and revokes the mark's lease; the new hold keeps its key and renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_that_ends_during_a_break_is_not_hit() {
    /// Added to every chunk both ways on the operator's link: each request of the break
    /// takes about twice this.
    const DELAY: Duration = Duration::from_millis(400);
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let holder = client(&factory.servers.addrs(), with_ttl(Duration::from_secs(5))).await;
    let (operator, link) = factory
        .linked_client(with_ttl(Duration::from_secs(5)))
        .await;
    let lock = unique_name("operate_race");
    let range = factory.range(&lock);
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let first = keys_under(factory.admin(), &range).await;
    operator
        .list("")
        .await
        .expect("the operator's connection is up");

    link.set_mode(ProxyMode::Delay {
        base: DELAY,
        jitter: Duration::ZERO,
    });
    let breaking = {
        let (operator, lock) = (Arc::clone(&operator), lock.clone());
        tokio::spawn(async move { operator.force_release(&lock).await })
    };
    // The break has read the holder (after one delay) and not yet written (after four
    // round trips): the hold ends and the same client takes the name again.
    sleep(DELAY * 5 / 2).await;
    release(guard).await;
    let again = holder.lock(lock.as_str()).await.expect("acquire again");
    let second = keys_under(factory.admin(), &range).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].0, first[0].0, "the same key, created again");
    assert!(second[0].1 > first[0].1);
    assert!(!breaking.is_finished(), "the break ended too early to race");

    let removed = timeout(Duration::from_secs(20), breaking)
        .await
        .expect("the break ends")
        .expect("break task")
        .expect("break");
    link.set_mode(ProxyMode::Pass);
    assert_eq!(removed, None, "the break hit a hold it never read");
    assert_eq!(keys_under(factory.admin(), &range).await, second);
    assert!(keys_under(factory.admin(), &format!("{PREFIX}/%broken/"))
        .await
        .is_empty());
    again.extend().await.expect("the new hold renews");
    release(again).await;
    eventually_empty(
        &factory,
        &[lock],
        "a_hold_that_ends_during_a_break_is_not_hit",
    )
    .await;
}
