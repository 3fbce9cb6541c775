#![doc = include_str!("../README.md")]

mod client;
mod config;
mod error;
mod lease;
mod lock;

pub use config::{EtcdConfig, DEFAULT_PORT};
pub use lock::{EtcdBackend, EtcdHold, EtcdLock, MAX_TXN_OPS};

/// The URL schemes this crate serves: `etcd` (plain) and `etcds` (TLS).
pub const SCHEMES: &[&str] = &["etcd", "etcds"];
