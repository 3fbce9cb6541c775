//! The advance check with PostgreSQL as the watched side, on the binary's shared servers:
//! before `dual-to-new` it sights old-only PostgreSQL holders and waiters (and no dual
//! client), and before `dual-to-old` new-only PostgreSQL holders, each with its client
//! session and owner token, as `lockctl migration check` does on ZooKeeper -> Redis.

use std::time::Duration;

use conformance::rules::unique_name;
use conformance::Factory;
use lab::dual::{DualFactory, SideFactory};
use lock_core::migration::{CheckOptions, CheckReport, Role, Side, Step};
use lock_core::{DistributedLockExt, LockGuard, LockName};
use tokio::time::{sleep, Instant};

use testkit::dual::{shared_postgres_redis, shared_zk_postgres};

/// How long each check watches, and how often it looks.
const CHECK: CheckOptions = CheckOptions {
    watch: Duration::from_millis(600),
    interval: Duration::from_millis(100),
};

/// Runs the check of `step` on `name` with `dual`'s URL; the looks must not fail.
async fn check<O: SideFactory, N: SideFactory>(
    dual: &DualFactory<O, N>,
    step: Step,
    name: &LockName,
) -> CheckReport {
    let report = lock_core::raw::driver::registry()
        .migration_check(&dual.url(), step, std::slice::from_ref(name), &CHECK)
        .await
        .expect("the check runs");
    assert!(report.failures.is_empty(), "{report}");
    report
}

/// Asserts that `report` sights exactly the one unmarked holder `held` on `side`, with
/// its owner token, and its client session when `postgres` (a Redis holder has none).
fn sights_holder(report: &CheckReport, side: Side, held: &LockGuard, postgres: bool) {
    assert!(!report.is_clear(), "{report}");
    let [seen] = report.unmarked.as_slice() else {
        panic!("one unmarked participant: {report}");
    };
    assert_eq!((seen.side, seen.role), (side, Role::Holder), "{report}");
    assert_eq!(
        seen.owner_token.as_deref(),
        Some(held.owner_token().as_str()),
        "{report}"
    );
    assert_eq!(seen.session.is_some(), postgres, "{report}");
}

/// PostgreSQL -> Redis: an old-only PostgreSQL holder, then its waiter, are reported
/// before `dual-to-new`; a dual holder is not, before either step back or forth; a
/// new-only Redis holder is reported before `dual-to-old`, and once it is gone its token
/// (seeded from Redis's clock, far above the PostgreSQL counter) is a token gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_sights_old_only_postgres_clients() {
    let Some(dual) = shared_postgres_redis().await else {
        return;
    };
    let name = unique_name("check-postgres-old");
    let old_only = dual.old().client(Default::default()).await;
    let held = old_only.lock(name.as_str()).await.expect("old-only holder");
    let report = check(&dual, Step::DualToNew, &name).await;
    sights_holder(&report, Side::Old, &held, true);

    let other = dual.old().client(Default::default()).await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            other
                .lock_timeout(name.as_str(), Duration::from_secs(30))
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while old_only
        .inspect(&name)
        .await
        .expect("inspect")
        .waiters
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the old-only waiter never queued"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let report = check(&dual, Step::DualToNew, &name).await;
    let roles: Vec<Role> = report.unmarked.iter().map(|seen| seen.role).collect();
    assert!(roles.contains(&Role::Waiter), "{report}");
    assert!(report.unmarked.iter().all(|seen| seen.side == Side::Old));
    held.release().await.expect("release");
    let next = waiting.await.expect("task").expect("the waiter is granted");
    next.release().await.expect("release");

    let dual_client = dual.client(Default::default()).await;
    let held = dual_client.lock(name.as_str()).await.expect("dual holder");
    for step in [Step::DualToNew, Step::DualToOld] {
        let report = check(&dual, step, &name).await;
        assert!(report.is_clear(), "{report}");
    }
    held.release().await.expect("release");

    let new_only = dual.new_side().client(Default::default()).await;
    let held = new_only.lock(name.as_str()).await.expect("new-only holder");
    let report = check(&dual, Step::DualToOld, &name).await;
    sights_holder(&report, Side::New, &held, false);
    held.release().await.expect("release");
    let back = check(&dual, Step::DualToOld, &name).await;
    assert!(back.unmarked.is_empty(), "{back}");
    assert_eq!(back.token_gaps.len(), 1, "{back}");
    assert!(check(&dual, Step::DualToNew, &name).await.is_clear());
}

/// ZooKeeper -> PostgreSQL: a new-only PostgreSQL holder is reported before
/// `dual-to-old` and a dual holder is not; nothing is reported before `dual-to-new`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_sights_new_only_postgres_clients() {
    let Some(dual) = shared_zk_postgres().await else {
        return;
    };
    let name = unique_name("check-postgres-new");
    let new_only = dual.new_side().client(Default::default()).await;
    let held = new_only.lock(name.as_str()).await.expect("new-only holder");
    let report = check(&dual, Step::DualToOld, &name).await;
    sights_holder(&report, Side::New, &held, true);
    assert!(check(&dual, Step::DualToNew, &name).await.is_clear());
    held.release().await.expect("release");

    let dual_client = dual.client(Default::default()).await;
    let held = dual_client.lock(name.as_str()).await.expect("dual holder");
    let report = check(&dual, Step::DualToOld, &name).await;
    assert!(report.unmarked.is_empty(), "{report}");
    assert!(check(&dual, Step::DualToNew, &name).await.is_clear());
    held.release().await.expect("release");
}
