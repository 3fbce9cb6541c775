//! A read-write lock: readers of the price list read together, a writer alone. The writer
//! publishes version 2 (fenced with its token), then downgrades to a reader, never
//! unlocked in between: the readers that queued behind it come in while it checks what it
//! wrote, and no other writer can slip in before them. Then a checker reads as an
//! upgradeable reader, beside a plain reader, and upgrades to publish version 3: no
//! writer can come between what it read and what it writes.
//!
//! `LOCK_URL=redis://127.0.0.1:6379 cargo run -p examples --bin rwlock`

use std::sync::Arc;
use std::time::Duration;

use distlock::RwLock;
use examples::FencedStore;

/// The lock name, and the key it guards.
const PRICES: &str = "config/prices";

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    let store = Arc::new(FencedStore::new([(PRICES, "version 1".to_owned())]));
    let wait = Duration::from_secs(30);

    // --- the taught part ---
    let prices = RwLock::new(Arc::clone(&locks), PRICES)?;

    // The writer holds the lock alone and publishes a new version.
    let writer = prices.write_timeout(wait).await?;
    let token = writer.fencing_token();
    let written = store.write(PRICES, token, "version 2".to_owned());
    println!("writer: wrote version 2 with token {token}: {written:?}");

    // Readers arrive meanwhile and queue behind the writer.
    let mut readers = tokio::task::JoinSet::new();
    for reader in 1..=3 {
        let (prices, store) = (prices.clone(), Arc::clone(&store));
        readers.spawn(async move {
            let read = prices.read_timeout(wait).await?;
            let seen = store.read(PRICES).unwrap_or_default();
            println!(
                "reader {reader}: read {seen} (token {})",
                read.fencing_token()
            );
            read.release().await?;
            Ok::<_, distlock::Error>(())
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Downgraded: still holding (as a reader), the queued readers are let in.
    let reader = writer.downgrade().await?;
    let seen = store.read(PRICES).unwrap_or_default();
    println!("writer: downgraded to a reader (token {token}), reads {seen}");
    while let Some(read) = readers.join_next().await {
        read.expect("the reader ran to its end")?;
    }
    reader.release().await?;
    println!("released: readers and writer done");

    // An upgradeable reader reads beside other readers, then becomes the writer.
    let checker = prices.upgradeable_read_timeout(wait).await?;
    let other = prices.read_timeout(wait).await?;
    let seen = store.read(PRICES).unwrap_or_default();
    println!("checker: reads {seen} beside another reader");
    let upgrade = tokio::spawn(checker.upgrade());
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.release().await?; // the upgrade waits for the readers beside it
    let writer = upgrade.await.expect("the upgrade ran to its end")?;
    let token = writer.fencing_token();
    let written = store.write(PRICES, token, "version 3".to_owned());
    println!("checker: upgraded, wrote version 3 with token {token}: {written:?}");
    writer.release().await?;
    locks.close().await
}
