//! A job that runs on one instance at a time; losing the lock cancels the work.
//!
//! Start several copies with the same `LOCK_URL`: one works, the others wait their turn.

use std::time::Duration;

use distlock::{AcquireOptions, DistributedLockExt, RunOutcome};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    let instance = std::process::id();

    // --- the taught part ---
    let outcome = locks
        .with_lock(
            "jobs/rebuild-index",
            &AcquireOptions::timeout(Duration::from_secs(60)),
            |ctx| async move {
                for step in 1..=5 {
                    println!(
                        "instance {instance}: step {step}/5 (fencing token {})",
                        ctx.fencing_token
                    );
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                "index rebuilt"
            },
        )
        .await?;
    match outcome {
        RunOutcome::Completed { value, release } => println!("{value}; release: {release:?}"),
        RunOutcome::Lost { reason } => println!("stopped half-way: the lock was lost ({reason})"),
        RunOutcome::NotAcquired => println!("another instance holds the job"),
    }
    locks.close().await
}
