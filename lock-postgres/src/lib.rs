#![doc = include_str!("../README.md")]

mod advisory;
mod backend;
mod config;
mod connection;
mod error;
mod fence;
mod handover;
mod hold;
mod layout;
mod listener;
mod operator;
mod queue;
mod tls;

pub use advisory::{madelson_key, AdvisoryKey};
pub use backend::{PostgresBackend, CAPABILITIES};
pub use config::{
    PostgresConfig, SslMode, DEFAULT_MARK_TTL, DEFAULT_POOL_SIZE, DEFAULT_PORT, DEFAULT_SCHEMA,
};
pub use fence::PostgresFence;
pub use hold::PostgresHold;

/// The URL schemes this crate serves: `postgres` and `postgresql`.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// A lock client on PostgreSQL.
pub type PostgresLock = lock_core::raw::backend::LeaseClient<PostgresBackend>;
