//! `Backend::inspect` checked the same way on every backend that queues: a holder and two
//! waiters in queue order with their owner tokens and sessions, the holder's fencing
//! token, and a token floor below every later grant; plus the helpers the backends'
//! own inspection tests share.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::backend::{Backend, LeaseClient};
use lock_core::{DistributedLockExt, LockGuard, LockName, Occupancy, ReleaseOutcome};
use tokio::task::JoinHandle;

use crate::rules::unique_name;

/// Inspects `name` until it shows `participants` holders and waiters (5 s at most).
pub async fn inspect_until<B: Backend>(
    client: &LeaseClient<B>,
    name: &LockName,
    participants: usize,
) -> Occupancy {
    for _ in 0..200 {
        let occupancy = client.backend().inspect(name).await.expect("inspect");
        if occupancy.participants().count() == participants {
            return occupancy;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{name:?} never showed {participants} participants");
}

/// A task waiting for `name` on `client` (20 s at most).
pub fn wait_for<B: Backend>(
    client: &Arc<LeaseClient<B>>,
    name: &LockName,
) -> JoinHandle<LockGuard> {
    let (client, name) = (Arc::clone(client), name.clone());
    tokio::spawn(async move {
        client
            .lock_timeout(name.as_str(), Duration::from_secs(20))
            .await
            .expect("the waiter gets the lock")
    })
}

/// The owner token of `guard`, as an inspection shows it.
pub fn owner(guard: &LockGuard) -> Option<String> {
    Some(guard.owner_token().as_str().to_owned())
}

/// Releases `guard`, which must still hold.
pub async fn release(guard: LockGuard) {
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A holder and two waiters (`clients[0..3]`, each its own session) show in queue order
/// with their owner tokens and three distinct sessions; the holder's fencing token is its
/// guard's and its lease left is at most `holder_lease` (`None`: the backend's leases
/// are per session, and it shows none); each waiter later holds with the token it showed,
/// and is granted a fencing token above the floor the inspection reported, as is the
/// next holder after the lock emptied.
pub async fn holder_and_waiters_in_queue_order<B: Backend>(
    clients: &[Arc<LeaseClient<B>>],
    holder_lease: Option<Duration>,
) {
    let lock = unique_name("inspect");
    let held = clients[0].lock(lock.as_str()).await.expect("acquire");
    let first = wait_for(&clients[1], &lock);
    inspect_until(&clients[0], &lock, 2).await;
    let second = wait_for(&clients[2], &lock);
    let seen = inspect_until(&clients[0], &lock, 3).await;

    let holder = seen.holder.as_ref().expect("a holder");
    assert_eq!(holder.owner_token, owner(&held));
    assert_eq!(holder.fencing_token, Some(held.fencing_token()));
    match holder_lease {
        None => assert_eq!(holder.lease_left, None),
        Some(ttl) => {
            let left = holder.lease_left.expect("the holder's lease");
            assert!(left <= ttl, "{left:?}");
        }
    }
    let floor = seen.token_floor.expect("a token floor");
    assert!(floor >= held.fencing_token(), "{floor:?} {seen:?}");
    let waiting: Vec<Option<String>> = seen.waiters.iter().map(|w| w.owner_token.clone()).collect();
    assert!(seen.waiters.iter().all(|w| w.fencing_token.is_none()));
    // Three clients, three sessions: the check groups a process's acquisitions by them.
    let sessions: HashSet<String> = seen
        .participants()
        .map(|p| p.session.clone().expect("a session"))
        .collect();
    assert_eq!(sessions.len(), 3, "{seen:?}");

    release(held).await;
    let first = first.await.expect("first waiter");
    assert_eq!(owner(&first), waiting[0], "the first waiter holds next");
    assert!(first.fencing_token() > floor);
    let now = inspect_until(&clients[0], &lock, 2).await;
    let holder = now.holder.expect("a holder");
    assert_eq!(holder.owner_token, owner(&first));
    assert_eq!(holder.fencing_token, Some(first.fencing_token()));
    assert_eq!(
        now.waiters
            .iter()
            .map(|w| w.owner_token.clone())
            .collect::<Vec<_>>(),
        waiting[1..]
    );

    release(first).await;
    let second = second.await.expect("second waiter");
    assert_eq!(owner(&second), waiting[1], "the second waiter holds last");
    assert!(second.fencing_token() > floor);
    let last = second.fencing_token();
    release(second).await;

    let empty = inspect_until(&clients[0], &lock, 0).await;
    assert_eq!(empty, Occupancy::default().token_floor(empty.token_floor));
    let floor = empty.token_floor.expect("a token floor");
    assert!(
        floor >= last,
        "the floor {floor:?} covers the last grant {last:?}"
    );
    let next = clients[1].lock(lock.as_str()).await.expect("acquire");
    assert!(next.fencing_token() > floor);
    release(next).await;
}
