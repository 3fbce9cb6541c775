//! Multi-locks: all or nothing, no deadlock between callers asking for overlapping sets
//! in any order, Lost as soon as a part is, nothing held after a cancellation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{AcquireOptions, DistributedLockExt, LockName, LockOptions, MultiLock};
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, unique_name, PROMPT};
use crate::factory::Factory;
use crate::fence::FencedResource;
use crate::with_ttl;

/// Three clients take overlapping sets of names, given in different orders, 6 times
/// each: nobody deadlocks, every part's fenced writes never overlap, and a try on a set
/// with one held name takes none of it.
pub async fn multilock_all_or_nothing_without_deadlock(factory: &dyn Factory) {
    const ROUNDS: usize = 6;
    let rule = "multilock_all_or_nothing_without_deadlock";
    let names: Vec<LockName> = (0..4).map(|_| unique_name(rule)).collect();
    let resources: Vec<FencedResource> = names.iter().map(|_| FencedResource::new()).collect();
    let sets: [Vec<usize>; 3] = [vec![0, 1, 2], vec![2, 1, 0], vec![3, 2, 0]];
    let by_name: HashMap<LockName, FencedResource> = names
        .iter()
        .cloned()
        .zip(resources.iter().cloned())
        .collect();
    let mut tasks = Vec::new();
    for set in sets {
        let client = factory.client(LockOptions::default()).await;
        let parts: Vec<&str> = set.iter().map(|&i| names[i].as_str()).collect();
        let multi = MultiLock::new(Arc::clone(&client), parts).expect("names");
        let by_name = by_name.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = multi
                    .acquire_with(&AcquireOptions::timeout(Duration::from_secs(30)))
                    .await
                    .expect("no deadlock: every set is granted")
                    .expect("a waiting acquire ends holding");
                assert!(guard.is_held());
                for part in guard.parts() {
                    let written = by_name[part.name()]
                        .hold_section(part, sleep(Duration::from_millis(20)))
                        .await
                        .expect("a part's token is never stale");
                    assert!(written, "a held part's write is never stale");
                }
                guard.release().await.expect("release");
            }
            drop(client);
        }));
    }
    for task in join_all(tasks).await {
        task.expect("contender task");
    }
    for (name, resource) in names.iter().zip(&resources) {
        let report = resource.check();
        assert!(report.is_safe(), "{name}: two holders at once: {report:?}");
    }

    let holder = factory.client(LockOptions::default()).await;
    let other = factory.client(LockOptions::default()).await;
    let held = holder.lock(names[2].as_str()).await.expect("acquire");
    let multi =
        MultiLock::new(Arc::clone(&other), [names[0].as_str(), names[2].as_str()]).expect("names");
    assert!(
        multi
            .acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a set with a held name is not acquired"
    );
    let free = other
        .try_lock(names[0].as_str())
        .await
        .expect("try")
        .expect("the free part was not kept by the failed multi-lock");
    free.release().await.expect("release");
    held.release().await.expect("release");
    eventually_empty(factory, &names, rule).await;
}

/// A multi-lock is Lost as soon as one part is (stolen behind its back), and an acquire
/// dropped while it waits for its last part leaves none of the parts it had taken.
pub async fn multilock_lost_part_and_cancellation(factory: &dyn Factory) {
    let rule = "multilock_lost_part_and_cancellation";
    let names: Vec<LockName> = (0..3).map(|_| unique_name(rule)).collect();
    // A short TTL: the steal is found at the part's next renewal, a third of it later.
    let ttl = factory.short_ttl();
    let client = factory.client(with_ttl(ttl)).await;
    let multi =
        MultiLock::new(Arc::clone(&client), names.iter().map(LockName::as_str)).expect("names");
    let guard = multi
        .acquire_with(&AcquireOptions::timeout(PROMPT))
        .await
        .expect("acquire")
        .expect("free names");
    let tokens = guard.fencing_tokens();
    assert_eq!(tokens.len(), 3, "a token per name");
    let lost = guard.lost();
    factory.steal(&names[1]).await;
    let reason = timeout(ttl + PROMPT, lost)
        .await
        .expect("the whole is Lost once a part is");
    assert!(guard.state().is_lost(), "state after {reason:?}");
    drop(guard);
    eventually_empty(factory, &names, rule).await;

    // The last name (in sorted order) is held elsewhere: the multi-lock takes the others,
    // waits for it, and is dropped while it waits.
    let last = names.iter().max().expect("names").clone();
    let other = factory.client(LockOptions::default()).await;
    let held = other.lock(last.as_str()).await.expect("acquire");
    let forever = AcquireOptions::forever();
    let waiting = multi.acquire_with(&forever);
    assert!(
        timeout(Duration::from_millis(500), waiting).await.is_err(),
        "the multi-lock waits for its held part"
    );
    let deadline = Instant::now() + PROMPT;
    for name in names.iter().filter(|n| **n != last) {
        loop {
            let free = other.try_lock(name.as_str()).await.expect("try");
            if let Some(part) = free {
                part.release().await.expect("release");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} is still held after the multi-lock was dropped"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
    held.release().await.expect("release");
    eventually_empty(factory, &names, rule).await;
}
