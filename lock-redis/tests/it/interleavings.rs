//! Interleavings opened deterministically around this backend (see
//! `lab::interleavings`): the ones that wrap its protocol half, then the shared
//! ones. Every acquire attempt is distinguishable on the server, so the late cleanup of
//! a failed attempt never removes what a retry of the same acquisition took. A break
//! that reaches one RedLock server late removes only the hold it broke.

use std::sync::atomic::Ordering;
use std::time::Duration;

use harness::proxy::{FaultProxy, ProxyMode};

use lab::interleavings::{
    last_applied_extension_wins, retry_survives_late_cleanup, LateCleanup, SlowRenewalReply,
};
use lock_core::raw::driver::Connect;
use lock_core::{DistributedLock, DistributedLockExt, LockName, ReleaseOutcome};
use lock_redis::{KeyLayout, RedisBackend, DEFAULT_PREFIX};
use testkit::redis::{config_for, raw, with_ttl, RedisFactory};
use tokio::time::{sleep, timeout};

async fn check(factory: RedisFactory, redlock: bool) {
    let options = with_ttl(Duration::from_secs(30));
    let backend = RedisBackend::open(config_for(
        &factory.servers.addrs(),
        redlock,
        options.clone(),
    ))
    .await
    .expect("connect");
    let flaky = LateCleanup::new(backend, Duration::from_millis(300));
    let other = factory.make(options.clone()).await;
    let name = format!("attempts/{}", uuid::Uuid::new_v4().simple());
    retry_survives_late_cleanup(flaky, options, other, &name).await;
}

/// Single server: the retry is not undone by the first attempt's compare-and-delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_retry_survives_late_cleanup() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    check(factory, false).await;
}

/// RedLock: the same across five nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_retry_survives_late_cleanup() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    check(factory, true).await;
}

/// Two extensions in flight at once: the guard keeps the deadline of the one the
/// server applied last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_applied_extension_wins_on_redis() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(1));
    let backend = RedisBackend::open(config_for(&factory.servers.addrs(), false, options.clone()))
        .await
        .expect("connect");
    let slow = SlowRenewalReply::new(backend, Duration::from_secs(30), Duration::from_millis(500));
    let other = factory.make(options.clone()).await;
    let name = format!("extensions/{}", uuid::Uuid::new_v4().simple());
    last_applied_extension_wins(slow, options, other, &name).await;
}

/// RedLock over five servers: an operator's break reaches the last server late, after
/// the broken holder's successor (woken by the servers the break reached first) took that
/// server too. The break removes there only the hold it broke: the successor keeps its
/// key on every server and its release is `Released`, not `Broken`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_break_leaves_the_successor_alone() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    factory.queue.store(false, Ordering::Relaxed);
    let addrs = factory.servers.addrs();
    let holder = factory.make(with_ttl(Duration::from_secs(30))).await;
    let mut patient = with_ttl(Duration::from_secs(30));
    patient.recheck = Duration::from_secs(60);
    let waiter = factory.make(patient).await;
    let slow = FaultProxy::start(addrs[4]).await.expect("proxy");
    let mut via_slow = addrs.clone();
    via_slow[4] = slow.addr();
    let operator = factory
        .make_at(&via_slow, with_ttl(Duration::from_secs(30)))
        .await;

    let text = format!("late-break/{}", uuid::Uuid::new_v4().simple());
    let name = LockName::new(&text).expect("name");
    let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&name);
    let guard = holder.lock(&text).await.expect("acquire");
    // The last server loses the holder's key (four of five still hold it), so the
    // successor can take that server before the break arrives there.
    let mut last = raw(addrs[4]).await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut last)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1);
    let waiting = {
        let (waiter, text) = (waiter.clone(), text.clone());
        tokio::spawn(async move { waiter.lock_timeout(&text, Duration::from_secs(30)).await })
    };
    sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());

    slow.set_mode(ProxyMode::Delay {
        base: Duration::from_millis(800),
        jitter: Duration::ZERO,
    });
    let breaking = {
        let (operator, name) = (operator.clone(), name.clone());
        tokio::spawn(async move { operator.force_release(&name).await })
    };
    let successor = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is woken by the servers the break reached first")
        .expect("waiter task")
        .expect("the waiter gets the lock");
    let removed = timeout(Duration::from_secs(10), breaking)
        .await
        .expect("the break ends")
        .expect("break task")
        .expect("break")
        .expect("a holder removed");
    assert_eq!(
        removed.owner_token.as_deref(),
        Some(guard.owner_token().as_str())
    );
    let on_last: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut last)
        .await
        .expect("GET");
    assert!(
        on_last.is_some(),
        "the late break removed the successor's key from the last server"
    );
    assert_eq!(
        successor.release().await.expect("release"),
        ReleaseOutcome::Released,
        "the successor's release"
    );
    drop(guard);
}

lab::interleavings_suite!(RedisFactory::single());
