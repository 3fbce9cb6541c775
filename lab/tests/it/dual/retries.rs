//! The dual lock's attempts that end before they are granted, on ZooKeeper -> Redis: an
//! attempt whose old side is lost while it waits on the new side starts over with an owner
//! token of its own, a side it took is given back even when the first release of it fails,
//! and an old side whose session ends (while waiting or holding) is never vouched for and
//! never keeps the new side taken.

use std::sync::Arc;
use std::time::Duration;

use conformance::rules::unique_name;
use conformance::{with_ttl, Factory};
use harness::proxy::ProxyMode;
use lab::chaos::ChaosTarget;
use lab::dual::{DualFactory, Sides};
use lock_core::{DistributedLock, DistributedLockExt, LockName, LockOptions, LockState};
use tokio::time::{sleep, timeout, Instant};

use testkit::dual::zk_redis;
use testkit::redis::RedisFactory;
use testkit::zookeeper::{expire_session, holder_session, queue, ZkFactory};

/// Bound on the polls of these tests.
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `probe` every 20 ms until it gives a value, for at most [`PATIENCE`].
async fn poll<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

/// The owner tokens of the dual waiters queued on the new side for `name`, as `client`
/// (a new-only client) inspects them.
async fn dual_waiters(client: &dyn DistributedLock, name: &LockName) -> Vec<String> {
    let seen = client.inspect(name).await.expect("inspect the new side");
    seen.waiters
        .into_iter()
        .filter_map(|waiter| waiter.owner_token)
        .filter(|token| lock_core::migration::is_dual_token(token))
        .collect()
}

/// A dual client waits on the new side behind a new-only holder; returns the new-only
/// client, its guard, the dual client's waiting acquire and the owner token of its waiter.
async fn dual_waiting_behind_new_only(
    dual: &DualFactory<ZkFactory, RedisFactory>,
    name: &LockName,
    options: LockOptions,
) -> (
    Arc<dyn DistributedLock>,
    lock_core::LockGuard,
    tokio::task::JoinHandle<lock_core::Result<lock_core::LockGuard>>,
    String,
) {
    let new_only = dual.new_side().client(options.clone()).await;
    let blocker = new_only.lock(name.as_str()).await.expect("new-only holder");
    let client = dual.client(options).await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            client
                .lock_timeout(name.as_str(), Duration::from_secs(60))
                .await
        }
    });
    let first = poll("the dual client queues on the new side", || async {
        dual_waiters(&*new_only, name).await.into_iter().next()
    })
    .await;
    (new_only, blocker, waiting, first)
}

/// An attempt whose old side is lost while it waits on the new side starts over with an
/// owner token of its own on both sides: the cleanup of the abandoned attempt (which may
/// run late) compares only the token, so a retry with the same one could see its fresh
/// waiter or grant removed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_attempt_waits_with_a_fresh_owner_token() {
    let Some(dual) = zk_redis().await else {
        return;
    };
    let ttl = dual.short_ttl();
    let name = unique_name("dual-retry-token");
    let (new_only, blocker, waiting, first) =
        dual_waiting_behind_new_only(&dual, &name, with_ttl(ttl)).await;
    // The renewal of the old side during the wait finds it gone: the attempt starts over,
    // with a new node on the old side, then a new waiter on the new side.
    dual.old().steal(&name).await;
    poll("the retry takes the old side again", || async {
        (!queue(dual.old().admin(), &name).await.is_empty()).then_some(())
    })
    .await;
    let deadline = Instant::now() + PATIENCE;
    let retried = loop {
        let waiters = dual_waiters(&*new_only, &name).await;
        if !waiters.is_empty() && !waiters.contains(&first) {
            break waiters;
        }
        assert!(
            Instant::now() < deadline,
            "the retry waits on the new side with the first attempt's owner token {first}: \
             waiters {waiters:?}"
        );
        sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(retried.len(), 1, "one dual waiter: {retried:?}");
    blocker.release().await.expect("release");
    let guard = waiting
        .await
        .expect("task")
        .expect("the retry gets the lock");
    guard.release().await.expect("release");
}

/// A side taken by an acquire that then fails is given back even when the first release
/// of it fails: the old side's link is cut while the new side does not answer, so the
/// release after the new side's error gets no answer either; once the link heals, the old
/// side's node goes (ZooKeeper would keep it for the session's life, ahead of every
/// Curator and dual client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_side_release_is_tried_again() {
    let Some(dual) = zk_redis().await else {
        return;
    };
    let dual = dual.faults(Sides::Old);
    let name = unique_name("dual-release-retry");
    let mut options = with_ttl(Duration::from_secs(6));
    options.request_timeout = Duration::from_secs(1);
    let (client, link) = dual.linked_client(options).await;
    let redis = &dual.new_side().servers.members()[0];
    redis.pause().expect("pause the new side");
    let attempt = tokio::spawn({
        let (client, name) = (Arc::clone(&client), name.clone());
        async move { client.try_lock(name.as_str()).await }
    });
    poll("the dual client takes the old side", || async {
        (!queue(dual.old().admin(), &name).await.is_empty()).then_some(())
    })
    .await;
    // Past the old side's grant (its reply on its way), before the new side's request
    // times out.
    sleep(Duration::from_millis(200)).await;
    link.set_mode(ProxyMode::Blackhole);
    let failed = timeout(PATIENCE, attempt)
        .await
        .expect("the attempt is bounded")
        .expect("task");
    redis.resume().expect("resume the new side");
    assert!(
        failed.is_err(),
        "the attempt fails on the new side: {failed:?}"
    );
    link.heal();
    let healed = Instant::now();
    let bound = Duration::from_secs(6);
    loop {
        let left = queue(dual.old().admin(), &name).await;
        if left.is_empty() {
            break;
        }
        assert!(
            healed.elapsed() < bound,
            "the old side still has {left:?} {bound:?} after the link healed: its release \
             was not tried again"
        );
        sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "[dual] the old side was freed {:?} after the link healed",
        healed.elapsed()
    );
}

/// An acquire whose old side's session ends while it waits on the new side never returns
/// a guard that says Held without an old side: it starts over on the new session, or at
/// least says Lost. The session is closed on the server well before the acquire's next
/// renewal of the old side would have noticed, and the new side is freed once the dual
/// client knows (it has opened a new session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_session_ended_during_the_wait_is_not_held() {
    let Some(dual) = zk_redis().await else {
        return;
    };
    let name = unique_name("dual-wait-expired");
    // The acquire renews its old side every 4 s while it waits.
    let options = with_ttl(Duration::from_secs(12));
    let (_new_only, blocker, waiting, _) =
        dual_waiting_behind_new_only(&dual, &name, options).await;
    let admin = dual.old().admin();
    let session = holder_session(admin, &name)
        .await
        .expect("the old side's node");
    expire_session(dual.old().servers.addrs()[0], session).await;
    // The dual client's connection is closed at once; it is told the session ended when
    // it reconnects, and only then opens another.
    let admin_session = admin.session_id().0;
    let server = &dual.old().servers.members()[0];
    poll("the dual client opens a new session", || async {
        let connections = server.four_letter("cons").await.ok()?;
        connections
            .split("sid=0x")
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_hexdigit()).next())
            .filter_map(|hex| i64::from_str_radix(hex, 16).ok())
            .find(|sid| ![0, session, admin_session].contains(sid))
    })
    .await;
    blocker.release().await.expect("release");
    let guard = timeout(PATIENCE, waiting)
        .await
        .expect("the dual acquire is granted")
        .expect("task")
        .expect("the dual acquire");
    let state = guard.state();
    let owner = holder_session(admin, &name).await;
    assert!(
        state.is_lost() || owner.is_some_and(|owner| owner != session),
        "the guard says {state:?} right after the grant, though its old side's session \
         {session:#x} ended while it waited (the old side's holder now: {owner:?})"
    );
    drop(guard);
}

/// A dual hold whose old side's session ends turns Lost and frees its new side at once,
/// while its guard is still alive: the new side would otherwise stay taken until the guard
/// goes or its TTL runs out, blocking new-only clients for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_session_ended_while_held_frees_the_new_side() {
    let Some(dual) = zk_redis().await else {
        return;
    };
    let name = unique_name("dual-held-expired");
    let options = with_ttl(Duration::from_secs(12));
    let client = dual.client(options.clone()).await;
    let guard = client.lock(name.as_str()).await.expect("acquire");
    let session = holder_session(dual.old().admin(), &name)
        .await
        .expect("the old side's node");
    expire_session(dual.old().servers.addrs()[0], session).await;
    let reason = timeout(PATIENCE, guard.lost())
        .await
        .expect("the guard turns Lost once the session ended");
    let lost = Instant::now();
    let new_only = dual.new_side().client(options).await;
    let bound = Duration::from_secs(3);
    loop {
        let holder = new_only.inspect(&name).await.expect("inspect").holder;
        if holder.is_none() {
            break;
        }
        assert!(
            lost.elapsed() < bound,
            "the new side is still held by {holder:?} {bound:?} after the guard turned Lost \
             ({reason:?}), its guard {:?}",
            guard.state()
        );
        sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(guard.state(), LockState::Lost(_)));
    drop(guard);
}
