#![doc = include_str!("../README.md")]

// The same files as every backend crate: `config.rs` (the configuration; `config/url.rs`
// reads it from a URL), `error.rs`, `backend.rs` (the `Backend` and `Connect` impls),
// `hold.rs` (holds, renewal, release, an election leader's proclaim; `hold/cluster.rs`
// renewal on Redis Cluster),
// `connection.rs` (connections, wake-up subscriptions), `layout.rs` (key names),
// `queue.rs` (the waiter queue), `operator.rs` (who holds and who waits, which names are
// held, breaking a hold); and, for Redis alone, `topology.rs` (one server, Sentinel,
// Redis Cluster or RedLock, chosen once at open, and the routes the protocol pieces
// take), `attempt.rs` (one acquire attempt where one server decides), `redlock.rs` (the
// RedLock quorum rounds), `scripts.rs` with `scripts/` (the Lua scripts),
// `connection/sentinel.rs` (finding the primary through Sentinels),
// `connection/cluster.rs` (routing by hash slot on Redis Cluster) and
// `connection/wakeups/` (the pub/sub and sharded wake-up transports).
//
// Imports flow one way: backend -> redlock, attempt -> queue -> hold -> topology ->
// connection, with config, error, layout and scripts at the bottom.

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

use lock_core::raw::backend::LeaseClient;

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
