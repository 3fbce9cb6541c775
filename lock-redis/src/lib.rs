#![doc = include_str!("../README.md")]

// The files every backend crate has, each in the same role: `config.rs` (the
// configuration; `config/deployment.rs` the servers it names, `config/url.rs` its URL
// form), `error.rs`, `backend.rs` (the `Backend` and `Connect` impls), `hold.rs` (holds,
// renewal, release, an election leader's proclaim; `hold/cluster.rs` renewal on Redis
// Cluster), `layout.rs` (key names, and the keys of one hold), `queue.rs` (the waiter
// queue as a waiter sees it) and `operator.rs` (who holds and who waits, which names are
// held, breaking a hold). `connection.rs` (connections, wake-up subscriptions) has a
// namesake in lock-etcd only; ZooKeeper's connection is its session (`session.rs`). For
// Redis alone: `topology.rs` (one server, Sentinel, Redis Cluster or RedLock, chosen once
// at open, and the routes requests take), `attempt.rs` (one acquire attempt where one
// server decides), `redlock.rs` (the RedLock quorum rounds), `scripts.rs` with
// `scripts/` (the Lua scripts and, beside them, how each is called),
// `connection/sentinel.rs` (finding the primary through Sentinels),
// `connection/cluster.rs` (routing by hash slot on Redis Cluster) and
// `connection/wakeups/` (the pub/sub and sharded wake-up transports), and `fence.rs` (a
// fenced resource of lock_core::fence, with its script `scripts/fenced_store.lua`).
//
// Imports flow one way: backend -> redlock -> attempt -> hold, queue -> topology ->
// scripts -> connection (operator beside attempt), with config, error and layout at the
// bottom.

mod attempt;
mod backend;
mod config;
mod connection;
mod error;
mod fence;
mod hold;
mod layout;
mod operator;
mod queue;
mod redlock;
mod scripts;
mod topology;

use lock_core::raw::backend::LeaseClient;

pub use backend::RedisBackend;
pub use config::{
    RedisConfig, RedisDeployment, RedisNode, SentinelAuth, DEFAULT_PORT, DEFAULT_PREFIX,
    DEFAULT_SENTINEL_PORT,
};
pub use fence::RedisFence;
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

/// A lock client on Redis (single server, Sentinel, Cluster or RedLock): [`RedisBackend`]
/// with the shared lease machinery of `lock-core`.
pub type RedisLock = LeaseClient<RedisBackend>;
