//! One binary, any backend: the lock service is configuration.
//!
//! ```text
//! cargo run -p examples --bin swap_backends -- memory://a redis://127.0.0.1:6379 zk://127.0.0.1:2181/locks etcd://127.0.0.1:2379/locks
//! ```

use distlock::{DistributedLock, DistributedLockExt};

/// Business code sees only `dyn DistributedLock`.
async fn nightly_export(locks: &dyn DistributedLock) -> distlock::Result<()> {
    let Some(guard) = locks.try_lock("nightly-export").await? else {
        println!("  {locks}: another instance is exporting; skipping");
        return Ok(());
    };
    println!(
        "  {locks}: exporting with fencing token {} (backend: {:?})",
        guard.fencing_token(),
        locks.capabilities().backend
    );
    guard.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        urls.push(examples::lock_url());
    }
    for url in urls {
        // Never the raw URL: it may hold a password.
        println!("{}:", distlock::raw::url::LockUrl::redact(&url));
        match distlock::connect(&url).await {
            Ok(locks) => {
                if let Err(err) = nightly_export(locks.as_ref()).await {
                    println!("  error: {err}");
                }
                if let Err(err) = locks.close().await {
                    println!("  close: {err}");
                }
            }
            Err(err) => println!("  cannot connect: {err}"),
        }
    }
}
