//! The fault scenarios on Redis: one server without persistence, and RedLock over five
//! independent servers. Each asserts the guarantee `conformance::chaos::expectation`
//! states for the topology: where Redis cannot keep mutual exclusion (data loss, early
//! expiry, RedLock nodes restarted at once), the fence must still turn the stale writer
//! away and the lock must work again afterwards.

mod common;

/// Scenarios on one server.
mod single {
    conformance::chaos_suite!(async { crate::common::RedisFactory::single().await });
}

/// Scenarios on RedLock with five servers.
mod redlock {
    conformance::chaos_suite!(async { crate::common::RedisFactory::redlock(5).await });
}
