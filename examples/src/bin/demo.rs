//! The `make demo` program: several clients contend for one lock and print their fencing
//! tokens; then the lock's safety features are shown one by one.
//!
//! The lock service comes from `LOCK_URL` (default `memory://demo`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{
    AcquireOptions, DistributedLock, DistributedLockExt, LockName, LockOptions, ReleaseOutcome,
    RenewalMode, RunOutcome,
};

use tokio::time::{sleep, Instant};

const WORKERS: usize = 4;
const ROUNDS: usize = 3;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://demo".to_owned());
    println!(
        "distlock demo on {}\n",
        distlock::raw::url::LockUrl::redact(&url)
    );

    contention(&url).await?;
    try_and_timeout(&url).await?;
    dropped_guard(&url).await?;
    lost_lock_cancels_work(&url).await?;
    println!("\nAll done. `make test` runs the conformance suite against real servers.");
    Ok(())
}

/// Several independent clients take turns on one lock; each holder's fencing token is
/// higher than the previous one, and the shared counter loses no update.
async fn contention(url: &str) -> distlock::Result<()> {
    println!("1. {WORKERS} clients x {ROUNDS} rounds contend for `reports/daily`:");
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let client = distlock::connect(url).await?;
        let counter = Arc::clone(&counter);
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = client.lock("reports/daily").await?;
                let seen = counter.load(Ordering::SeqCst);
                println!(
                    "   {:>6.1} ms  client {worker} holds it with fencing token {:>2}; counter {seen} -> {}",
                    started.elapsed().as_secs_f64() * 1000.0,
                    guard.fencing_token(),
                    seen + 1
                );
                sleep(Duration::from_millis(20)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                guard.release().await?;
            }
            client.close().await
        }));
    }
    for task in tasks {
        task.await.expect("worker task panicked")?;
    }
    println!(
        "   counter = {} (expected {}): no two clients were inside at once\n",
        counter.load(Ordering::SeqCst),
        WORKERS * ROUNDS
    );
    Ok(())
}

/// `try_lock` on a held lock says "not acquired"; a bounded wait ends in a timeout error.
async fn try_and_timeout(url: &str) -> distlock::Result<()> {
    println!("2. try and timeout:");
    let a = distlock::connect(url).await?;
    let b = distlock::connect(url).await?;
    let guard = a.lock("invoices").await?;
    let attempt = b.try_lock("invoices").await?;
    println!(
        "   try_lock while held -> {}",
        if attempt.is_some() {
            "acquired?!"
        } else {
            "not acquired"
        }
    );
    let err = b
        .lock_timeout("invoices", Duration::from_millis(300))
        .await
        .expect_err("the lock is held");
    println!(
        "   lock_timeout(300 ms) -> error: {err} (retryable: {})",
        err.is_retryable()
    );
    guard.release().await?;
    a.close().await?;
    b.close().await?;
    println!();
    Ok(())
}

/// A guard dropped without release frees the lock in the background, at once.
async fn dropped_guard(url: &str) -> distlock::Result<()> {
    println!("3. a guard dropped without release (TTL 30 s):");
    let a = distlock::connect(url).await?;
    let b = distlock::connect(url).await?;
    let guard = a.lock("exports").await?;
    let waiter = tokio::spawn({
        let b = Arc::clone(&b);
        async move {
            let guard = b.lock("exports").await?;
            Ok::<_, distlock::Error>((Instant::now(), guard))
        }
    });
    sleep(Duration::from_millis(100)).await;
    let dropped_at = Instant::now();
    drop(guard);
    let (acquired_at, next) = waiter.await.expect("waiter task panicked")?;
    println!(
        "   the waiter got it {:?} after the drop, not 30 s later",
        acquired_at.duration_since(dropped_at)
    );
    next.release().await?;
    a.close().await?;
    b.close().await?;
    println!();
    Ok(())
}

/// Manual renewal without extend: the lock expires, the lost signal cancels the work,
/// and the late release reports it was already lost.
async fn lost_lock_cancels_work(url: &str) -> distlock::Result<()> {
    println!("4. a lost lock cancels the work:");
    let short = LockOptions::builder()
        .ttl(Duration::from_millis(500))
        .renewal(RenewalMode::Manual);
    let client: Arc<dyn DistributedLock> = distlock::connect_with(url, &short).await?;
    let outcome = client
        .with_lock("cleanup", &AcquireOptions::forever(), |ctx| async move {
            println!(
                "   working with fencing token {} and no renewal...",
                ctx.fencing_token
            );
            sleep(Duration::from_secs(5)).await;
        })
        .await?;
    match outcome {
        RunOutcome::Lost { reason } => {
            println!("   the work was cancelled: the lock was lost because {reason}")
        }
        other => println!("   unexpected: {other:?}"),
    }
    let guard = client
        .acquire(
            &LockName::new("cleanup")?,
            &AcquireOptions::forever().manual(),
        )
        .await?
        .expect("waiting acquire returns a guard");
    sleep(Duration::from_millis(700)).await;
    match guard.release().await? {
        ReleaseOutcome::AlreadyLost(reason) => {
            println!("   a late release is harmless: already lost ({reason})")
        }
        ReleaseOutcome::Released => println!("   released"),
    }
    client.close().await
}
