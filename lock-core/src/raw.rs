//! The backend-author kit: what a crate needs to add a backend, and nothing a lock user
//! touches.
//!
//! A backend implements [`Backend`] (the protocol half: acquire, renew, release) and
//! [`Connect`] (its URL schemes, its configuration and how it opens a connection);
//! [`LeaseClient`] adds everything that is the same for every backend and turns it into a
//! [`DistributedLock`](crate::DistributedLock). [`Driver::of`] describes it to a [`Registry`], and [`register`] makes its schemes known to
//! [`connect`](crate::connect). The rest is shared plumbing, written once here so that no
//! backend keeps a copy: [`lock_unpoisoned`], [`Cleanup`]/[`CleanupOnDrop`], [`Background`], [`Backoff`],
//! [`Error::no_answer`](crate::Error::no_answer).

pub use crate::backend::{
    AcquireRequest, Acquired, Amended, Backend, BackendRelease, RenewItem, RenewOutcome,
    SessionHealth, SessionStatus,
};
pub use crate::kind::{Amendment, HoldKind};
pub use crate::changes::ChangeFeed;
pub use crate::driver::{Connect, ConnectFuture, Driver};
pub use crate::error::BoxError;
pub use crate::global::{register, registry};
pub use crate::lease::{drift_margin, validity_deadline, LeaseClient};
pub use crate::lock_url::{HostPort, LockUrl};
pub use crate::name::MAX_NAME_BYTES;
pub use crate::name::{escape, escape_where, unescape};
pub use crate::options::{duration_text, format_duration, parse_duration};
pub use crate::options::{DEFAULT_RECHECK, DEFAULT_REQUEST_TIMEOUT, DEFAULT_TTL, MAX_DURATION};
pub use crate::plumbing::{lock_unpoisoned, Background, Backoff, Cleanup, CleanupOnDrop};
pub use crate::registry::Registry;
