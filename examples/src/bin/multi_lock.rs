//! A multi-lock: a transfer locks both accounts it touches, all or nothing. The names are
//! taken in one sorted order, so two transfers in opposite directions never wait for each
//! other in a cycle; each account is written fenced with its own name's token.
//!
//! `LOCK_URL=redis://127.0.0.1:6379 cargo run -p examples --bin multi_lock`

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, FencingToken, MultiLock};
use examples::FencedStore;

/// Moves `amount` from account `from` to account `to`, holding both.
async fn transfer(
    locks: &Arc<dyn DistributedLock>,
    accounts: &FencedStore<i64>,
    from: &str,
    to: &str,
    amount: i64,
) -> distlock::Result<()> {
    let both = MultiLock::new(Arc::clone(locks), [from, to])?;
    let guard = both.acquire_timeout(Duration::from_secs(30)).await?;
    // Each name's fencing token fences the account it guards.
    let tokens: HashMap<String, FencingToken> = guard
        .fencing_tokens()
        .into_iter()
        .map(|(name, token)| (name.as_str().to_owned(), token))
        .collect();
    let from_balance = accounts.read(from).unwrap_or_default();
    let to_balance = accounts.read(to).unwrap_or_default();
    let debited = accounts.write(from, tokens[from], from_balance - amount);
    let credited = accounts.write(to, tokens[to], to_balance + amount);
    println!("{from} -> {to}: {amount} ({debited:?}, {credited:?})");
    guard.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let locks = distlock::connect(&examples::lock_url()).await?;
    let accounts = Arc::new(FencedStore::new([
        ("accounts/alice", 100),
        ("accounts/bob", 100),
    ]));

    // --- the taught part ---
    // Transfers both ways at once, each holding both accounts.
    let mut transfers = tokio::task::JoinSet::new();
    for (from, to, amount) in [
        ("accounts/alice", "accounts/bob", 30),
        ("accounts/bob", "accounts/alice", 10),
        ("accounts/alice", "accounts/bob", 5),
        ("accounts/bob", "accounts/alice", 25),
    ] {
        let (locks, accounts) = (Arc::clone(&locks), Arc::clone(&accounts));
        transfers.spawn(async move { transfer(&locks, &accounts, from, to, amount).await });
    }
    while let Some(done) = transfers.join_next().await {
        done.expect("the transfer ran to its end")?;
    }
    let alice = accounts.read("accounts/alice").unwrap_or_default();
    let bob = accounts.read("accounts/bob").unwrap_or_default();
    println!("alice {alice}, bob {bob}, total {}", alice + bob);
    locks.close().await
}
