//! Operating ZooKeeper locks (`list`, `force_release`, `inspect`'s `since`) beyond what
//! the conformance rule sees: Curator holders and waiters, escaped names, directories
//! without lock nodes, listings in chunks, the broken marks in `<prefix>/%broken` (and
//! marks that refuse a write or a read), typed errors.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conformance::Factory;
use lock_core::{
    DistributedLock, DistributedLockExt, ErrorKind, FencingToken, LockGuard, LockName, LockOptions,
    LockState, LostReason, ReleaseOutcome, RenewalMode,
};
use lock_zookeeper::{broken_node, escape_segment, lock_dir};
use testkit::zookeeper::{
    create_persistent, queue, queue_len_reaches, with_ttl, CuratorSetup, ZkFactory, BASE,
};
use tokio::time::timeout;
use zookeeper_client as zk;

const TTL: Duration = Duration::from_secs(10);

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

/// A name no other test uses, without `/` (a Curator path's last segment as it is).
fn plain_name(tag: &str) -> LockName {
    name(&format!(
        "operations-{tag}-{}",
        uuid::Uuid::new_v4().simple()
    ))
}

/// The owner tokens marked broken under the namespace root, newest last.
async fn broken_marks(factory: &ZkFactory) -> Vec<String> {
    let (data, _) = factory
        .admin()
        .get_data(&broken_node(BASE))
        .await
        .expect("read the marks");
    let marks = String::from_utf8(data).expect("UTF-8 marks");
    marks.lines().map(str::to_owned).collect()
}

/// Breaking a Curator `InterProcessMutex` holder returns it as inspect shows it (its
/// protection id, its node's czxid) and grants the Curator waiter at once; the broken
/// Curator process's release then removes nothing; the lock, with a broken mark beside it,
/// serves later acquisitions, ours and Curator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_curator_holder_grants_the_curator_waiter() {
    let Some(setup) = CuratorSetup::start("break").await else {
        return;
    };
    let (factory, name) = (&setup.factory, &setup.name);
    let (mut holder, mut waiter) = tokio::join!(setup.curator(), setup.curator());
    let operator = factory.zk_client(with_ttl(TTL)).await;

    let held = holder.acquire().await.expect("curator acquires");
    waiter.send("acquire").await.expect("send");
    queue_len_reaches(factory, name, 2).await;
    waiter.silent_for(Duration::from_millis(300)).await;
    let seen = operator.inspect(name).await.expect("inspect");
    let shown = seen.holder.expect("inspect shows Curator's holder");
    assert_eq!(shown.fencing_token, Some(FencingToken(held)));

    let broken = operator
        .force_release(name)
        .await
        .expect("break")
        .expect("the Curator holder is removed");
    assert_eq!(broken.fencing_token, Some(FencingToken(held)), "{broken:?}");
    assert_eq!(broken.owner_token, shown.owner_token);
    assert_eq!(broken.session, shown.session);
    let protection = broken.owner_token.clone().expect("Curator's protection id");
    let line = waiter
        .expect_line("ACQUIRED", Duration::from_secs(5))
        .await
        .expect("the Curator waiter gets the broken lock at once");
    let granted: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|czxid| czxid.parse().ok())
        .expect("ACQUIRED <czxid>");
    assert!(granted > held);
    assert_eq!(broken_marks(factory).await, [protection]);

    holder
        .release()
        .await
        .expect("the broken Curator holder releases");
    assert_eq!(queue(factory.admin(), name).await.len(), 1);
    let seen = operator.inspect(name).await.expect("inspect");
    assert_eq!(
        seen.holder.and_then(|holder| holder.fencing_token),
        Some(FencingToken(granted)),
        "the broken holder's release removed its successor"
    );
    assert!(operator
        .try_lock(name.as_str())
        .await
        .expect("try")
        .is_none());
    waiter.release().await.expect("release");

    let ours = operator
        .try_lock(name.as_str())
        .await
        .expect("try")
        .expect("free once broken");
    assert!(ours.fencing_token().0 > granted);
    assert_eq!(
        ours.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let again = holder.acquire().await.expect("Curator acquires again");
    assert!(again > granted);
    holder.release().await.expect("release");
    holder.exit().await;
    waiter.exit().await;
}

/// Names with `/`, `%`, `.`, `..`, characters ZooKeeper rejects and non-ASCII ones are
/// listed exactly as they were given, under every prefix that selects them; children of
/// the namespace that no name escapes to are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_names_are_listed_exactly() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let client = factory.zk_client(with_ttl(TTL)).await;
    let names: Vec<LockName> = [
        ".",
        "..",
        "...",
        "%",
        "%2F",
        "a/b",
        "a/b/",
        "a//b",
        "a%2Fb",
        "a\u{E000}b",
        "a\u{FFF5}",
        "jöbs/日本",
        "sp ace",
    ]
    .map(name)
    .into();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name.as_str()).await.expect("acquire"));
    }
    // A lock directory whose segment is no name's escape (`%41` is not how `A` escapes),
    // holding a lock node: not a name of this namespace.
    let foreign = format!("{BASE}/{}%41", escape_segment("a/"));
    create_persistent(
        factory.admin(),
        [foreign.clone(), format!("{foreign}/lock-0000000000")],
    )
    .await;

    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(client.list("").await.expect("list"), sorted);
    let under_a: Vec<LockName> = ["a//b", "a/b", "a/b/"].map(name).into();
    assert_eq!(client.list("a/").await.expect("list"), under_a);
    assert_eq!(
        client.list("%").await.expect("list"),
        vec![name("%"), name("%2F")]
    );
    assert_eq!(client.list(".").await.expect("list"), names[..3].to_vec());
    assert_eq!(
        client.list("jöbs/").await.expect("list"),
        vec![name("jöbs/日本")]
    );
    assert!(client.list("b").await.expect("list").is_empty());

    for guard in guards {
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    assert!(client.list("").await.expect("list").is_empty());
    factory
        .admin()
        .delete(&format!("{foreign}/lock-0000000000"), None)
        .await
        .expect("delete");
}

/// `since` is the node's creation time on the server's clock: within a second of the
/// acquire (holder) and the queueing (waiter) on this machine's clock, in inspect and in
/// what a break returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_is_when_the_node_was_created() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let slack = Duration::from_secs(1);
    let holder = factory.zk_client(with_ttl(TTL)).await;
    let waiter = factory.zk_client(with_ttl(TTL)).await;
    let name = plain_name("since");
    let within = |since: Option<SystemTime>, from: SystemTime, to: SystemTime| {
        let since = since.expect("since");
        assert!(
            since + slack >= from && since <= to + slack,
            "since {since:?} outside {from:?}..{to:?}"
        );
    };

    let before = SystemTime::now();
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let acquired = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let queued_from = SystemTime::now();
    let waiting = tokio::spawn({
        let (waiter, name) = (Arc::clone(&waiter), name.clone());
        async move { waiter.lock_timeout(name.as_str(), TTL).await }
    });
    queue_len_reaches(&factory, &name, 2).await;
    let queued = SystemTime::now();

    let seen = holder.inspect(&name).await.expect("inspect");
    let shown = seen.holder.expect("holder");
    let queued_since = seen.waiters[0].since;
    within(shown.since, before, acquired);
    within(queued_since, queued_from, queued);
    assert!(shown.since < queued_since);
    let broken = holder
        .force_release(&name)
        .await
        .expect("break")
        .expect("holder");
    assert_eq!(broken.since, shown.since);
    let successor = waiting.await.expect("task").expect("the waiter gets it");
    let seen = holder.inspect(&name).await.expect("inspect");
    assert_eq!(
        seen.holder.expect("holder").since,
        queued_since,
        "the successor holds since it queued"
    );
    assert_eq!(
        successor.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    drop(guard);
}

/// Directories without a lock node are never listed: one never used, one holding
/// another child only, one whose last lock node went (until the server reaps it); nor
/// is anything before the namespace root exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_without_lock_nodes_are_not_listed() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let client = factory.zk_client(with_ttl(TTL)).await;
    let (empty, other, released, held) = (
        name("empty"),
        name("other-child"),
        name("released"),
        name("held"),
    );
    assert!(
        client.list("").await.expect("list").is_empty(),
        "no namespace root yet"
    );
    let other_dir = lock_dir(BASE, &other);
    create_persistent(
        factory.admin(),
        [
            BASE.to_owned(),
            lock_dir(BASE, &empty),
            other_dir.clone(),
            format!("{other_dir}/lock-"),
        ],
    )
    .await;
    let guard = client.lock(released.as_str()).await.expect("acquire");
    guard.release().await.expect("release");
    let holding = client.lock(held.as_str()).await.expect("acquire");

    assert_eq!(client.list("").await.expect("list"), vec![held.clone()]);
    assert!(client.force_release(&empty).await.expect("break").is_none());
    assert!(client.force_release(&other).await.expect("break").is_none());
    assert!(client
        .force_release(&released)
        .await
        .expect("break")
        .is_none());
    assert_eq!(
        holding.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(client.list("").await.expect("list").is_empty());
}

/// A break marks the broken owner token in `<prefix>/%broken`, created by it, and leaves
/// the namespace root's own data alone; listings skip the marks node; the holder's
/// release (manual renewal: no renewal saw the break first) says Broken even after a new
/// acquisition took the lock, its successor untouched; the directory serves
/// acquisitions, waits and releases as before; a hold that vanishes without a break is
/// reported Vanished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_marks_name_the_holder_and_leave_the_directory_usable() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let holder = factory.zk_client(manual_renewal()).await;
    let other = factory.zk_client(with_ttl(Duration::from_secs(2))).await;
    let name = plain_name("marks");

    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let token = guard.owner_token().to_string();
    let app_data = b"kept by the application";
    factory
        .admin()
        .set_data(BASE, app_data, None)
        .await
        .expect("the application writes the root");
    let broken = holder
        .force_release(&name)
        .await
        .expect("break")
        .expect("holder");
    assert_eq!(broken.owner_token.as_deref(), Some(token.as_str()));
    assert_eq!(broken_marks(&factory).await, [token.as_str()]);
    let (root_data, _) = factory.admin().get_data(BASE).await.expect("read root");
    assert_eq!(root_data, app_data, "the root's data is left alone");
    assert!(holder.list("").await.expect("list").is_empty());
    let next = other
        .try_lock(name.as_str())
        .await
        .expect("try")
        .expect("free once broken");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::Broken)
    );
    assert!(next.is_held());

    // A waiter is granted by the next holder's release; the mark stays (until pushed out
    // by later breaks).
    let waiting = tokio::spawn({
        let (holder, name) = (Arc::clone(&holder), name.clone());
        async move { holder.lock_timeout(name.as_str(), TTL).await }
    });
    queue_len_reaches(&factory, &name, 2).await;
    assert_eq!(broken_marks(&factory).await, [token.as_str()]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(next.is_held(), "renewals go on");
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let granted = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted at the release")
        .expect("task")
        .expect("acquire");

    // Removed behind the library's back, not broken: Vanished.
    factory.steal(&name).await;
    assert_eq!(
        granted.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::Vanished)
    );
    assert!(queue(factory.admin(), &name).await.is_empty());
}

/// A prefix no name can start with is a typed error, not an empty listing; with the
/// server down, listing, inspecting and breaking fail with typed, retryable errors
/// within their deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_prefixes_and_a_down_server_give_typed_errors() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let mut options = with_ttl(TTL);
    options.request_timeout = Duration::from_secs(1);
    let client = factory.zk_client(options).await;
    let name = plain_name("down");
    for prefix in [
        "a\nb".to_owned(),
        "x".repeat(lock_core::raw::names::MAX_NAME_BYTES + 1),
    ] {
        let err = client.list(&prefix).await.expect_err("a bad prefix");
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
    }

    factory.servers.controls()[0].kill9().await.expect("kill");
    let started = tokio::time::Instant::now();
    let errors = [
        client
            .list("")
            .await
            .expect_err("list with the server down"),
        client
            .inspect(&name)
            .await
            .expect_err("inspect with the server down"),
        client
            .force_release(&name)
            .await
            .expect_err("break with the server down"),
    ];
    for err in errors {
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Unavailable
            ) && err.is_retryable(),
            "{err:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// A server whose marks node under [`BASE`] (and [`BASE`]) exists with an ACL granting
/// anyone `permissions` only.
async fn start_with_marks_node(permissions: zk::Permission) -> Option<ZkFactory> {
    let factory = ZkFactory::start().await?;
    create_persistent(factory.admin(), [BASE.to_owned()]).await;
    let acl = [zk::Acl::new(permissions, zk::AuthId::anyone())];
    factory
        .admin()
        .create(
            &broken_node(BASE),
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl)),
        )
        .await
        .expect("create the marks node");
    Some(factory)
}

/// Breaks the hold of `guard` and checks that the break removed that hold.
async fn break_guard(client: &impl DistributedLock, guard: &LockGuard) {
    let broken = client
        .force_release(guard.name())
        .await
        .expect("break")
        .expect("holder");
    assert_eq!(broken.fencing_token, Some(guard.fencing_token()));
}

/// Options with the test's TTL and manual renewal (no renewal notices a change first).
fn manual_renewal() -> LockOptions {
    let mut manual = with_ttl(TTL);
    manual.renewal = RenewalMode::Manual;
    manual
}

/// Where the marks node refuses `setData` (its ACL lets anyone read and delete but not
/// write), a break still removes the holder, without a mark: the holder's release then
/// says Vanished, and the marks are never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_without_write_permission_break_without_a_mark() {
    let Some(factory) = start_with_marks_node(zk::Permission::READ | zk::Permission::DELETE).await
    else {
        return;
    };
    let client = factory.zk_client(manual_renewal()).await;
    let name = plain_name("no-write");

    let guard = client.lock(name.as_str()).await.expect("acquire");
    break_guard(&*client, &guard).await;
    assert!(queue(factory.admin(), &name).await.is_empty());
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::Vanished)
    );
    let stat = factory
        .admin()
        .check_stat(&broken_node(BASE))
        .await
        .expect("stat")
        .expect("marks node");
    assert_eq!(stat.version, 0, "the marks were never written");
}

/// While the marks cannot be read (an ACL without READ), a hold whose node is gone is
/// not guessed Vanished: its release fails with a retryable error, and a renewed hold
/// turns Suspect, then Vanished at a renewal once the marks are readable (the node
/// removed) again. A break under such marks removes the holder without a mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_marks_leave_a_gone_hold_undecided() {
    let Some(factory) = start_with_marks_node(zk::Permission::WRITE | zk::Permission::DELETE).await
    else {
        return;
    };
    let (manual, renewed) = tokio::join!(
        factory.zk_client(manual_renewal()),
        factory.zk_client(with_ttl(TTL))
    );
    let (first, second) = (
        plain_name("unreadable-release"),
        plain_name("unreadable-renew"),
    );

    let guard = manual.lock(first.as_str()).await.expect("acquire");
    factory.steal(&first).await;
    let err = guard.release().await.expect_err("no reason to report");
    assert!(err.is_retryable(), "{err:?}");

    let guard = renewed.lock(second.as_str()).await.expect("acquire");
    break_guard(&*renewed, &guard).await;
    let mut watch = guard.watch();
    // TTL / 3 until the first renewal finds the node gone.
    let state = timeout(TTL / 2, watch.changed())
        .await
        .expect("a renewal runs");
    assert_eq!(state, LockState::Suspect);
    factory
        .admin()
        .delete(&broken_node(BASE), None)
        .await
        .expect("delete the marks");
    let reason = timeout(TTL / 2, guard.lost()).await.expect("lost");
    assert_eq!(reason, LostReason::Vanished);
}

/// A listing reads its directories in chunks: 1200 held names (three `multiRead`s), of
/// which every third is released, are listed exactly, whole and by prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_names_are_listed_in_chunks() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let client = factory.zk_client(with_ttl(TTL)).await;
    let names: Vec<LockName> = (0..1200).map(|i| name(&format!("many/{i:04}"))).collect();
    let guards =
        futures::future::join_all(names.iter().map(|name| client.lock(name.as_str()))).await;
    let mut held = Vec::new();
    for (i, (guard, name)) in guards.into_iter().zip(&names).enumerate() {
        let guard = guard.expect("acquire");
        if i % 3 == 0 {
            guard.release().await.expect("release");
        } else {
            held.push((name.clone(), guard));
        }
    }
    let started = tokio::time::Instant::now();
    let listed = client.list("").await.expect("list");
    eprintln!(
        "listing {} of 1200 names took {:?}",
        listed.len(),
        started.elapsed()
    );
    let expected: Vec<LockName> = held.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(listed, expected);
    let under: Vec<LockName> = expected
        .iter()
        .filter(|name| name.as_str().starts_with("many/11"))
        .cloned()
        .collect();
    assert_eq!(under.len(), 67);
    assert_eq!(client.list("many/11").await.expect("list"), under);
    for (_, guard) in held {
        guard.release().await.expect("release");
    }
}
