//! The whole conformance suite against real redis-servers: one server (`redis://`) and
//! RedLock over five independent servers (`redlock://`), and a primary with two replicas
//! behind three Sentinels (`redis+sentinel://`). Each test starts its own servers.

mod common;

/// `redis://`: one server.
mod single {
    conformance::conformance_suite!(async { crate::common::RedisFactory::single().await });
}

/// `redlock://`: five independent servers.
mod redlock {
    conformance::conformance_suite!(async { crate::common::RedisFactory::redlock(5).await });
}

/// `redis+sentinel://`: a primary with two replicas behind three Sentinels.
mod sentinel {
    conformance::conformance_suite!(async { crate::common::SentinelFactory::start().await });
}
