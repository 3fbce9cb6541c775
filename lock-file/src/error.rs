//! Mapping file-system errors into the one public [`lock_core::Error`] ([`from_io`]).
//!
//! A directory we may not write, or a path that is not a directory, is
//! [`Error::InvalidConfig`] (retrying will not help); anything else the kernel refuses
//! (no space, too many open files) is [`Error::Unavailable`].

use lock_core::Error;
use nix::errno::Errno;

/// The backend name used in every error.
pub(crate) const BACKEND: &str = "file";

/// Converts an I/O error met while doing `what`.
pub(crate) fn from_io(what: &str, err: std::io::Error) -> Error {
    use std::io::ErrorKind as Kind;
    match err.kind() {
        Kind::PermissionDenied | Kind::NotADirectory | Kind::ReadOnlyFilesystem => {
            Error::InvalidConfig {
                message: format!("{what}: {err}"),
                source: Some(Box::new(err)),
            }
        }
        _ => Error::Unavailable {
            backend: BACKEND,
            message: format!("{what}: {err}"),
            source: Some(Box::new(err)),
        },
    }
}

/// Converts an errno met while doing `what`.
pub(crate) fn from_errno(what: &str, errno: Errno) -> Error {
    from_io(what, std::io::Error::from(errno))
}

/// The error of a blocking file task that panicked or was cancelled at shutdown.
pub(crate) fn task_failed(err: tokio::task::JoinError) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message: "a file-system task did not finish".into(),
        source: Some(Box::new(err)),
    }
}
