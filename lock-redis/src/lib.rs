#![doc = include_str!("../README.md")]

mod client;
mod config;
mod error;
mod lease;
mod lock;

use lock_core::raw::LeaseClient;

pub use config::{RedisConfig, RedisNode, DEFAULT_PORT, DEFAULT_PREFIX, SCHEMES};
pub use lease::RedisHold;
pub use lock::{KeyLayout, RedisBackend};

/// A lock client on Redis (single server or RedLock): [`RedisBackend`] with the shared
/// lease machinery of `lock-core`.
pub type RedisLock = LeaseClient<RedisBackend>;
