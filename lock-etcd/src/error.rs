//! Mapping etcd client errors into the one public [`lock_core::Error`] ([`from_client`]),
//! and the predicates on those errors that the protocol decides by.
//!
//! Classification follows what the caller can do about it: a lost quorum or a leader
//! election is [`Error::Unavailable`] (retry later), a broken or silent connection is
//! [`Error::Connection`], refused credentials are [`Error::InvalidConfig`] (retrying
//! will not help), anything unexpected is [`Error::Protocol`]. Messages never contain
//! credentials: the etcd client never puts them in its errors and we never add them.

use lock_core::Error;
use tonic::Code;

/// The backend name used in every error.
pub(crate) const BACKEND: &str = "etcd";

/// Converts an etcd client error met while doing `what`.
pub(crate) fn from_client(what: &str, err: etcd_client::Error) -> Error {
    match err {
        etcd_client::Error::GRpcStatus(status) => from_status(what, status),
        etcd_client::Error::InvalidArgs(_)
        | etcd_client::Error::InvalidUri(_)
        | etcd_client::Error::InvalidMetadataValue(_) => Error::InvalidConfig {
            message: format!("etcd client rejected the configuration while {what}"),
            source: Some(Box::new(err)),
        },
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            Error::connection(BACKEND, format!("{what} failed"), err)
        }
        other => Error::Protocol {
            backend: BACKEND,
            message: format!("{what} failed"),
            source: Some(Box::new(other)),
        },
    }
}

fn from_status(what: &str, status: tonic::Status) -> Error {
    let message = format!("{what}: {}", status.message());
    let unavailable = |source: tonic::Status| Error::Unavailable {
        backend: BACKEND,
        message: message.clone(),
        source: Some(Box::new(source)),
    };
    match status.code() {
        Code::Unavailable if is_cluster_unavailable(status.message()) => unavailable(status),
        Code::DeadlineExceeded | Code::Aborted => unavailable(status),
        Code::Unavailable | Code::Cancelled | Code::Unknown => Error::Connection {
            backend: BACKEND,
            message,
            source: Some(Box::new(status)),
        },
        Code::Unauthenticated | Code::PermissionDenied => Error::InvalidConfig {
            message: format!("etcd refused the credentials or permissions ({message})"),
            source: Some(Box::new(status)),
        },
        Code::InvalidArgument if is_credentials_problem(status.message()) => Error::InvalidConfig {
            message: format!("etcd refused the credentials ({message})"),
            source: Some(Box::new(status)),
        },
        _ => Error::Protocol {
            backend: BACKEND,
            message,
            source: Some(Box::new(status)),
        },
    }
}

/// etcd's own words for refused or missing credentials.
fn is_credentials_problem(message: &str) -> bool {
    [
        "authentication failed",
        "user name is empty",
        "invalid auth token",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// etcd's own words for "the cluster cannot serve now" (no quorum, election running).
fn is_cluster_unavailable(message: &str) -> bool {
    [
        "no leader",
        "request timed out",
        "leader changed",
        "not capable",
        "too many requests",
        "server stopped",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// True when `err` says a lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == Code::NotFound || status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("not found"),
        _ => false,
    }
}

/// True when an answer was refused for its size (the client's decoding limit).
pub(crate) fn is_too_large(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status) if status.code() == Code::OutOfRange)
}

/// True when `err` proves the request never took effect: the connection could not be
/// made, or the member has no leader (so it applies nothing). Safe to send elsewhere.
pub(crate) fn not_applied(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message();
            status.code() == Code::Unavailable
                && (message.contains("connect error")
                    || message.contains("error trying to connect")
                    || message.contains("no leader"))
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// True when a member answered that it has no leader (no quorum on its side).
pub(crate) fn no_leader(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status) if status.message().contains("no leader"))
}

/// True when `err` is about the connection rather than the request.
pub(crate) fn is_transport(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// An answer that does not have the shape etcd promises.
pub(crate) fn unexpected(what: &str, detail: impl Into<String>) -> Error {
    Error::Protocol {
        backend: BACKEND,
        message: format!("{what}: {}", detail.into()),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use lock_core::ErrorKind;

    use super::*;

    #[test]
    fn statuses_are_classified_by_what_the_caller_can_do() {
        let cases = [
            (
                tonic::Status::unavailable("etcdserver: no leader"),
                ErrorKind::Unavailable,
            ),
            (
                tonic::Status::unavailable("etcdserver: request timed out"),
                ErrorKind::Unavailable,
            ),
            (
                tonic::Status::unavailable("error trying to connect: refused"),
                ErrorKind::Connection,
            ),
            (
                tonic::Status::invalid_argument(
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                ErrorKind::InvalidConfig,
            ),
            (
                tonic::Status::permission_denied("etcdserver: permission denied"),
                ErrorKind::InvalidConfig,
            ),
            (
                tonic::Status::invalid_argument("etcdserver: too many operations in txn request"),
                ErrorKind::Protocol,
            ),
        ];
        for (status, kind) in cases {
            let err = from_client("acquire", etcd_client::Error::GRpcStatus(status));
            assert_eq!(err.kind(), kind, "{err}");
        }
    }

    #[test]
    fn lease_not_found_is_recognised() {
        let err = etcd_client::Error::GRpcStatus(tonic::Status::not_found(
            "etcdserver: requested lease not found",
        ));
        assert!(is_lease_not_found(&err));
        assert!(!is_lease_not_found(&etcd_client::Error::GRpcStatus(
            tonic::Status::unavailable("x")
        )));
    }
}
