//! Holds over time: automatic renewal, its cap, manual mode, the lost signal and scoped runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockState, LostReason,
    ReleaseOutcome, RenewalMode, RunOutcome,
};
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, unique_name, with_ttl, PROMPT};
use crate::factory::Factory;

/// Auto-renewal keeps a lock for 3 x TTL with no other holder getting it.
pub async fn auto_renewal_keeps_lock(factory: &dyn Factory) {
    let name = unique_name("renewal");
    let ttl = factory.short_ttl();
    let holder = factory.client(with_ttl(ttl)).await;
    let other = factory.client(with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let first_deadline = guard.valid_until();
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        assert!(
            other.try_lock(name.as_str()).await.expect("try").is_none(),
            "another client acquired a renewed lock"
        );
        assert_eq!(guard.state(), LockState::Held);
        sleep(ttl / 4).await;
    }
    assert!(
        guard.valid_until() > first_deadline,
        "renewal moves the deadline"
    );
    assert!(guard.is_held());
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A TTL chosen per acquire ([`AcquireOptions::with_ttl`], [`LockGuard::extend_for`]) is
/// honoured where the backend says so ([`Capabilities::per_lock_ttl`]): the guard promises
/// that lease and the hold outlives the client's own TTL. Where the lease is the
/// session's (ZooKeeper, etcd), it is refused with [`ErrorKind::Unsupported`] naming the
/// TTL, and takes nothing.
///
/// [`LockGuard::extend_for`]: lock_core::LockGuard::extend_for
/// [`Capabilities::per_lock_ttl`]: lock_core::Capabilities::per_lock_ttl
pub async fn per_acquire_ttl_honoured_or_refused(factory: &dyn Factory) {
    let rule = "per_acquire_ttl_honoured_or_refused";
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let longer = ttl * 3;
    let holder = factory.client(with_ttl(ttl)).await;
    let other = factory.client(with_ttl(ttl)).await;
    let asked = Instant::now();
    let attempt = holder
        .acquire(&name, &AcquireOptions::try_once().with_ttl(longer).manual())
        .await;
    if !holder.capabilities().per_lock_ttl {
        let err = attempt.expect_err("a per-acquire ttl on a session-wide lease");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("ttl"), "{err}");
        let guard = other
            .try_lock(name.as_str())
            .await
            .expect("try")
            .expect("the refused acquire took nothing");
        let err = guard.extend_for(longer).await.expect_err("another ttl");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(guard.is_held(), "a refused extension keeps the hold");
        guard.release().await.expect("release");
        eventually_empty(factory, std::slice::from_ref(&name), rule).await;
        return;
    }
    let guard = attempt.expect("acquire").expect("a free name");
    let promised = guard.valid_until().saturating_duration_since(asked);
    assert!(
        promised > ttl * 2 && promised <= longer,
        "[{rule}] asked for {longer:?}, promised {promised:?}"
    );
    // No renewal (manual): only the chosen lease keeps it past the client's TTL.
    sleep(ttl + ttl / 2).await;
    assert!(
        guard.is_held(),
        "[{rule}] the chosen lease is still running"
    );
    assert!(
        other.try_lock(name.as_str()).await.expect("try").is_none(),
        "[{rule}] granted to another after the client's ttl, within the chosen {longer:?}"
    );
    let before = Instant::now();
    let until = guard
        .extend_for(longer)
        .await
        .expect("extend for the chosen ttl");
    assert!(
        until.saturating_duration_since(before) > ttl * 2,
        "extended for {longer:?}"
    );
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    eventually_empty(factory, std::slice::from_ref(&name), rule).await;
}

/// With a hold cap, auto-renewal stops at the cap: the guard turns Lost (hold cap) and
/// another client gets the lock.
pub async fn hold_cap_ends_renewal(factory: &dyn Factory) {
    let name = unique_name("hold_cap");
    let ttl = factory.short_ttl();
    let holder = factory.client(with_ttl(ttl)).await;
    let other = factory.client(with_ttl(ttl)).await;
    let cap = ttl * 2;
    let started = Instant::now();
    let guard = holder
        .acquire(&name, &AcquireOptions::forever().with_max_hold(cap))
        .await
        .expect("acquire")
        .expect("acquired");
    let reason = timeout(cap + PROMPT, guard.lost())
        .await
        .expect("lost at the cap");
    assert_eq!(reason.without_side(), LostReason::HoldCapReached);
    assert!(started.elapsed() >= cap - ttl / 10, "lost before the cap");
    let next = other
        .lock_timeout(name.as_str(), ttl + PROMPT)
        .await
        .expect("another client acquires after the cap");
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::HoldCapReached)
    ));
    assert!(
        other.try_lock(name.as_str()).await.expect("try").is_none() || next.is_held(),
        "the capped holder's release must not free the successor's lock"
    );
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Manual mode: extend while held works; without extend the lock is lost after its TTL;
/// extend after the loss says lost.
pub async fn manual_mode(factory: &dyn Factory) {
    let name = unique_name("manual");
    let ttl = factory.short_ttl();
    let mut options = with_ttl(ttl);
    options.renewal = RenewalMode::Manual;
    let holder = factory.client(options).await;
    let other = factory.client(with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let first = guard.valid_until();
    sleep(ttl / 2).await;
    let extended = guard.extend().await.expect("extend while held");
    assert!(extended > first, "extend moves the deadline");
    assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    let reason = timeout(ttl * 2 + PROMPT, guard.lost())
        .await
        .expect("lost without extend");
    assert_eq!(reason.without_side(), LostReason::Expired, "{reason:?}");
    let err = guard.extend().await.expect_err("extend after loss");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let next = other
        .lock_timeout(name.as_str(), ttl + PROMPT)
        .await
        .expect("another client acquires the expired lock");
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    assert!(next.is_held());
    assert_eq!(
        next.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The lost signal fires when the lock is stolen behind its holder, and the holder's
/// release then reports "already lost" without touching the new holder's lock.
pub async fn lost_signal_on_steal(factory: &dyn Factory) {
    let name = unique_name("steal");
    let ttl = factory.short_ttl();
    let holder = factory.client(with_ttl(ttl)).await;
    let thief = factory.client(with_ttl(ttl)).await;
    let third = factory.client(with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    factory.steal(&name).await;
    // A lock of several parts (a dual lock stolen on one side) is free once its holder's
    // next renewal finds the part gone and gives back the others: a third of the TTL.
    let successor = thief
        .lock_timeout(name.as_str(), ttl / 3 + PROMPT)
        .await
        .expect("the stolen lock is free for others");
    let reason = timeout(ttl + PROMPT, guard.lost())
        .await
        .expect("the lost signal fires within the renewal interval");
    assert!(
        matches!(
            reason.without_side(),
            LostReason::Taken | LostReason::Vanished | LostReason::Expired
        ),
        "unexpected reason {reason:?}"
    );
    assert!(matches!(
        guard.release().await.expect("release of a lost lock"),
        ReleaseOutcome::AlreadyLost(_)
    ));
    assert!(
        third.try_lock(name.as_str()).await.expect("try").is_none(),
        "the old holder's release removed the successor's lock"
    );
    assert_eq!(
        successor.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A scoped run completes and releases when the lock stays held, and is cancelled with
/// a Lost outcome when the lock is stolen mid-run.
pub async fn scoped_run_cancels_on_loss(factory: &dyn Factory) {
    let ttl = factory.short_ttl();
    let client = factory.client(with_ttl(ttl)).await;
    let name = unique_name("scoped");
    let outcome = client
        .with_lock(
            name.as_str(),
            &AcquireOptions::forever(),
            |ctx| async move { ctx.fencing_token },
        )
        .await
        .expect("run");
    assert!(matches!(
        outcome,
        RunOutcome::Completed {
            release: ReleaseOutcome::Released,
            ..
        }
    ));

    let finished = Arc::new(AtomicU64::new(0));
    let run = {
        let finished = Arc::clone(&finished);
        let name = name.clone();
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            client
                .with_lock(
                    name.as_str(),
                    &AcquireOptions::forever(),
                    |_ctx| async move {
                        sleep(Duration::from_secs(60)).await;
                        finished.store(1, Ordering::SeqCst);
                    },
                )
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    factory.steal(&name).await;
    let outcome = timeout(ttl + PROMPT, run)
        .await
        .expect("the run ends when its lock is lost")
        .expect("run task")
        .expect("run");
    assert!(matches!(outcome, RunOutcome::Lost { .. }), "{outcome:?}");
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the work was not cancelled"
    );
    eventually_empty(factory, &[name], "scoped_run_cancels_on_loss").await;
}
