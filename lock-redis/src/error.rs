//! Mapping of the Redis client library's errors onto [`lock_core::Error`], and the
//! Redis-specific error predicates.

use std::fmt;

use lock_core::raw::backend::BoxError;
use lock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Server error codes that mean "reachable, but cannot serve now".
const UNAVAILABLE_CODES: &[&str] = &[
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
    "NOQUORUM",
    "BUSY",
    "OOM",
];

/// Server error codes that mean the credentials are wrong or lack a permission.
const AUTH_CODES: &[&str] = &["NOAUTH", "WRONGPASS", "NOPERM"];

/// What went wrong when `what` (naming the server as `host:port`, never credentials) was
/// asked on `backend` (`redis` or `redlock`).
pub(crate) fn from_client(
    backend: &'static str,
    what: impl fmt::Display,
    err: RedisError,
) -> Error {
    let message = format!("{what}: {err}");
    let code = err.code().unwrap_or_default().to_owned();
    let source = Some(Box::new(err.clone()) as BoxError);
    match err.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            Error::InvalidConfig {
                message: format!("{what}: authentication or permission failed: {err}"),
                source,
            }
        }
        _ if AUTH_CODES.contains(&code.as_str()) => Error::InvalidConfig {
            message: format!("{what}: authentication or permission failed: {err}"),
            source,
        },
        ErrorKind::InvalidClientConfig => Error::InvalidConfig { message, source },
        ErrorKind::Io if refused_certificate(&err) => Error::InvalidConfig {
            message: format!("{what}: the server's TLS certificate is not trusted: {err}"),
            source,
        },
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown,
        ) => Error::Unavailable {
            backend,
            message,
            source,
        },
        _ if UNAVAILABLE_CODES.contains(&code.as_str()) => Error::Unavailable {
            backend,
            message,
            source,
        },
        ErrorKind::Io => Error::Connection {
            backend,
            message,
            source,
        },
        _ => Error::Protocol {
            backend,
            message,
            source,
        },
    }
}

/// A reply of an unexpected shape.
pub(crate) fn protocol(backend: &'static str, message: String) -> Error {
    Error::Protocol {
        backend,
        message,
        source: None,
    }
}

/// Fewer servers than a majority answered (`message` says what and how many); the first
/// error seen is the source.
pub(crate) fn no_majority(
    backend: &'static str,
    message: String,
    first_error: Option<Error>,
) -> Error {
    Error::Unavailable {
        backend,
        message,
        source: first_error.map(|e| Box::new(e) as BoxError),
    }
}

/// The answers of the servers that answered `what` (each with its server's index), when
/// at least `quorum` of them did; otherwise the error: a single server's own, or
/// [`no_majority`] with the first error.
pub(crate) fn majority<T>(
    backend: &'static str,
    quorum: usize,
    replies: Vec<Result<T, Error>>,
    what: impl fmt::Display,
) -> Result<Vec<(usize, T)>, Error> {
    let n = replies.len();
    let mut answers = Vec::with_capacity(n);
    let mut first_error = None;
    for (i, reply) in replies.into_iter().enumerate() {
        match reply {
            Ok(answer) => answers.push((i, answer)),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    if answers.len() >= quorum {
        return Ok(answers);
    }
    Err(match (n, first_error) {
        (1, Some(err)) => err,
        (_, first_error) => no_majority(
            backend,
            format!(
                "only {} of {n} servers answered {what}; RedLock needs {quorum}",
                answers.len()
            ),
            first_error,
        ),
    })
}

/// Whether `err` is a TLS certificate the client refused (retrying cannot help).
///
/// The client library wraps the TLS error in an `Arc` behind an I/O error, which hides
/// it from downcasting; its text is all that is left to recognize it by.
fn refused_certificate(err: &RedisError) -> bool {
    let text = err.to_string();
    text.contains("invalid peer certificate") || text.contains("peer sent no certificates")
}

/// Whether `err` is a write refused by a replica (`READONLY`).
pub(crate) fn is_read_only(err: &RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly))
        || err.code() == Some("READONLY")
}

/// Whether the connection that produced `err` should be replaced by a new one (also when
/// it reaches a replica: behind Sentinels the new one goes to the primary).
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || is_read_only(err)
        || matches!(
            err.kind(),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType | ErrorKind::AuthenticationFailed
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::ErrorKind as Kind;

    #[test]
    fn errors_are_classified() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            from_client("redis", "acquire on h:1", io).kind(),
            Kind::Connection
        );
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert_eq!(
            from_client("redis", "acquire on h:1", loading).kind(),
            Kind::Unavailable
        );
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad"));
        let mapped = from_client("redis", "connect on h:1", auth);
        assert_eq!(mapped.kind(), Kind::InvalidConfig);
        assert!(!mapped.is_retryable());
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "shape"));
        assert_eq!(
            from_client("redis", "renew on h:1", parse).kind(),
            Kind::Protocol
        );
        let silent = Error::no_answer("redis", "renew on h:1", std::time::Duration::from_secs(1));
        assert_eq!(silent.kind(), Kind::Connection);
    }
}
