//! Mapping of the Redis client library's errors onto [`lock_core::Error`].

use std::time::Duration;

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

/// What went wrong when `what` was asked of `node` (a `host:port`, never credentials).
pub(crate) fn map(backend: &'static str, what: &str, node: &str, err: RedisError) -> Error {
    let message = format!("{what} on {node}: {err}");
    let code = err.code().unwrap_or_default().to_owned();
    let source = Some(Box::new(err.clone()) as lock_core::BoxError);
    match err.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            Error::InvalidConfig {
                message: format!("{what} on {node}: authentication or permission failed: {err}"),
                source,
            }
        }
        _ if AUTH_CODES.contains(&code.as_str()) => Error::InvalidConfig {
            message: format!("{what} on {node}: authentication or permission failed: {err}"),
            source,
        },
        ErrorKind::InvalidClientConfig => Error::InvalidConfig { message, source },
        ErrorKind::Io if refused_certificate(&err) => Error::InvalidConfig {
            message: format!(
                "{what} on {node}: the server's TLS certificate is not trusted: {err}"
            ),
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

/// `what` got no answer from `node` within `limit`.
pub(crate) fn deadline(backend: &'static str, what: &str, node: &str, limit: Duration) -> Error {
    Error::Connection {
        backend,
        message: format!("{what} on {node} got no answer within {limit:?}"),
        source: None,
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

/// Whether `err` is a TLS certificate the client refused (retrying cannot help).
///
/// The client library wraps the TLS error in an `Arc` behind an I/O error, which hides
/// it from downcasting; its text is all that is left to recognize it by.
fn refused_certificate(err: &RedisError) -> bool {
    let text = err.to_string();
    text.contains("invalid peer certificate") || text.contains("peer sent no certificates")
}

/// Whether the connection that produced `err` should be replaced by a new one.
pub(crate) fn breaks_connection(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
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
        assert_eq!(map("redis", "acquire", "h:1", io).kind(), Kind::Connection);
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert_eq!(
            map("redis", "acquire", "h:1", loading).kind(),
            Kind::Unavailable
        );
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad"));
        let mapped = map("redis", "connect", "h:1", auth);
        assert_eq!(mapped.kind(), Kind::InvalidConfig);
        assert!(!mapped.is_retryable());
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "shape"));
        assert_eq!(map("redis", "renew", "h:1", parse).kind(), Kind::Protocol);
        assert_eq!(
            deadline("redis", "renew", "h:1", Duration::from_secs(1)).kind(),
            Kind::Connection
        );
    }
}
