#![doc = include_str!("../README.md")]

mod backend;
mod capabilities;
mod error;
mod guard;
mod lease;
mod lock;
mod lock_url;
pub mod memory;
pub mod metrics;
pub mod migration;
mod name;
mod occupancy;
mod options;
pub mod raw;
mod registry;
mod run;
mod token;

pub use capabilities::{Capabilities, FencingSource};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use guard::{LockGuard, LockState, LockWatch, LostReason, ReleaseOutcome, Side};
pub use lock::{DistributedLock, DistributedLockExt};
pub use metrics::describe_metrics;
pub use name::{LockName, MAX_NAME_BYTES};
pub use occupancy::{Occupancy, Participant};
pub use options::{
    AcquireOptions, LockOptions, RenewalMode, Wait, DEFAULT_RECHECK, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TTL, MAX_DURATION,
};
pub use registry::connect;
pub use run::{LockContext, RunOutcome};
pub use token::{FencingToken, OwnerId, OwnerToken};

/// The instant type used for validity deadlines (tokio's monotonic clock).
pub use tokio::time::Instant;
