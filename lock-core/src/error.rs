//! The one public error type of distlock.

use std::fmt;
use std::time::Duration;

use crate::state::LostReason;

/// A boxed error from a backend client library, kept as the source of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `Result<T, distlock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a distributed lock.
///
/// Each variant describes *what* went wrong; [`Error::kind`] groups them and
/// [`Error::is_retryable`] tells whether the same call may succeed later.
/// Messages never contain credentials.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A wait for a lock ran out of time.
    #[error("timed out after {waited:?} waiting for lock `{name}`")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lock was lost before or during the operation.
    #[error("lock `{name}` was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why it was lost.
        reason: LostReason,
    },
    /// The operation needs a lock this client does not hold.
    #[error("lock `{name}` is not held: {message}")]
    NotHeld {
        /// The lock name.
        name: String,
        /// What was attempted.
        message: String,
    },
    /// The connection to the lock service failed or timed out.
    #[error("connection to {backend} failed: {message}")]
    Connection {
        /// The backend that failed (`redis`, `zookeeper`, `etcd`, …).
        backend: &'static str,
        /// What happened, without credentials.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The lock service is reachable but cannot serve now (no quorum, loading, read-only).
    #[error("{backend} is unavailable: {message}")]
    Unavailable {
        /// The backend that is unavailable.
        backend: &'static str,
        /// What happened.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The lock name is not acceptable.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The name as given (truncated when very long).
        name: String,
        /// What rule it breaks.
        reason: String,
    },
    /// The configuration or URL is not acceptable.
    #[error("invalid configuration: {message}")]
    InvalidConfig {
        /// What is wrong, without credentials.
        message: String,
        /// The underlying parse error.
        #[source]
        source: Option<BoxError>,
    },
    /// No backend is registered for a URL scheme.
    #[error("unknown lock URL scheme `{scheme}`{hint}; known schemes: {}", known.join(", "))]
    UnknownScheme {
        /// The scheme that was asked for.
        scheme: String,
        /// The schemes that are registered.
        known: Vec<String>,
        /// A hint naming the crate that provides the scheme, if one is known.
        hint: String,
    },
    /// The backend does not support the operation or option.
    #[error("{backend} does not support {operation}")]
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// What was asked for.
        operation: String,
    },
    /// The client was closed ([`DistributedLock::close`](crate::DistributedLock::close)):
    /// it takes no more calls, and nothing was queued or taken.
    #[error("the {backend} lock client is closed: cannot {operation}")]
    Closed {
        /// The backend of the client.
        backend: &'static str,
        /// What was asked of it, with the lock's name where there is one.
        operation: String,
    },
    /// The participants of one name disagree on what it is: a semaphore's number of
    /// permits, or a name used as two kinds of lock. Nothing was queued or taken.
    #[error("`{name}` is in use as {theirs}; this acquire asked for {ours}")]
    Conflict {
        /// The lock name.
        name: String,
        /// What this acquire asked for (`a semaphore of 4 permits`).
        ours: String,
        /// What the name's other participants use it as.
        theirs: String,
    },
    /// The lock service answered something unexpected.
    #[error("{backend} protocol error: {message}")]
    Protocol {
        /// The backend.
        backend: &'static str,
        /// What was unexpected.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

/// The broad class of an [`Error`], for matching without caring about details.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// See [`Error::Timeout`].
    Timeout,
    /// See [`Error::Lost`].
    Lost,
    /// See [`Error::NotHeld`].
    NotHeld,
    /// See [`Error::Connection`].
    Connection,
    /// See [`Error::Unavailable`].
    Unavailable,
    /// See [`Error::InvalidName`].
    InvalidName,
    /// See [`Error::InvalidConfig`].
    InvalidConfig,
    /// See [`Error::UnknownScheme`].
    UnknownScheme,
    /// See [`Error::Unsupported`].
    Unsupported,
    /// See [`Error::Closed`].
    Closed,
    /// See [`Error::Conflict`].
    Conflict,
    /// See [`Error::Protocol`].
    Protocol,
}

impl ErrorKind {
    /// A stable snake_case name of the kind (`timeout`, `not_held`, …), as in the `kind`
    /// label of [`crate::metrics::ACQUIRE_ERRORS`].
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Lost => "lost",
            ErrorKind::NotHeld => "not_held",
            ErrorKind::Connection => "connection",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::InvalidName => "invalid_name",
            ErrorKind::InvalidConfig => "invalid_config",
            ErrorKind::UnknownScheme => "unknown_scheme",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Closed => "closed",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Protocol => "protocol",
        }
    }
}

impl Error {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Lost { .. } => ErrorKind::Lost,
            Error::NotHeld { .. } => ErrorKind::NotHeld,
            Error::Connection { .. } => ErrorKind::Connection,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::InvalidName { .. } => ErrorKind::InvalidName,
            Error::InvalidConfig { .. } => ErrorKind::InvalidConfig,
            Error::UnknownScheme { .. } => ErrorKind::UnknownScheme,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Closed { .. } => ErrorKind::Closed,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::Protocol { .. } => ErrorKind::Protocol,
        }
    }

    /// Whether the same call may succeed if tried again later.
    ///
    /// Timeouts, connection failures and unavailability are retryable; bad input,
    /// lost locks, unsupported operations and a closed client are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Timeout | ErrorKind::Connection | ErrorKind::Unavailable
        )
    }

    /// A [`Error::Connection`] with a source.
    pub fn connection(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Connection {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The [`Error::Connection`] of a request (`what`) that got no answer within `limit`.
    pub fn no_answer(backend: &'static str, what: impl fmt::Display, limit: Duration) -> Self {
        Error::Connection {
            backend,
            message: format!("{what} got no answer within {limit:?}"),
            source: None,
        }
    }

    /// An [`Error::Unsupported`]: `backend` cannot do `operation`.
    pub fn unsupported(backend: &'static str, operation: impl Into<String>) -> Self {
        Error::Unsupported {
            backend,
            operation: operation.into(),
        }
    }

    /// An [`Error::Closed`]: a client of `backend`, closed, was asked to `operation`.
    pub fn closed(backend: &'static str, operation: impl Into<String>) -> Self {
        Error::Closed {
            backend,
            operation: operation.into(),
        }
    }

    /// A [`Error::InvalidConfig`] without a source.
    pub fn config(message: impl Into<String>) -> Self {
        Error::InvalidConfig {
            message: message.into(),
            source: None,
        }
    }

    /// A [`Error::InvalidName`]; long names are truncated in the message.
    pub fn invalid_name(name: &str, reason: impl Into<String>) -> Self {
        const SHOWN: usize = 64;
        let shown = if name.len() > SHOWN {
            let mut end = SHOWN;
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &name[..end])
        } else {
            name.to_owned()
        };
        Error::InvalidName {
            name: shown,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryability_is_classified_per_kind() {
        let timeout = Error::Timeout {
            name: "a".into(),
            waited: Duration::from_secs(1),
        };
        assert!(timeout.is_retryable());
        assert!(!Error::config("bad").is_retryable());
        assert!(!Error::invalid_name("", "empty").is_retryable());
        assert!(Error::connection("redis", "refused", "io").is_retryable());
        assert!(!Error::closed("redis", "acquire `a`").is_retryable());
    }

    #[test]
    fn long_names_are_truncated_on_a_char_boundary() {
        let name = "é".repeat(100);
        let Error::InvalidName { name: shown, .. } = Error::invalid_name(&name, "too long") else {
            panic!("wrong variant");
        };
        assert!(shown.len() < 70);
        assert!(shown.ends_with('…'));
    }

    #[test]
    fn unknown_scheme_lists_known_ones() {
        let err = Error::UnknownScheme {
            scheme: "foo".into(),
            known: vec!["memory".into(), "redis".into()],
            hint: String::new(),
        };
        assert_eq!(
            err.to_string(),
            "unknown lock URL scheme `foo`; known schemes: memory, redis"
        );
    }
}
