#![doc = include_str!("../README.md")]

mod client;
mod config;
mod error;
mod lease;
mod lock;

pub use config::{ZkAcl, ZkConfig, DEFAULT_BASE, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT};
pub use lease::ZkHold;
pub use lock::{escape_segment, lock_dir, queue_order, ZkBackend, ZkLock, SCHEMES};

/// Registers `zk://` in the process-wide registry ([`lock_core::registry`]).
pub fn register() {
    for scheme in SCHEMES {
        lock_core::registry().register(scheme, lock::connect_url);
    }
}

/// Connects a ZooKeeper lock client with `config`.
///
/// # Errors
/// See [`ZkBackend::connect`].
pub async fn connect(config: ZkConfig) -> lock_core::Result<ZkLock> {
    ZkBackend::connect(config).await
}
