//! The fencing counter as the new side of a migration sees it: a floor raises it, and it
//! never goes back below a floor it was raised to.

use std::time::Duration;

use lock_core::raw::backend::{AcquireRequest, Backend, BackendRelease, HoldKind};
use lock_core::{DistributedLock, FencingToken, LockName, LockOptions, OwnerToken};
use testkit::file::FileFactory;

/// A grant asked for at least a floor above the counter gets the floor; the next grant
/// without one is above it, and a floor below the counter does not lower it.
#[tokio::test]
async fn a_floor_raises_the_counter_for_good() {
    let factory = FileFactory::new();
    let client = factory.file_client(LockOptions::default()).await;
    let name = LockName::new("migrated").expect("valid");
    let grant = |floor: Option<u64>| {
        let (name, backend) = (&name, client.backend());
        async move {
            let token = OwnerToken::generate();
            let acquired = backend
                .acquire(AcquireRequest {
                    name,
                    token: &token,
                    ttl: Duration::from_secs(10),
                    wait: false,
                    fence_at_least: floor.map(FencingToken),
                    kind: &HoldKind::Mutex,
                })
                .await
                .expect("acquire")
                .expect("free");
            let fence = acquired.fencing_token.get();
            assert_eq!(
                backend.release(&acquired.hold).await.expect("release"),
                BackendRelease::Released
            );
            fence
        }
    };
    let plain = grant(None).await;
    let floor = plain * 2;
    assert_eq!(grant(Some(floor)).await, floor, "the floor itself");
    let after = grant(None).await;
    assert!(after > floor, "{after} after the floor {floor}");
    let low = grant(Some(1)).await;
    assert!(
        low > after,
        "a low floor lowers nothing: {low} after {after}"
    );
    client.close().await.expect("close");
}
