#![doc = include_str!("../README.md")]

mod client;
mod config;
mod error;
mod lease;
mod lock;

pub use config::{ZkAcl, ZkConfig, DEFAULT_BASE, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT};
pub use lease::ZkHold;
pub use lock::{escape_segment, lock_dir, queue_order, ZkBackend, ZkLock, SCHEMES};
