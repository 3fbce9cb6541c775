//! The backend-author kit: what a crate needs to add a backend, and nothing a lock user
//! touches. It is in rooms, one per job, and every name has one path:
//!
//! - [`backend`]: the protocol half a backend implements ([`backend::Backend`]) and the
//!   [`backend::LeaseClient`] that turns it into a
//!   [`DistributedLock`](crate::DistributedLock).
//! - [`driver`]: how a backend is declared ([`driver::Connect`], [`driver::Driver::of`]),
//!   registered ([`driver::register`]) and opened by URL ([`driver::Registry`]).
//! - [`url`]: the parsed lock URL a backend reads its configuration from.
//! - [`names`]: escaping lock names into keys, paths and prefixes.
//! - [`durations`]: durations as text, and the defaults and bound of the common options.
//! - [`plumbing`]: what every backend needs beside its protocol (poison-free mutexes,
//!   background tasks, backoff, drop cleanups, configuration files read off the
//!   runtime), written once so no backend keeps a copy.

/// The protocol half a backend implements, the kinds of hold it grants and the feeds it
/// pushes; [`LeaseClient`](crate::raw::backend::LeaseClient) adds what is the same for every backend (renewal, state,
/// deadlines, reentrancy, cancellation-safe acquire, close).
pub mod backend {
    pub use crate::backend::{
        AcquireRequest, Acquired, Amended, Backend, BackendRelease, RenewItem, RenewOutcome,
        SessionHealth, SessionStatus,
    };
    pub use crate::changes::ChangeFeed;
    pub use crate::error::BoxError;
    pub use crate::kind::{Amendment, HoldKind, SemaphoreResize};
    pub use crate::lease::{drift_margin, validity_deadline, LeaseClient};
    pub use crate::options::AcquireKind;
}

/// How a backend is declared to the one registry, registered, and opened by URL.
pub mod driver {
    pub use crate::driver::{Connect, ConnectFuture, Driver};
    pub use crate::global::{register, registry};
    pub use crate::registry::Registry;
}

/// The lock URL, parsed once, with its hosts and query options.
pub mod url {
    pub use crate::lock_url::{HostPort, LockUrl};
}

/// Lock names turned into server keys, paths or prefixes and back, and their limit.
pub mod names {
    pub use crate::name::{escape, escape_where, unescape, MAX_NAME_BYTES};
}

/// Durations as text (URL values, serde fields, messages), and the defaults and upper
/// bound of the durations every client takes.
pub mod durations {
    pub use crate::durations::{duration_text, format_duration, parse_duration, MAX_DURATION};
    pub use crate::options::{DEFAULT_RECHECK, DEFAULT_REQUEST_TIMEOUT, DEFAULT_TTL};
}

/// Plumbing every backend shares: poison-free mutexes, a tracked set of background tasks,
/// backoff, cleanups that run when their owner is dropped, and configuration files read
/// off the runtime.
pub mod plumbing {
    pub use crate::plumbing::{
        lock_unpoisoned, read_config_file, Background, Backoff, Cleanup, CleanupOnDrop,
    };
}
