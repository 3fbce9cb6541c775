//! A semaphore: six encoding jobs share the two permits of `jobs/encoder`, so at most two
//! encode at once, in this process or in any other on the same `LOCK_URL`. A permit is a
//! lock guard of its own (a lease, renewal, a fencing token): each job fences the file it
//! writes with its permit's token.
//!
//! `LOCK_URL=redis://127.0.0.1:6379 cargo run -p examples --bin semaphore`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::Semaphore;
use examples::FencedStore;

/// Permits of the semaphore: jobs that may encode at once.
const PERMITS: u32 = 2;
/// Jobs that want a permit.
const JOBS: usize = 6;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    let files = Arc::new(FencedStore::new([]));
    // How many jobs hold a permit now, and the most at once: never more than PERMITS.
    let (encoding, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));

    // --- the taught part ---
    let encoder = Semaphore::new(Arc::clone(&locks), "jobs/encoder", PERMITS)?;
    let mut jobs = tokio::task::JoinSet::new();
    for job in 1..=JOBS {
        let (encoder, files) = (encoder.clone(), Arc::clone(&files));
        let (encoding, most) = (Arc::clone(&encoding), Arc::clone(&most));
        jobs.spawn(async move {
            let permit = encoder.acquire_timeout(Duration::from_secs(30)).await?;
            let now = encoding.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let token = permit.fencing_token();
            println!("job {job}: encoding with permit token {token} ({now} of {PERMITS} busy)");
            tokio::time::sleep(Duration::from_millis(400)).await;
            let written = files.write(&format!("videos/{job}.mp4"), token, "encoded");
            println!("job {job}: write {written:?}");
            encoding.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            Ok::<_, distlock::Error>(())
        });
    }
    while let Some(job) = jobs.join_next().await {
        job.expect("the job ran to its end")?;
    }
    println!(
        "{JOBS} jobs encoded, at most {} at once with {PERMITS} permits",
        most.load(Ordering::SeqCst)
    );
    locks.close().await
}
