#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod connection;
mod error;
mod fence;
mod hold;
mod layout;
mod operator;
mod queue;
mod session;
mod slots;
mod tls;

pub use backend::{EtcdBackend, CAPABILITIES};
pub use config::{EtcdConfig, DEFAULT_MARK_TTL, DEFAULT_PORT};
pub use fence::{EtcdFence, TOKEN_SUFFIX};
pub use hold::{EtcdHold, MAX_TXN_OPS};

/// The URL schemes this crate serves: `etcd` (plain) and `etcds` (TLS).
pub const SCHEMES: &[&str] = &["etcd", "etcds"];

/// A lock client on etcd.
pub type EtcdLock = lock_core::raw::backend::LeaseClient<EtcdBackend>;
