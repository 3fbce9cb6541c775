#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod hold;
mod layout;
mod operator;
mod queue;
mod session;
mod tls;

pub use backend::{ZkBackend, CAPABILITIES};
pub use config::{ZkAcl, ZkConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_PREFIX};
pub use hold::ZkHold;
pub use layout::{
    broken_node, escape_segment, lock_dir, node_kind, permit_data, permits_in, queue_order,
    semaphore_dirs, NodeKind, BESIDE, DOWNGRADED, SEMAPHORE_LEASES, SEMAPHORE_LOCKS, UPGRADEABLE,
};

/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["zk", "zks"];

/// A lock client on ZooKeeper.
pub type ZkLock = lock_core::raw::backend::LeaseClient<ZkBackend>;
