//! Names, many locks on one client, and bad URLs and options.

use std::time::Duration;

use futures::future::join_all;
use lock_core::raw::backend::{AcquireKind, HoldKind};
use lock_core::raw::names::MAX_NAME_BYTES;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockName, LockOptions,
    LockState, ReleaseOutcome,
};
use tokio::time::sleep;

use super::{eventually_empty, unique_name, with_ttl, PROMPT};
use crate::factory::{with_query, Factory};

/// Names: `jobs` and `jobs/daily` are independent, reserved characters are escaped, and
/// empty, oversized or invalid names get a clear error and leave nothing behind.
pub async fn names_are_independent_and_checked(factory: &dyn Factory) {
    let client = factory.client(LockOptions::default()).await;
    let base = unique_name("names");
    let variants = [
        "jobs",
        "jobs/daily",
        "jobs/",
        "jobs//daily",
        "{jobs}",
        "jobs%2Fdaily",
        "jobs daily",
        "jöbs",
        "jobs.",
        "..",
        ".",
        "_c_x-lock-0000000001",
        "*",
        "jobs:daily",
    ];
    let mut guards = Vec::new();
    let mut names = Vec::new();
    for v in variants {
        let name = LockName::new(format!("{base}/{v}")).expect("valid name");
        let guard = client
            .try_lock(name.as_str())
            .await
            .unwrap_or_else(|err| panic!("name {name:?}: {err}"));
        let guard = guard.unwrap_or_else(|| panic!("{name:?} collided with another name"));
        names.push(name);
        guards.push(guard);
    }
    // Bare names too (no shared prefix), including the two the contract names.
    for bare in ["jobs", "jobs/daily"] {
        let name =
            LockName::new(format!("{}-{bare}", uuid::Uuid::new_v4().simple())).expect("valid");
        let guard = client.try_lock(name.as_str()).await.expect("try");
        guards.push(guard.expect("bare name acquired"));
        names.push(name);
    }
    for guard in guards {
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let oversized = "x".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", oversized.as_str(), "a\0b", "a\nb"] {
        let err = client.try_lock(bad).await.expect_err("bad name");
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
        assert!(!err.is_retryable());
    }
    eventually_empty(factory, &names, "names_are_independent_and_checked").await;
}

/// One client holds 1,000 distinct locks at once, keeps them through renewals, and
/// releases them all.
pub async fn thousand_locks_one_client(factory: &dyn Factory) {
    const LOCKS: usize = 1000;
    // 100 acquires at once on a starved machine (RedLock's per-node timeout is TTL/10,
    // and each acquire is two rounds on five servers): 3 s left a round of 300 ms with
    // none of five answering in time while `make test` ran 4 jobs on 2 cores; 5 s leaves
    // them room.
    let ttl = factory.short_ttl().max(Duration::from_secs(5));
    let client = factory.client(with_ttl(ttl)).await;
    let other = factory.client(with_ttl(ttl)).await;
    let base = unique_name("many");
    let names: Vec<LockName> = (0..LOCKS)
        .map(|i| LockName::new(format!("{base}/{i}")).expect("valid"))
        .collect();
    let mut guards = Vec::with_capacity(LOCKS);
    for chunk in names.chunks(100) {
        let acquired = join_all(chunk.iter().map(|n| client.try_lock(n.as_str()))).await;
        for (name, guard) in chunk.iter().zip(acquired) {
            guards.push(
                guard
                    .expect("try")
                    .unwrap_or_else(|| panic!("{name:?} not acquired")),
            );
        }
    }
    sleep(ttl + ttl / 2).await;
    for (i, guard) in guards.iter().enumerate() {
        assert_eq!(
            guard.state(),
            LockState::Held,
            "lock {i} not kept through renewal"
        );
    }
    for name in names.iter().step_by(97) {
        assert!(other.try_lock(name.as_str()).await.expect("try").is_none());
    }
    // Released 100 at a time, as they were taken: a release ends the hold's renewal at
    // once, so a thousand released together must all be confirmed within what is left of
    // their lease (two thirds of a TTL at least), which a starved machine did not do for
    // PostgreSQL (one came back `AlreadyLost(Expired)` under `make test`).
    let mut guards = guards.into_iter();
    loop {
        let chunk: Vec<_> = guards.by_ref().take(100).collect();
        if chunk.is_empty() {
            break;
        }
        for outcome in join_all(chunk.into_iter().map(|g| g.release())).await {
            assert_eq!(outcome.expect("release"), ReleaseOutcome::Released);
        }
    }
    eventually_empty(factory, &names, "thousand_locks_one_client").await;
}

/// Malformed URLs and options get clear typed errors, never a panic.
pub async fn bad_urls_and_options(factory: &dyn Factory) {
    let url = factory.url();
    let cases = [
        "ttl=abc",
        "ttl=0s",
        "renewal=sometimes",
        "no_such_option=1",
        "ttl=100000h",
    ]
    .map(|query| with_query(&url, query));
    for case in &cases {
        match lock_core::connect(case).await {
            Ok(client) => panic!("{case} was accepted: {client}"),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{case}: {err}");
                assert!(!err.is_retryable());
            }
        }
    }
    let client = factory.client(LockOptions::default()).await;
    let name = unique_name("bad_options");
    let min = client.capabilities().min_ttl;
    if min > Duration::from_nanos(1) {
        let err = client
            .acquire(&name, &AcquireOptions::try_once().with_ttl(min / 2))
            .await
            .expect_err("ttl below the backend minimum");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidConfig | ErrorKind::Unsupported
            ),
            "{err}"
        );
    }
    let err = client
        .acquire(&name, &AcquireOptions::try_once().with_ttl(Duration::ZERO))
        .await
        .expect_err("zero ttl");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidConfig | ErrorKind::Unsupported
        ),
        "{err}"
    );
    eventually_empty(factory, &[name], "bad_urls_and_options").await;
}

/// A name held as one kind (a mutex or an election, a semaphore, a read-write lock)
/// refuses every kind of another primitive with a `Conflict` that is not retryable,
/// once and waiting, on every backend; nothing of the refused acquire is left, and the
/// name is taken again as its own kind as soon as its holder releases.
pub async fn names_used_as_two_kinds_refused(factory: &dyn Factory) {
    let rule = "names_used_as_two_kinds_refused";
    let kinds = [
        HoldKind::Mutex,
        HoldKind::Candidate {
            value: b"leader".to_vec(),
        },
        HoldKind::permit(2),
        HoldKind::Read,
        HoldKind::Write,
    ];
    let holder = factory.client(LockOptions::default()).await;
    let other = factory.client(LockOptions::default()).await;
    let with_kind = |wait: AcquireOptions, kind: &HoldKind| wait.with_kind(kind.clone());
    let mut wrong = Vec::new();
    for held in &kinds {
        let name = unique_name(rule);
        let first = match holder
            .acquire(&name, &with_kind(AcquireOptions::try_once(), held))
            .await
        {
            Ok(first) => first.expect("a fresh name is free"),
            Err(err) if err.kind() == ErrorKind::Unsupported => continue,
            Err(err) => panic!("[{rule}] {} on a fresh name: {err}", held.describe()),
        };
        for asked in kinds
            .iter()
            .filter(|k| k.check_beside(held, &name).is_err())
        {
            for wait in [
                AcquireOptions::try_once(),
                AcquireOptions::timeout(Duration::from_secs(2)),
            ] {
                let waits = wait.wait != AcquireOptions::try_once().wait;
                match other.acquire(&name, &with_kind(wait, asked)).await {
                    Err(err) if err.kind() == ErrorKind::Unsupported => {}
                    Err(err) if err.kind() == ErrorKind::Conflict && !err.is_retryable() => {}
                    other => wrong.push(format!(
                        "{} beside {} (waiting: {waits}): {other:?}",
                        asked.describe(),
                        held.describe()
                    )),
                }
            }
        }
        assert_eq!(
            first.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let again = other
            .acquire(&name, &with_kind(AcquireOptions::timeout(PROMPT), held))
            .await;
        match again {
            Ok(Some(guard)) => {
                guard.release().await.expect("release");
            }
            refused => wrong.push(format!(
                "{} again after the refusals: {refused:?}",
                held.describe()
            )),
        }
        eventually_empty(factory, &[name], rule).await;
    }
    assert!(
        wrong.is_empty(),
        "[{rule}] {}: granted or refused wrongly: {wrong:#?}",
        factory.label()
    );
}
