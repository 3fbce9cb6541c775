//! What an operator does during an incident: see who holds a name and who waits, list the
//! names held under a prefix, and break a wedged hold.

use std::time::Duration;

use lock_core::{DistributedLockExt, LockName, LostReason, Participant, ReleaseOutcome};
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, push_only_options, with_ttl, PROMPT};
use crate::factory::Factory;

/// The holder's owner token shows as the guard's where the backend keeps one (a dual lock
/// stores it behind its mark).
fn shows_owner(participant: &Participant, guard: &lock_core::LockGuard) -> bool {
    participant
        .owner_token
        .as_deref()
        .is_none_or(|shown| shown.ends_with(guard.owner_token().as_str()))
}

/// Inspect shows the holder (and the waiter, where the backend queues); a listing of a
/// prefix names exactly its held names; breaking the name returns the holder removed,
/// grants the waiter at once (by a push) with a greater fencing token, and turns the
/// broken guard Lost with [`LostReason::Broken`] by its next renewal, its release saying
/// so; breaking a free name removes nothing; nothing is left behind.
pub async fn operator_inspects_lists_and_breaks(factory: &dyn Factory) {
    let ttl = factory.short_ttl();
    let prefix = format!("conformance/operate/{}/", uuid::Uuid::new_v4().simple());
    let name = LockName::new(format!("{prefix}held")).expect("valid name");
    let other = LockName::new(format!("{prefix}other")).expect("valid name");
    let free = LockName::new(format!("{prefix}free")).expect("valid name");
    let outside =
        LockName::new(format!("{}-outside", prefix.trim_end_matches('/'))).expect("valid name");
    let holder = factory.client(with_ttl(ttl)).await;
    let mut waiting_options = push_only_options();
    waiting_options.ttl = ttl;
    let waiter = factory.client(waiting_options).await;
    let operator = factory.client(with_ttl(ttl)).await;
    let queues = operator.capabilities().fair;

    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let other_guard = holder.lock(other.as_str()).await.expect("acquire");
    let outside_guard = holder.lock(outside.as_str()).await.expect("acquire");
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            waiter
                .lock_timeout(name.as_str(), Duration::from_secs(20))
                .await
        })
    };

    // Inspect: the holder, and the waiter once it queued.
    let deadline = Instant::now() + Duration::from_secs(5);
    let seen = loop {
        let seen = operator.inspect(&name).await.expect("inspect");
        if !queues || !seen.waiters.is_empty() || Instant::now() >= deadline {
            break seen;
        }
        sleep(Duration::from_millis(25)).await;
    };
    let shown = seen.holder.as_ref().expect("inspect shows the holder");
    assert!(shows_owner(shown, &guard), "holder {shown:?}");
    assert!(
        shown
            .fencing_token
            .is_none_or(|t| t <= guard.fencing_token()),
        "holder {shown:?} shows a fencing token above its guard's"
    );
    assert!(shown.lease_left.is_none_or(|left| left <= ttl), "{shown:?}");
    if queues {
        assert_eq!(seen.waiters.len(), 1, "the waiter shows: {seen:?}");
    }
    assert!(operator
        .inspect(&free)
        .await
        .expect("inspect a free name")
        .holder
        .is_none());

    // List: the held names under the prefix, sorted; not the free name, not a name that
    // merely starts with the same characters outside the prefix's last segment.
    let listed = operator.list(&prefix).await.expect("list");
    assert_eq!(listed, vec![name.clone(), other.clone()], "list {prefix}");

    // Break.
    assert!(
        operator
            .force_release(&free)
            .await
            .expect("break a free name")
            .is_none(),
        "breaking a free name removed something"
    );
    let broken = operator
        .force_release(&name)
        .await
        .expect("break")
        .expect("breaking a held name returns its holder");
    assert!(shows_owner(&broken, &guard), "broken {broken:?}");
    let successor = timeout(PROMPT, waiting)
        .await
        .expect("the waiter is granted the broken lock promptly")
        .expect("waiter task")
        .expect("the waiter gets the lock");
    assert!(successor.fencing_token() > guard.fencing_token());
    let reason = timeout(ttl + PROMPT, guard.lost())
        .await
        .expect("the broken guard turns Lost by its next renewal");
    assert_eq!(reason.without_side(), LostReason::Broken, "{reason}");
    match guard.release().await.expect("release of a broken hold") {
        ReleaseOutcome::AlreadyLost(reason) => {
            assert_eq!(reason.without_side(), LostReason::Broken, "{reason}")
        }
        outcome => panic!("the release of a broken hold said {outcome:?}"),
    }
    assert!(
        successor.is_held(),
        "the broken holder's release hurt its successor"
    );
    assert_eq!(
        operator.list(&prefix).await.expect("list"),
        vec![name.clone(), other.clone()]
    );

    for guard in [successor, other_guard, outside_guard] {
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    assert_eq!(operator.list(&prefix).await.expect("list"), Vec::new());
    eventually_empty(
        factory,
        &[name, other, free, outside],
        "operator_inspects_lists_and_breaks",
    )
    .await;
}
