//! The whole conformance suite against real redis-servers: one server (`redis://`) and
//! RedLock over five independent servers (`redlock://`), and a primary with two replicas
//! behind three Sentinels (`redis+sentinel://`), also with every process on TLS
//! (`rediss+sentinel://`). Each test starts its own servers.

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

/// `rediss+sentinel://`: the same deployment with the Sentinels and the data servers on TLS
/// (clients know only the TLS ports).
/// The rules of the connection in `make test` (TLS changes nothing else), all in `make chaos`.
mod sentinel_tls {
    conformance::conformance_suite!(
        async { crate::common::SentinelFactory::start_tls().await },
        short: conformance::CONNECTION_RULES
    );
}
