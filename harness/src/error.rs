//! The harness error type.

use std::time::Duration;

/// Why a test server could not be found, started, driven or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A server binary (or jar) is not installed. Tests skip loudly on this, or fail
    /// when [`strict`](super::strict) mode is on.
    #[error("required binary `{binary}` not found; install it with: {hint}")]
    MissingBinary {
        /// The program or file that was looked for.
        binary: String,
        /// How to install it.
        hint: &'static str,
    },
    /// An operating-system call made by the harness failed.
    #[error("{server}: {action}: {source}")]
    Io {
        /// The server (or component) concerned.
        server: String,
        /// What the harness was doing.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The server process exited before it became ready.
    #[error(
        "{server}: exited during start-up ({status})\n--- last lines of {log} ---\n{log_tail}"
    )]
    Exited {
        /// The server concerned.
        server: String,
        /// The exit status as reported by the OS.
        status: String,
        /// Path of the server's log file.
        log: String,
        /// The last lines of the log file.
        log_tail: String,
    },
    /// A port the server needed was already taken by someone else.
    #[error("{server}: address already in use\n--- last lines of {log} ---\n{log_tail}")]
    AddrInUse {
        /// The server concerned.
        server: String,
        /// Path of the server's log file.
        log: String,
        /// The last lines of the log file.
        log_tail: String,
    },
    /// The server did not pass its readiness check in time.
    #[error(
        "{server}: not ready after {waited:?}: {detail}\n--- last lines of {log} ---\n{log_tail}"
    )]
    NotReady {
        /// The server concerned.
        server: String,
        /// How long the harness waited.
        waited: Duration,
        /// The last probe result.
        detail: String,
        /// Path of the server's log file.
        log: String,
        /// The last lines of the log file.
        log_tail: String,
    },
    /// Sending a signal to a server process failed.
    #[error("{server}: sending {signal} to pid {pid} failed: {source}")]
    Signal {
        /// The server concerned.
        server: String,
        /// The signal name.
        signal: &'static str,
        /// The target pid.
        pid: u32,
        /// The underlying error.
        #[source]
        source: nix::errno::Errno,
    },
    /// The operation needs a running server process, and there is none.
    #[error("{server}: not running")]
    NotRunning {
        /// The server concerned.
        server: String,
    },
    /// A cluster-level condition (quorum, leader) was not reached in time.
    #[error("{cluster}: {detail}")]
    Cluster {
        /// The cluster concerned.
        cluster: String,
        /// What was expected and what was seen.
        detail: String,
    },
}

impl HarnessError {
    /// True if this is [`HarnessError::MissingBinary`].
    pub fn is_missing_binary(&self) -> bool {
        matches!(self, Self::MissingBinary { .. })
    }

    /// True if this is [`HarnessError::AddrInUse`] (start is retried on fresh ports).
    pub(crate) fn is_addr_in_use(&self) -> bool {
        matches!(self, Self::AddrInUse { .. })
    }

    pub(crate) fn io(server: &str, action: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            server: server.to_owned(),
            action: action.into(),
            source,
        }
    }
}
