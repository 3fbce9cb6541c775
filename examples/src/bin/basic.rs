//! Acquire a lock, use its fencing token, release it.
//!
//! `LOCK_URL=redis://127.0.0.1:6379 cargo run -p examples --bin basic`

use distlock::{DistributedLockExt, ReleaseOutcome};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;

    // --- the taught part ---
    let guard = locks.lock("reports/daily").await?;
    println!(
        "{} holds `{}` with fencing token {}",
        locks,
        guard.name(),
        guard.fencing_token()
    );
    println!(
        "valid for another {:?}",
        guard.valid_until() - tokio::time::Instant::now()
    );
    match guard.release().await? {
        ReleaseOutcome::Released => println!("released"),
        ReleaseOutcome::AlreadyLost(reason) => println!("had already lost it: {reason}"),
    }
    locks.close().await // before the process exits: nothing it held or queued outlives it
}
