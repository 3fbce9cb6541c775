//! A fenced write: the storage itself refuses a writer whose fencing token is older than
//! one it has already accepted, so a paused holder that lost its lock cannot overwrite
//! newer data. The storage here is a local file ([`FileFence`]); `RedisFence`,
//! `EtcdFence` and `PostgresFence` make the same check on those servers.

use std::time::Duration;

use distlock::fence::{FencedStore, FileFence};
use distlock::{
    AcquireOptions, DistributedLock, DistributedLockExt, LockName, LockOptions, RenewalMode,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = examples::lock_url();
    let path = std::env::temp_dir().join(format!("distlock-profile-{}", uuid::Uuid::new_v4()));
    let store = FileFence::new(&path)?;
    // The slow writer's client: a short lease, never renewed (whatever LOCK_URL's query
    // says: options set in code win over the URL's, on both sides of a dual URL).
    let slow_options = LockOptions::builder()
        .ttl(Duration::from_secs(1))
        .renewal(RenewalMode::Manual);
    let slow = distlock::connect_with(&url, &slow_options).await?;
    let fast = distlock::connect(&url).await?;
    let name = LockName::new("profile/42")?;

    // A holder takes the lock, then stalls (a GC pause, a swapped-out VM) past its TTL.
    let stale = slow
        .acquire(&name, &AcquireOptions::forever())
        .await?
        .expect("acquired");
    println!("slow writer holds token {}", stale.fencing_token());
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Meanwhile the lock expired and a second writer took it and wrote.
    let fresh = fast.lock(name.as_str()).await?;
    println!("fast writer holds token {}", fresh.fencing_token());
    let written = store.write(fresh.fencing_token(), b"new profile").await?;
    println!("fast write: {written:?}");
    fresh.release().await?;

    // The slow writer wakes up and writes with its old token: the store refuses it.
    println!("slow writer's guard says {:?}", stale.state());
    let refused = store.write(stale.fencing_token(), b"old profile").await?;
    println!("slow write: {refused:?}");
    if let Some(held) = store.read().await? {
        let value = String::from_utf8_lossy(&held.value);
        println!("store holds: {value:?} (token {})", held.token);
    }
    println!("slow release: {:?}", stale.release().await?);
    // Both clients, before the process exits: what they hold or queue goes now, not when
    // a lease or session times out.
    slow.close().await?;
    fast.close().await?;
    // The file and its lock's sidecar (`<path>.lock`).
    let _ = std::fs::remove_file(format!("{}.lock", path.display()));
    let _ = std::fs::remove_file(&path);
    Ok(())
}
