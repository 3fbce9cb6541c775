//! distlock ZooKeeper backend (zk://): ephemeral sequential nodes, predecessor watch, Curator-compatible layout.
//!
//! This crate is a skeleton: its backend lands with its own issue. Until then
//! [`register`] registers nothing and [`SCHEMES`] lists the schemes it will serve,
//! so `lock_core::connect` names this crate when one of them is asked for.

/// The URL schemes this crate serves once its backend lands.
pub const SCHEMES: &[&str] = &[];

/// Registers this crate's schemes in the process-wide registry.
pub fn register() {
    for _scheme in SCHEMES {}
}
