//! Leader election: three candidates campaign for one election; each leads for a while
//! (writing with its term as the fencing token) and steps down, and an observer prints
//! every change. Start copies in other terminals with the same `LOCK_URL` (a shared
//! service: `redis://`, `zk://…`, `etcd://…`) to see them take turns across processes.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, Election, RunOutcome};
use examples::FencedStore;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    let election = Election::new(Arc::clone(&locks), "services/scheduler")?;
    // What the leader writes: the schedule, fenced with its term.
    let store = Arc::new(FencedStore::new([]));

    // An observer: a line per new leader, proclaimed value or vacancy.
    let mut observer = election.observe();
    let watching = tokio::spawn(async move {
        for _ in 0..8 {
            match observer.next().await {
                Ok(Some(leader)) => {
                    println!(
                        "observer: {} leads (term {})",
                        leader.value_text(),
                        leader.term
                    );
                }
                Ok(None) => println!("observer: nobody leads"),
                Err(err) => return eprintln!("observer: {err}"),
            }
        }
    });

    // --- the taught part ---
    let mut candidates = Vec::new();
    for n in 1..=3 {
        let (election, store) = (election.clone(), Arc::clone(&store));
        let value = format!("scheduler-{}-{n}", std::process::id());
        candidates.push(tokio::spawn(async move {
            let name = value.clone();
            let outcome = election
                .lead(
                    value.clone(),
                    &AcquireOptions::timeout(Duration::from_secs(60)),
                    |ctx| async move {
                        let term = ctx.fencing_token;
                        let written = store.write("schedule", term, value.clone());
                        println!("{value}: leading, term {term}, schedule written: {written:?}");
                        tokio::time::sleep(Duration::from_millis(700)).await;
                    },
                )
                .await;
            match outcome {
                Ok(RunOutcome::Completed { .. }) => println!("{name}: stepped down"),
                Ok(RunOutcome::Lost { reason }) => println!("{name}: leadership lost: {reason}"),
                Ok(RunOutcome::NotAcquired) => println!("{name}: never led"),
                Err(err) => eprintln!("{name}: campaign failed: {err}"),
            }
        }));
    }
    for candidate in candidates {
        let _ = candidate.await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), watching).await;
    locks.close().await
}
