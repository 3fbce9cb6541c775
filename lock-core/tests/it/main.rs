//! lock-core's lease machinery, metrics, spans and migration on the in-process backend,
//! in one test binary.

mod conveniences;
mod lease;
mod metrics;
mod migration;
mod options;
mod spans;
mod streams;

/// A client of a fresh in-process space whose name starts with `prefix`.
async fn memory_client(prefix: &str) -> std::sync::Arc<dyn lock_core::DistributedLock> {
    let space = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    lock_core::connect(&format!("memory://{space}"))
        .await
        .expect("connect")
}
