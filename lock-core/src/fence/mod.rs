//! Fenced writes, checked by the resource itself: "store this only if my fencing token is
//! the newest this resource has seen".
//!
//! A guard's [`FencingToken`] only protects a resource that checks it. A [`FencedStore`] is
//! one resource (a key, a row, a file) that keeps, beside its value, the newest token it
//! accepted, and compares in the same atomic step as it writes: a holder that was paused
//! past its lease and writes late with its old token is refused by the store, whatever
//! that holder believes.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lock_core::Result<()> {
//! use lock_core::fence::{FenceOutcome, FencedStore, MemoryFence};
//! use lock_core::FencingToken;
//!
//! let store = MemoryFence::new(); // or RedisFence, EtcdFence, PostgresFence, FileFence
//! assert_eq!(store.write(FencingToken(7), b"v7").await?, FenceOutcome::Written);
//! // A holder with an older token comes back from a pause: refused by the store.
//! let late = store.write(FencingToken(5), b"v5").await?;
//! assert_eq!(late, FenceOutcome::Stale { newest: FencingToken(7) });
//! assert_eq!(store.read().await?.map(|f| f.value), Some(b"v7".to_vec()));
//! # Ok(()) }
//! ```
//!
//! Ready stores: [`MemoryFence`] (one process), [`FileFence`] (a local file,
//! write-then-rename), and in the backend crates `lock_redis::RedisFence` (a Lua
//! compare-and-set), `lock_etcd::EtcdFence` (one transaction comparing a token key) and
//! `lock_postgres::PostgresFence` (a conditional upsert); with the `distlock` facade,
//! `distlock::fence`, `distlock::redis::RedisFence`, `distlock::etcd::EtcdFence` and
//! `distlock::postgres::PostgresFence`. docs/fencing.md says what each makes atomic and
//! what it must persist; `conformance::fence::store` holds the checks every store passes.

mod file;

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::plumbing::lock_unpoisoned;
use crate::{FencingToken, Result};

pub use file::FileFence;

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The value was stored: the token was at least as high as every token the resource
    /// had accepted before (the same holder may write again with its token).
    Written,
    /// Refused: the resource has accepted a newer token; nothing changed.
    Stale {
        /// The newest token the resource has accepted.
        newest: FencingToken,
    },
}

impl FenceOutcome {
    /// Whether the value was stored.
    pub fn is_written(self) -> bool {
        self == FenceOutcome::Written
    }
}

/// A resource's value and the token of the write that stored it.
#[derive(Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The newest accepted token.
    pub token: FencingToken,
    /// The value written with it.
    pub value: Vec<u8>,
}

impl fmt::Debug for Fenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fenced")
            .field("token", &self.token)
            .field("value_len", &self.value.len())
            .finish()
    }
}

/// One resource that accepts a write only with a fencing token at least as high as every
/// token it has accepted.
///
/// # Contract
/// - The comparison and the write are one atomic step of the store (a script, a
///   transaction, a statement, a lock on the file): two writers can never both pass the
///   check against the same old token.
/// - Equal tokens are accepted (one holder writing twice); strictly older ones are
///   refused with [`FenceOutcome::Stale`] and change nothing.
/// - The token is kept with the value, as durably as the store keeps the value.
/// - Every call has a deadline (the store's request timeout).
///
/// # Errors
/// The store's own: [`Error::Connection`](crate::Error::Connection) or a timeout when it
/// does not answer (a write that timed out may still have landed: read to know),
/// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a resource it cannot name,
/// [`Error::Protocol`](crate::Error::Protocol) when the stored token is unreadable.
#[async_trait]
pub trait FencedStore: Send + Sync + fmt::Debug {
    /// Stores `value` if `token` is at least the newest token accepted so far.
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome>;

    /// The newest accepted write, `None` before the first.
    async fn read(&self) -> Result<Option<Fenced>>;
}

#[async_trait]
impl<T: FencedStore + ?Sized> FencedStore for Arc<T> {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        (**self).write(token, value).await
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        (**self).read().await
    }
}

#[async_trait]
impl<T: FencedStore + ?Sized> FencedStore for Box<T> {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        (**self).write(token, value).await
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        (**self).read().await
    }
}

/// The check every store makes, in one place for the stores that run it in Rust (the
/// others run the same rule in their server's language): may a write with `token` replace
/// what holds `newest`?
pub fn admits(newest: Option<FencingToken>, token: FencingToken) -> FenceOutcome {
    match newest {
        Some(newest) if token < newest => FenceOutcome::Stale { newest },
        _ => FenceOutcome::Written,
    }
}

/// A fenced resource in this process's memory: the reference store, for tests and for
/// examples on `memory://`. Clones share the resource.
#[derive(Debug, Clone, Default)]
pub struct MemoryFence {
    state: Arc<Mutex<Option<Fenced>>>,
}

impl MemoryFence {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl FencedStore for MemoryFence {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        let mut state = lock_unpoisoned(&self.state);
        let outcome = admits(state.as_ref().map(|held| held.token), token);
        if outcome.is_written() {
            *state = Some(Fenced {
                token,
                value: value.to_vec(),
            });
        }
        Ok(outcome)
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        Ok(lock_unpoisoned(&self.state).clone())
    }
}
