//! The process-wide [`Registry`]: the one that [`connect`] and `distlock::connect` read and
//! [`raw::register`](crate::raw::driver::register) writes. It starts with `memory://` and the dual
//! lock's `dual:` URLs; the `distlock` crate adds the backends compiled into it.

use std::sync::{Arc, OnceLock};

use crate::driver::{Connect, Driver};
use crate::error::Result;
use crate::lock::DistributedLock;
use crate::memory::MemoryBackend;
use crate::options::LockOptionsBuilder;
use crate::registry::Registry;

/// The process-wide registry.
pub fn registry() -> &'static Registry {
    static GLOBAL: OnceLock<Registry> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let registry = Registry::new();
        registry.register(Driver::of::<MemoryBackend>());
        crate::migration::register_dual(&registry);
        registry
    })
}

/// Registers backend `B` in the process-wide [`registry`], so that [`connect`] (and
/// `distlock::connect`) serve its schemes.
pub fn register<B: Connect>() {
    registry().register(Driver::of::<B>());
}

/// Builds a client for `url` from the process-wide [`registry`]: `memory://`, `dual:` and
/// the backends registered with [`raw::register`](crate::raw::driver::register). Applications
/// use `distlock::connect`, the same registry with every backend compiled into the
/// `distlock` crate.
///
/// # Errors
/// See [`Registry::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    registry().connect(url).await
}

/// As [`connect`], with the lock options set in `options` winning over the URL's.
///
/// # Errors
/// See [`Registry::connect`].
pub async fn connect_with(
    url: &str,
    options: &LockOptionsBuilder,
) -> Result<Arc<dyn DistributedLock>> {
    registry().connect_with(url, options).await
}
