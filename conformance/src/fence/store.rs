//! The contract of [`FencedStore`], as public async checks every store runs against its
//! real server: a stale write changes nothing, the same holder may write again, and
//! concurrent writers with random tokens leave the highest token's value.

use std::sync::Arc;

use futures::future::join_all;
use lock_core::fence::{FenceOutcome, Fenced, FencedStore};
use lock_core::FencingToken;
use rand::seq::SliceRandom;

/// A write with a token below the newest is refused, reports the newest, and leaves the
/// stored token and value as they were; an equal token (the same holder again) and a
/// higher one are accepted. `store` must be empty.
pub async fn stale_write_changes_nothing(store: &dyn FencedStore) {
    assert_eq!(
        store.read().await.expect("read"),
        None,
        "the store starts empty"
    );
    let written = store.write(FencingToken(10), b"ten").await.expect("write");
    assert_eq!(written, FenceOutcome::Written);
    let stale = store.write(FencingToken(9), b"nine").await.expect("write");
    assert_eq!(
        stale,
        FenceOutcome::Stale {
            newest: FencingToken(10)
        }
    );
    assert_eq!(stored(store).await, (FencingToken(10), b"ten".to_vec()));
    let again = store
        .write(FencingToken(10), b"ten again")
        .await
        .expect("write");
    assert_eq!(
        again,
        FenceOutcome::Written,
        "the same token may write again"
    );
    let newer = store.write(FencingToken(11), b"").await.expect("write");
    assert_eq!(newer, FenceOutcome::Written);
    assert_eq!(
        stored(store).await,
        (FencingToken(11), Vec::new()),
        "empty values too"
    );
    let stale = store.write(FencingToken(0), b"zero").await.expect("write");
    assert_eq!(
        stale,
        FenceOutcome::Stale {
            newest: FencingToken(11)
        }
    );
    assert_eq!(stored(store).await, (FencingToken(11), Vec::new()));
}

/// `writers` concurrent writers, each with its own token in random order (and every token
/// written twice, by two writers), all at once: the store ends with the highest token and
/// its value, every writer of the highest token was told `Written`, and every refused
/// writer was told a newest token above its own. Then the same writers all at once again:
/// every one below the highest is refused. `store` must be empty.
pub async fn concurrent_writers_keep_the_highest(store: Arc<dyn FencedStore>, writers: u64) {
    for round in ["first", "second"] {
        for (token, outcome) in write_all(&store, writers).await {
            match outcome {
                FenceOutcome::Written => assert!(
                    round == "first" || token == writers,
                    "{token} written after {writers} was"
                ),
                FenceOutcome::Stale { newest } => assert!(
                    newest.get() > token,
                    "{token} was refused for {newest}, not a newer token"
                ),
            }
            if token == writers {
                assert_eq!(
                    outcome,
                    FenceOutcome::Written,
                    "the highest token is never stale"
                );
            }
        }
        assert_eq!(
            stored(&*store).await,
            (FencingToken(writers), value_of(writers)),
            "the store keeps the highest token's value ({round} round)"
        );
    }
}

/// Tokens 1 to `writers`, each twice, written to `store` at once in random order: each
/// token with what the store said.
async fn write_all(store: &Arc<dyn FencedStore>, writers: u64) -> Vec<(u64, FenceOutcome)> {
    let mut tokens: Vec<u64> = (1..=writers).chain(1..=writers).collect();
    tokens.shuffle(&mut rand::rng());
    join_all(tokens.iter().map(|&token| {
        let store = store.clone();
        async move {
            let outcome = store.write(FencingToken(token), &value_of(token)).await;
            (token, outcome.expect("write"))
        }
    }))
    .await
}

/// The value a writer with `token` writes.
pub fn value_of(token: u64) -> Vec<u8> {
    format!("written with token {token}").into_bytes()
}

/// What `store` holds, which must be something.
pub async fn stored(store: &dyn FencedStore) -> (FencingToken, Vec<u8>) {
    let Fenced { token, value } = store
        .read()
        .await
        .expect("read")
        .expect("the store holds a write");
    (token, value)
}
