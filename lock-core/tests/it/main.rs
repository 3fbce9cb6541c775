//! lock-core's lease machinery, metrics, spans and migration on the in-process backend,
//! in one test binary.

mod conveniences;
mod lease;
mod metrics;
mod migration;
mod options;
mod spans;
