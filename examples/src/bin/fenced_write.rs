//! A fenced write: the storage rejects a writer whose fencing token is older than one it
//! has already seen, so a paused holder that lost its lock cannot overwrite newer data.

use std::sync::Mutex;
use std::time::Duration;

use distlock::{
    AcquireOptions, DistributedLock, DistributedLockExt, FencingToken, LockName, LockOptions,
    RenewalMode,
};

/// Storage that remembers the highest fencing token it accepted.
#[derive(Default)]
struct FencedStore {
    state: Mutex<(u64, String)>,
}

impl FencedStore {
    fn write(&self, token: FencingToken, value: &str) -> Result<(), String> {
        let mut state = self.state.lock().expect("store lock");
        if token.get() < state.0 {
            return Err(format!("rejected: token {token} is older than {}", state.0));
        }
        *state = (token.get(), value.to_owned());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = examples::lock_url();
    let store = FencedStore::default();
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
    println!(
        "fast write: {:?}",
        store.write(fresh.fencing_token(), "new profile")
    );
    fresh.release().await?;

    // The slow writer wakes up and writes with its old token: the store refuses it.
    println!("slow writer's guard says {:?}", stale.state());
    println!(
        "slow write: {:?}",
        store.write(stale.fencing_token(), "old profile")
    );
    println!(
        "store holds: {:?}",
        store.state.lock().expect("store lock").1
    );
    println!("slow release: {:?}", stale.release().await?);
    // Both clients, before the process exits: what they hold or queue goes now, not when
    // a lease or session times out.
    slow.close().await?;
    fast.close().await
}
