//! One name used as two kinds of one family, checked alike on every backend.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, Election, LockName};
use tokio::time::timeout;

/// How long an observer may take to report a change in [`a_mutex_on_an_elections_name_leads`].
const PROMPT: Duration = Duration::from_secs(5);

/// A mutex on an election's name leads it (the mutex and the candidate are one family):
/// `leader()` shows the holder with its fencing token as the term and an empty value, an
/// observer reports it and then the vacancy its release leaves.
///
/// # Panics
/// When the backend behaves otherwise.
pub async fn a_mutex_on_an_elections_name_leads(client: Arc<dyn DistributedLock>, name: &LockName) {
    let guard = client.lock(name.as_str()).await.expect("mutex");
    let election = Election::new(client, name.as_str()).expect("election");
    let leader = election
        .leader()
        .await
        .expect("leader")
        .expect("the mutex's holder leads");
    assert!(leader.value.is_empty(), "{leader:?}");
    assert_eq!(leader.term, guard.fencing_token(), "{leader:?}");
    let mut observer = election.observe();
    let seen = timeout(PROMPT, observer.next())
        .await
        .expect("observed in time")
        .expect("observe");
    assert_eq!(seen.map(|l| l.term), Some(guard.fencing_token()));
    guard.release().await.expect("release");
    let vacant = timeout(PROMPT, observer.next())
        .await
        .expect("observed in time")
        .expect("observe");
    assert_eq!(vacant, None, "nobody leads after the release");
}
