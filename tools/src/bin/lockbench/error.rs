//! The error every workload and target may end with: whatever failed, boxed.

/// Any error, boxed (a client's, a server's, a workload's own).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
