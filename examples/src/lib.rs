//! Shared set-up of the distlock examples: every backend registered, the lock URL taken
//! from the environment.

/// Registers every backend of this workspace in the process-wide registry.
pub fn register_backends() {
    lock_core::raw::register::<lock_redis::RedisBackend>();
    lock_core::raw::register::<lock_zookeeper::ZkBackend>();
    lock_core::raw::register::<lock_etcd::EtcdBackend>();
}

/// The lock URL from `LOCK_URL`, or `memory://examples`.
pub fn lock_url() -> String {
    std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://examples".to_owned())
}
