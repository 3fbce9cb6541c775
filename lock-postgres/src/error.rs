//! Mapping Postgres client errors into the one public [`lock_core::Error`]
//! ([`from_client`]).
//!
//! Classification follows what the caller can do about it: a server shutting down, in
//! recovery (a standby) or out of connections is [`Error::Unavailable`] (retry later); a
//! broken or silent connection, or a statement the server cancelled at its own timeout,
//! is [`Error::Connection`]; refused credentials, a missing database, a TLS session
//! refused for its certificates (the server's not trusted, the client's refused) or a
//! server without the TLS `sslmode` asks for are [`Error::InvalidConfig`] (retrying will
//! not help); anything unexpected is
//! [`Error::Protocol`]. Messages never contain credentials: the client never puts them in
//! its errors and we never add them.

use std::fmt;

use lock_core::Error;
use tokio_postgres::error::SqlState;

/// The backend name used in every error.
pub(crate) const BACKEND: &str = "postgres";

/// Converts a client error met while doing `what`.
pub(crate) fn from_client(what: &str, err: tokio_postgres::Error) -> Error {
    let Some(code) = err.code().cloned() else {
        if let Some(tls) = crate::tls::refused(&err) {
            return Error::InvalidConfig {
                message: format!(
                    "{what}: the TLS session with Postgres was refused ({tls}); check \
                     sslmode, sslrootcert (ca_file), sslcert and sslkey"
                ),
                source: Some(Box::new(err)),
            };
        }
        if std::error::Error::source(&err)
            .is_some_and(|cause| cause.to_string() == "server does not support TLS")
        {
            return Error::InvalidConfig {
                message: format!(
                    "{what}: the Postgres server does not offer TLS, which sslmode asks for"
                ),
                source: Some(Box::new(err)),
            };
        }
        return Error::connection(BACKEND, format!("{what} failed"), err);
    };
    let message = match err.as_db_error() {
        Some(db) => format!("{what}: {}", db.message()),
        None => format!("{what} failed"),
    };
    if code == SqlState::INVALID_PASSWORD
        || code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        || code == SqlState::INVALID_CATALOG_NAME
        || code == SqlState::INSUFFICIENT_PRIVILEGE
    {
        return Error::InvalidConfig {
            message: format!("Postgres refused the credentials or permissions ({message})"),
            source: Some(Box::new(err)),
        };
    }
    if code == SqlState::ADMIN_SHUTDOWN
        || code == SqlState::CRASH_SHUTDOWN
        || code == SqlState::CANNOT_CONNECT_NOW
        || code == SqlState::TOO_MANY_CONNECTIONS
        || code == SqlState::READ_ONLY_SQL_TRANSACTION
        || code == SqlState::T_R_SERIALIZATION_FAILURE
        || code == SqlState::T_R_DEADLOCK_DETECTED
        || code == SqlState::LOCK_NOT_AVAILABLE
    {
        return Error::Unavailable {
            backend: BACKEND,
            message,
            source: Some(Box::new(err)),
        };
    }
    if code == SqlState::QUERY_CANCELED || code.code().starts_with("08") {
        return Error::Connection {
            backend: BACKEND,
            message,
            source: Some(Box::new(err)),
        };
    }
    Error::Protocol {
        backend: BACKEND,
        message,
        source: Some(Box::new(err)),
    }
}

/// A [`Error::Protocol`] for something the server should never show.
pub(crate) fn unexpected(what: &str, detail: impl fmt::Display) -> Error {
    Error::Protocol {
        backend: BACKEND,
        message: format!("{what}: unexpected {detail}"),
        source: None,
    }
}
