#![doc = include_str!("../README.md")]

// The same files as every backend crate: `config.rs`, `error.rs`, `backend.rs` (the
// `Backend` and `Connect` impls), `hold.rs` (holds, renewal, release), `connection.rs`
// (connections, wake-up subscriptions), `layout.rs` (key names), `queue.rs` (the waiter
// queue), `operator.rs` (who holds and who waits, which names are held, breaking a hold);
// and, for Redis alone, `connection/sentinel.rs` (finding the primary through Sentinels),
// `connection/cluster.rs` (routing by hash slot on Redis Cluster),
// `redlock.rs` (the RedLock quorum rounds) and `scripts/` (the Lua scripts).

mod attempt;
mod backend;
mod config;
mod connection;
mod error;
mod hold;
mod layout;
mod operator;
mod queue;
mod redlock;
mod scripts;
mod topology;

use lock_core::raw::LeaseClient;

pub use backend::RedisBackend;
pub use config::{RedisConfig, RedisNode, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_SENTINEL_PORT};
pub use hold::RedisHold;
pub use layout::KeyLayout;

/// The URL schemes this crate serves: `redis` (one server), `rediss` (one server over
/// TLS), `redlock` (RedLock over several independent servers), `redis+sentinel` (the
/// primary that Sentinels name, followed across failovers), `rediss+sentinel` (the
/// same over TLS), `redis+cluster` (Redis Cluster, each lock on the primary owning its
/// hash slot) and `rediss+cluster` (the same over TLS).
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redlock",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
];

/// A lock client on Redis (single server, Sentinel, Cluster or RedLock): [`RedisBackend`] with the shared
/// lease machinery of `lock-core`.
pub type RedisLock = LeaseClient<RedisBackend>;
