//! Records under concurrent readers: a proclaim replaces the leader's record while other
//! clients read the directory, and no reader takes the replaced record for a dead
//! process's.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, Election, LockOptions, ReleaseOutcome};
use testkit::file::FileFactory;

/// A leader proclaiming 3000 times while another client inspects the name all along
/// keeps its leadership (its record is never removed as a dead one's), and every
/// inspection shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaims_beside_readers_keep_the_record() {
    let factory = FileFactory::new();
    let leader: Arc<dyn DistributedLock> =
        Arc::new(factory.file_client(LockOptions::default()).await);
    let reader: Arc<dyn DistributedLock> =
        Arc::new(factory.file_client(LockOptions::default()).await);
    let election = Election::new(Arc::clone(&leader), "proclaimed").expect("election");
    let mut leadership = election.campaign(b"v0".to_vec()).await.expect("leads");
    let reading = {
        let reader = Arc::clone(&reader);
        tokio::spawn(async move {
            let name = lock_core::LockName::new("proclaimed").expect("valid");
            let mut reads = 0;
            loop {
                let shown = reader.inspect(&name).await.expect("inspect");
                let Some(holder) = shown.holder else {
                    return reads;
                };
                assert!(holder.owner_token.is_some(), "{holder:?}");
                reads += 1;
                tokio::task::yield_now().await;
            }
        })
    };
    for round in 1..=3000 {
        leadership
            .proclaim(format!("v{round}").into_bytes())
            .await
            .expect("still leading");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(leadership.state(), lock_core::LockState::Held);
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released,
        "the record was still there"
    );
    let reads = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the reader sees the resignation")
        .expect("reader task");
    assert!(reads > 10, "the reader read along: {reads} reads");
    leader.close().await.expect("close");
    reader.close().await.expect("close");
}
