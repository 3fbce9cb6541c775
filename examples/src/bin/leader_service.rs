//! A leader service: two services share one election; each, whenever it leads, compacts a
//! store fenced with its term, then returns (resigning) so the other leads, and campaigns
//! again. Their events print as they come; after a few terms both are shut down, resign,
//! and the client closes. Start copies in other terminals with the same `LOCK_URL` (a
//! shared service: `redis://`, `zk://…`, `etcd://…`) to see them take turns across
//! processes.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Election, LeaderEvent, LeaderService};
use examples::FencedStore;
use tokio::sync::watch;

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    let election = Election::new(Arc::clone(&locks), "services/compactor")?;
    let store = Arc::new(FencedStore::new([]));
    let (stop, stopped) = watch::channel(false);

    // --- the taught part ---
    let mut services = Vec::new();
    for n in 1..=2 {
        let value = format!("compactor-{}-{n}", std::process::id());
        let service = LeaderService::new(election.clone(), value.clone())
            .with_backoff(Duration::from_millis(50), Duration::from_secs(2))?;
        let mut events = service.events();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    LeaderEvent::Elected { term } => println!("{value}: elected, term {term}"),
                    LeaderEvent::Lost { term, reason } => {
                        println!("{value}: lost {term}: {reason}")
                    }
                    LeaderEvent::Resigned { term, .. } => println!("{value}: resigned {term}"),
                    _ => {}
                }
            }
        });
        let (store, mut stopped) = (Arc::clone(&store), stopped.clone());
        services.push(tokio::spawn(async move {
            let work = |ctx: distlock::LockContext| {
                let store = Arc::clone(&store);
                async move {
                    // The leader's work: one compaction, fenced with the term.
                    let written = store.write("compacted", ctx.fencing_token, "done");
                    println!("compaction in term {}: {written:?}", ctx.fencing_token);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            service.run(work, shutdown).await
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop.send(true); // in a real service: on SIGTERM
    for service in services {
        match service.await {
            Ok(Ok(summary)) => println!("service ended after {} terms", summary.terms),
            Ok(Err(err)) => eprintln!("service failed: {err}"),
            Err(err) => eprintln!("service task: {err}"),
        }
    }
    locks.close().await
}
