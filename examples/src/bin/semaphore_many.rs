//! Several permits in one acquire: a pool of 4 GPUs (the semaphore `jobs/gpus`), where a
//! training run takes 3 at once and inference jobs 1 each. `acquire_many` is all or
//! nothing, and one guard (one lease, one fencing token, one release) holds the 3; the
//! request keeps its place in the queue, so the small jobs behind it never starve it.
//! Then the pool grows to 6 GPUs with `resize`, on the backends that can (ZooKeeper, in
//! Curator's layout, cannot: its error says why), and one hold takes them all.
//!
//! `LOCK_URL=redis://127.0.0.1:6379 cargo run -p examples --bin semaphore_many`

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{ErrorKind, Semaphore};

/// GPUs in the pool at first.
const GPUS: u32 = 4;
/// GPUs a training run takes at once.
const TRAINING: u32 = 3;
/// Inference jobs, one GPU each, two runs each.
const INFERENCE: usize = 3;
/// GPUs in the pool once it grows.
const GROWN: u32 = 6;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    if !locks.capabilities().semaphore_many {
        // ZooKeeper, in Curator's layout, keeps one lease node per permit.
        let backend = locks.capabilities().backend;
        println!("{backend} takes no several permits in one hold");
        return locks.close().await;
    }
    // GPUs in use now, and the most at once: never more than the pool has.
    let (in_use, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let tracked = Arc::clone(&most);
    let track = move |in_use: &AtomicU32, n: u32| {
        let now = in_use.fetch_add(n, Ordering::SeqCst) + n;
        tracked.fetch_max(now, Ordering::SeqCst);
        now
    };

    // --- the taught part ---
    let mut gpus = Semaphore::new(Arc::clone(&locks), "jobs/gpus", GPUS)?;
    let mut jobs = tokio::task::JoinSet::new();
    for job in 1..=INFERENCE {
        let (gpus, in_use, track) = (gpus.clone(), Arc::clone(&in_use), track.clone());
        jobs.spawn(async move {
            for _ in 0..2 {
                let gpu = gpus
                    .acquire_many_timeout(1, Duration::from_secs(30))
                    .await?;
                let now = track(&in_use, 1);
                println!(
                    "inference {job}: 1 GPU, token {} ({now} of {GPUS} in use)",
                    gpu.fencing_token()
                );
                tokio::time::sleep(Duration::from_millis(150)).await;
                in_use.fetch_sub(1, Ordering::SeqCst);
                gpu.release().await?;
            }
            Ok::<_, distlock::Error>(())
        });
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let training = gpus
        .acquire_many_timeout(TRAINING, Duration::from_secs(30))
        .await?;
    let now = track(&in_use, TRAINING);
    let token = training.fencing_token();
    println!("training: {TRAINING} GPUs in one hold, token {token} ({now} of {GPUS} in use)");
    tokio::time::sleep(Duration::from_millis(300)).await;
    in_use.fetch_sub(TRAINING, Ordering::SeqCst);
    training.release().await?;
    while let Some(job) = jobs.join_next().await {
        job.expect("the job ran to its end")?;
    }
    println!(
        "at most {} of {GPUS} GPUs in use at once",
        most.load(Ordering::SeqCst)
    );

    match gpus.resize(GROWN, Duration::from_secs(10)).await {
        Ok(()) => {
            let all = gpus
                .acquire_many_timeout(GROWN, Duration::from_secs(10))
                .await?;
            println!(
                "grown to {} GPUs: all in one hold, token {}",
                gpus.permits(),
                all.fencing_token()
            );
            all.release().await?;
        }
        Err(err) if err.kind() == ErrorKind::Unsupported => println!("not resized: {err}"),
        Err(err) => return Err(err),
    }
    locks.close().await
}
