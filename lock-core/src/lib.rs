#![doc = include_str!("../README.md")]

mod backend;
mod capabilities;
mod changes;
mod driver;
mod durations;
mod erased;
mod error;
mod ext;
pub mod fence;
mod global;
mod guard;
mod kind;
mod lease;
mod lock;
mod lock_url;
pub mod memory;
pub mod metrics;
pub mod migration;
mod name;
mod occupancy;
mod options;
mod plumbing;
mod primitives;
pub mod raw;
mod registry;
mod state;
mod token;

// The user API, in one screen. The backend-author kit is in [`raw`].
pub use capabilities::{Capabilities, FencingSource};
pub use error::{Error, ErrorKind, Result};
pub use ext::{DistributedLockExt, LockContext, RunOutcome};
pub use global::{connect, connect_with};
pub use guard::{LockGuard, LockWatch};
pub use lock::DistributedLock;
pub use name::LockName;
pub use occupancy::{Occupancy, Participant};
pub use options::{AcquireOptions, LockOptions, LockOptionsBuilder, RenewalMode, Wait};
pub use primitives::{
    Election, Leader, LeaderEvent, LeaderEvents, LeaderObserver, LeaderService, Leadership,
    MultiGuard, MultiLock, Permit, ReadGuard, RwLock, Semaphore, ServiceSummary,
    UpgradeableReadGuard, WriteGuard,
};
pub use state::{LockState, LostReason, ReleaseOutcome};
pub use token::{FencingToken, OwnerId, OwnerToken};
