#![doc = include_str!("../README.md")]

mod client;
mod config;
mod error;
mod lease;
mod lock;

use std::sync::Arc;

use lock_core::{ConnectFuture, DistributedLock, LeaseClient, LockUrl};

pub use config::{RedisConfig, RedisNode, DEFAULT_PORT, DEFAULT_PREFIX, SCHEMES};
pub use lease::RedisHold;
pub use lock::{KeyLayout, RedisBackend};

/// A lock client on Redis (single server or RedLock): [`RedisBackend`] with the shared
/// lease machinery of `lock-core`.
pub type RedisLock = LeaseClient<RedisBackend>;

/// Registers `redis://`, `rediss://` and `redlock://` in the process-wide registry of
/// `lock-core`, so that `lock_core::connect(url)` serves them.
pub fn register() {
    for scheme in SCHEMES {
        lock_core::registry().register(scheme, connect_url);
    }
}

fn connect_url(url: LockUrl) -> ConnectFuture {
    Box::pin(async move {
        let client: Arc<dyn DistributedLock> = Arc::new(RedisBackend::from_url(&url).await?);
        Ok(client)
    })
}
