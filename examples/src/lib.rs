//! Shared set-up of the distlock examples: the lock URL taken from the environment.

/// The lock URL from `LOCK_URL`, or `memory://examples`.
pub fn lock_url() -> String {
    std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://examples".to_owned())
}
