//! Reentrant holds by one owner.

use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, LockGuard, LockName, LockOptions,
    ReleaseOutcome,
};
use tokio::time::timeout;

use super::{unique_name, with_ttl, PROMPT};
use crate::factory::Factory;

/// Reentrancy by explicit owner id: the same owner re-acquires at once and shares the
/// hold; another owner is excluded; the lock is freed by the last release only.
pub async fn reentrancy_by_owner(factory: &dyn Factory) {
    let name = unique_name("reentrant");
    let client = factory.client(LockOptions::default()).await;
    let other = factory.client(LockOptions::default()).await;
    let (outer, inner) = reentrant_pair(&*client, &name).await;
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    let stranger = client
        .acquire(&name, &AcquireOptions::try_once().reentrant("job-7"))
        .await
        .expect("try by another owner");
    assert!(stranger.is_none(), "another owner id must be excluded");
    assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    assert_eq!(
        inner.release().await.expect("inner"),
        ReleaseOutcome::Released
    );
    assert!(outer.is_held(), "the outer hold survives the inner release");
    assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    assert_eq!(
        outer.release().await.expect("outer"),
        ReleaseOutcome::Released
    );
    let next = other
        .try_lock(name.as_str())
        .await
        .expect("try")
        .expect("free after the last release");
    next.release().await.expect("release");
}

/// Two guards of one hold: owner `job-42` acquires `name`, then acquires it again.
async fn reentrant_pair(client: &dyn DistributedLock, name: &LockName) -> (LockGuard, LockGuard) {
    let outer = client
        .acquire(name, &AcquireOptions::forever().reentrant("job-42"))
        .await
        .expect("acquire")
        .expect("acquired");
    let inner = client
        .acquire(name, &AcquireOptions::try_once().reentrant("job-42"))
        .await
        .expect("reentrant acquire")
        .expect("the same owner re-acquires without waiting");
    (outer, inner)
}

/// Reentrancy on a lost hold: releasing a guard that is not the last one of the hold
/// reports the loss (`AlreadyLost`), never `Released`.
pub async fn reentrant_release_reports_loss(factory: &dyn Factory) {
    let name = unique_name("reentrant-lost");
    let ttl = factory.short_ttl();
    let client = factory.client(with_ttl(ttl)).await;
    let (outer, inner) = reentrant_pair(&*client, &name).await;
    factory.steal(&name).await;
    let reason = timeout(ttl + PROMPT, outer.lost())
        .await
        .expect("the lost signal fires within the renewal interval");
    let inner_outcome = inner.release().await.expect("release of the inner guard");
    assert!(
        matches!(inner_outcome, ReleaseOutcome::AlreadyLost(_)),
        "the inner guard of a hold lost by {reason:?} reported {inner_outcome:?}"
    );
    assert!(matches!(
        outer.release().await.expect("release of the outer guard"),
        ReleaseOutcome::AlreadyLost(_)
    ));
}
