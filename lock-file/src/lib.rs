#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod counter;
mod error;
mod hold;
mod layout;
mod operator;
mod turnstile;
mod wakeup;

pub use backend::{FileBackend, CAPABILITIES};
pub use config::FileConfig;
pub use hold::FileHold;
pub use layout::{file_stem, MAX_STEM_BYTES};

/// The URL schemes this crate serves: `file`.
pub const SCHEMES: &[&str] = &["file"];

/// A lock client on a directory of this machine.
pub type FileLock = lock_core::raw::backend::LeaseClient<FileBackend>;
