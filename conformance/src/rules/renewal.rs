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
