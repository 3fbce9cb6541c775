//! Mapping ZooKeeper client errors into the one public [`lock_core::Error`], and the
//! predicates that classify them.

use lock_core::Error;
use zookeeper_client as zk;

/// The backend name used in errors and capabilities.
pub(crate) const BACKEND: &str = "zookeeper";

/// Converts a client error of operation `what` into the public error.
pub(crate) fn from_client(what: &str, err: zk::Error) -> Error {
    let message = format!("{what}: {err}");
    match err {
        zk::Error::ConnectionLoss
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::NoHosts
        | zk::Error::Timeout
        // The client reports I/O failures and unanswered requests as custom errors.
        | zk::Error::Custom(_) => Error::connection(BACKEND, message, err),
        zk::Error::NotReadOnly | zk::Error::Throttled | zk::Error::QuotaExceeded => {
            Error::Unavailable {
                backend: BACKEND,
                message,
                source: Some(Box::new(err)),
            }
        }
        zk::Error::AuthFailed | zk::Error::NoAuth | zk::Error::InvalidAcl => Error::InvalidConfig {
            message,
            source: Some(Box::new(err)),
        },
        _ => Error::Protocol {
            backend: BACKEND,
            message,
            source: Some(Box::new(err)),
        },
    }
}

/// What one read of a `multiRead` of operation `what` found: `expected`'s value for the
/// kind of reply it expects (it hands any other back), `None` for a missing node.
pub(crate) fn read_found<T>(
    what: &str,
    result: zk::MultiReadResult,
    expected: impl FnOnce(zk::MultiReadResult) -> Result<T, zk::MultiReadResult>,
) -> Result<Option<T>, Error> {
    match expected(result) {
        Ok(found) => Ok(Some(found)),
        Err(zk::MultiReadResult::Error {
            err: zk::Error::NoNode,
        }) => Ok(None),
        Err(zk::MultiReadResult::Error { err }) => Err(from_client(what, err)),
        Err(other) => Err(Error::Protocol {
            backend: BACKEND,
            message: format!("{what}: unexpected multiRead result {other:?}"),
            source: None,
        }),
    }
}

/// The error while no session is established (expired, being replaced).
pub(crate) fn no_session(epoch: u64) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message: format!("ZooKeeper session {epoch} is gone and a new one is not established yet"),
        source: None,
    }
}

/// Whether a client error means "try again on this session once it reconnects".
pub(crate) fn is_connection_loss(err: &zk::Error) -> bool {
    matches!(
        err,
        zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_)
    )
}

/// Whether a client error means the session is gone for good.
pub(crate) fn is_session_gone(err: &zk::Error) -> bool {
    matches!(
        err,
        zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::ClientClosed
            | zk::Error::AuthFailed
    )
}
