//! The dual (migration) lock and the advance check on two in-memory spaces: the old side
//! and the new side. The same rules run against real servers in the conformance crate.

use std::sync::Arc;
use std::time::Duration;

use lock_core::memory::MemorySpace;
use lock_core::migration::Side;
use lock_core::migration::{CheckOptions, Step};
use lock_core::{
    connect, AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockName, LostReason,
};
use tokio::time::{sleep, timeout};

/// Two fresh spaces and the URLs of the three phases over them.
struct Fleet {
    old_space: String,
    new_space: String,
}

impl Fleet {
    fn new() -> Self {
        let fresh = || format!("migration-{}", uuid::Uuid::new_v4().simple());
        Fleet {
            old_space: fresh(),
            new_space: fresh(),
        }
    }

    fn old_url(&self, query: &str) -> String {
        format!("memory://{}{query}", self.old_space)
    }

    fn new_url(&self, query: &str) -> String {
        format!("memory://{}{query}", self.new_space)
    }

    fn dual_url(&self, query: &str) -> String {
        format!("dual:{}|{}", self.old_url(query), self.new_url(query))
    }

    async fn clients(&self, query: &str) -> [Arc<dyn DistributedLock>; 3] {
        let connect = |url: String| async move { connect(&url).await.expect("connect") };
        [
            connect(self.old_url(query)).await,
            connect(self.dual_url(query)).await,
            connect(self.new_url(query)).await,
        ]
    }
}

#[tokio::test]
async fn dual_excludes_both_neighbours_and_frees_both_sides() {
    let fleet = Fleet::new();
    let [old, dual, new] = fleet.clients("").await;
    let guard = dual.lock("jobs").await.expect("dual lock");
    assert!(
        old.try_lock("jobs").await.unwrap().is_none(),
        "old-only got it"
    );
    assert!(
        new.try_lock("jobs").await.unwrap().is_none(),
        "new-only got it"
    );
    guard.release().await.expect("release");
    let held_old = old.try_lock("jobs").await.unwrap().expect("old side free");
    assert!(
        dual.try_lock("jobs").await.unwrap().is_none(),
        "dual got it"
    );
    let held_new = new.try_lock("jobs").await.unwrap().expect("new side free");
    held_old.release().await.unwrap();
    assert!(
        dual.try_lock("jobs").await.unwrap().is_none(),
        "dual got it"
    );
    held_new.release().await.unwrap();
    assert_eq!(dual.capabilities().backend, "dual");
}

#[tokio::test]
async fn a_dual_try_refused_on_the_new_side_leaves_the_old_side_free() {
    let fleet = Fleet::new();
    let [old, dual, new] = fleet.clients("").await;
    let held = new.lock("jobs").await.unwrap();
    assert!(dual.try_lock("jobs").await.unwrap().is_none());
    let again = old.try_lock("jobs").await.unwrap();
    assert!(again.is_some(), "the refused dual try kept the old side");
    held.release().await.unwrap();
}

#[tokio::test]
async fn fencing_tokens_never_go_back_across_adjacent_phases() {
    let fleet = Fleet::new();
    let [old, dual, new] = fleet.clients("").await;
    let mut last = 0;
    // Every order of adjacent phases: old, dual, old, dual, new, dual, new, new, dual.
    let order: [&Arc<dyn DistributedLock>; 9] =
        [&old, &dual, &old, &dual, &new, &dual, &new, &new, &dual];
    for (step, client) in order.into_iter().enumerate() {
        let guard = client.lock("jobs").await.unwrap();
        let token = guard.fencing_token().get();
        assert!(token > last, "step {step}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_dual_token_is_the_old_token_while_the_new_counter_is_behind() {
    let fleet = Fleet::new();
    let [old, dual, _] = fleet.clients("").await;
    for _ in 0..5 {
        old.lock("jobs").await.unwrap().release().await.unwrap();
    }
    let guard = dual.lock("jobs").await.unwrap();
    assert_eq!(guard.fencing_token().get(), 6, "the old side's sixth grant");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn losing_the_new_side_says_which_side() {
    let fleet = Fleet::new();
    let [_, dual, _] = fleet.clients("?ttl=300ms").await;
    let guard = dual.lock("jobs").await.unwrap();
    let name = LockName::new("jobs").unwrap();
    assert!(MemorySpace::named(&fleet.new_space).steal(&name));
    let reason = timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost within the TTL");
    assert_eq!(
        reason,
        LostReason::OnSide {
            side: Side::New,
            reason: &LostReason::Vanished
        },
        "{reason}"
    );
    assert_eq!(reason.without_side(), LostReason::Vanished);
    assert!(reason.to_string().contains("new backend"), "{reason}");
}

#[tokio::test]
async fn the_old_side_is_renewed_while_the_new_side_is_awaited() {
    let fleet = Fleet::new();
    let [old, dual, new] = fleet.clients("?ttl=300ms").await;
    let held = new.lock("jobs").await.unwrap();
    let waiting = tokio::spawn({
        let dual = Arc::clone(&dual);
        async move { dual.lock("jobs").await }
    });
    // Three TTLs: without renewal the dual's old-side hold would have expired.
    for _ in 0..9 {
        sleep(Duration::from_millis(100)).await;
        assert!(
            old.try_lock("jobs").await.unwrap().is_none(),
            "old side free while a dual waits on the new side"
        );
    }
    held.release().await.unwrap();
    let guard = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted")
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_dual_acquire_leaves_neither_side_held() {
    let fleet = Fleet::new();
    let [old, dual, new] = fleet.clients("").await;
    let held = new.lock("jobs").await.unwrap();
    let name = LockName::new("jobs").unwrap();
    let err = dual
        .acquire(&name, &AcquireOptions::timeout(Duration::from_millis(200)))
        .await
        .expect_err("times out on the new side");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let mut freed = None;
    for _ in 0..50 {
        freed = old.try_lock("jobs").await.unwrap();
        if freed.is_some() {
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }
    assert!(freed.is_some(), "the old side stayed held");
    held.release().await.unwrap();
    assert_eq!(MemorySpace::named(&fleet.new_space).waiters(&name), 0);
}

#[tokio::test]
async fn bad_dual_configurations_are_refused_with_typed_errors() {
    let fleet = Fleet::new();
    let cases = [
        (
            format!("dual:{}|{}", fleet.old_url("?ttl=5s"), fleet.new_url("")),
            ErrorKind::InvalidConfig,
            "ttl",
        ),
        (
            format!("dual:{}", fleet.old_url("")),
            ErrorKind::InvalidConfig,
            "dual:<old url>|<new url>",
        ),
        (
            format!("dual:{}|dual:{}", fleet.old_url(""), fleet.new_url("")),
            ErrorKind::InvalidConfig,
            "exactly one",
        ),
        (
            format!("dual:foo://x|{}", fleet.new_url("")),
            ErrorKind::UnknownScheme,
            "foo",
        ),
    ];
    for (url, kind, needle) in cases {
        let err = connect(&url).await.expect_err(&url);
        assert_eq!(err.kind(), kind, "{url}: {err}");
        assert!(err.to_string().contains(needle), "{url}: {err}");
    }
}

#[tokio::test]
async fn the_check_reports_old_only_holders_until_they_stop() {
    let fleet = Fleet::new();
    let [old, dual, _] = fleet.clients("").await;
    let names = [
        LockName::new("jobs").unwrap(),
        LockName::new("reports").unwrap(),
    ];
    let options = CheckOptions {
        watch: Duration::from_millis(300),
        interval: Duration::from_millis(50),
    };
    let registry = lock_core::raw::driver::registry();
    let url = fleet.dual_url("");
    let by_dual = dual.lock("reports").await.unwrap();
    let by_old = old.lock("jobs").await.unwrap();
    let report = registry
        .migration_check(&url, Step::DualToNew, &names, &options)
        .await
        .unwrap();
    assert!(!report.is_clear(), "{report}");
    assert_eq!(report.unmarked.len(), 1, "{report}");
    let seen = &report.unmarked[0];
    assert_eq!((seen.name.as_str(), seen.side), ("jobs", Side::Old));
    assert_eq!(
        seen.owner_token.as_deref(),
        Some(by_old.owner_token().as_str())
    );
    assert!(report.looks >= 3, "{report}");
    by_old.release().await.unwrap();
    let report = registry
        .migration_check(&url, Step::DualToNew, &names, &options)
        .await
        .unwrap();
    assert!(report.is_clear(), "{report}");
    by_dual.release().await.unwrap();
}

#[tokio::test]
async fn the_check_before_rolling_back_sees_new_only_holders_and_token_gaps() {
    let fleet = Fleet::new();
    let [_, dual, new] = fleet.clients("").await;
    let names = [LockName::new("jobs").unwrap()];
    let options = CheckOptions {
        watch: Duration::from_millis(100),
        interval: Duration::from_millis(50),
    };
    let registry = lock_core::raw::driver::registry();
    let url = fleet.dual_url("");
    dual.lock("jobs").await.unwrap().release().await.unwrap();
    let report = registry
        .migration_check(&url, Step::DualToOld, &names, &options)
        .await
        .unwrap();
    assert!(report.is_clear(), "{report}");
    // New-only grants push the counter past the old side's tokens.
    let by_new = new.lock("jobs").await.unwrap();
    let report = registry
        .migration_check(&url, Step::DualToOld, &names, &options)
        .await
        .unwrap();
    assert_eq!(report.unmarked.len(), 1, "{report}");
    assert_eq!(report.unmarked[0].side, Side::New);
    assert_eq!(report.token_gaps.len(), 1, "{report}");
    assert!(report.to_string().contains("could go back"), "{report}");
    by_new.release().await.unwrap();
    let report = registry
        .migration_check(&url, Step::NewToDual, &names, &options)
        .await
        .unwrap();
    assert!(report.is_clear(), "{report}");
    let err = registry
        .migration_check(&fleet.old_url(""), Step::DualToNew, &names, &options)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

#[tokio::test]
async fn a_hold_lost_on_one_side_frees_the_other_at_once() {
    let fleet = Fleet::new();
    let [old, dual, new] = fleet.clients("?ttl=30s").await;
    let name = LockName::new("jobs").unwrap();
    for (stolen, survivor, space) in [
        (Side::New, &old, &fleet.new_space),
        (Side::Old, &new, &fleet.old_space),
    ] {
        let guard = dual.lock("jobs").await.unwrap();
        assert!(MemorySpace::named(space).steal(&name));
        // Renewal (at a third of the 30 s TTL) finds the loss; extend asks now.
        let err = guard.extend().await.expect_err("lost");
        assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
        assert_eq!(
            guard.state(),
            lock_core::LockState::Lost(LostReason::on_side(stolen, LostReason::Vanished))
        );
        let freed = survivor.try_lock("jobs").await.unwrap();
        assert!(
            freed.is_some(),
            "the {stolen} side was lost but the other stayed held"
        );
        freed.unwrap().release().await.unwrap();
        drop(guard);
    }
}
