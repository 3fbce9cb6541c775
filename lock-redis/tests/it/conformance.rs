//! The whole conformance suite against real redis-servers: one server (`redis://`) and
//! RedLock over five independent servers (`redlock://`), and a primary with two replicas
//! behind three Sentinels (`redis+sentinel://`), also with every process on TLS
//! (`rediss+sentinel://`). The tests of each deployment share its servers (started by the
//! first test that needs them, killed when the last one ends), each test with its own
//! clients under a key prefix of its own: no rule restarts, pauses or reconfigures a
//! server.

/// `redis://`: one server.
mod single {
    conformance::conformance_suite!(async { testkit::redis::RedisFactory::shared_single().await });
}

/// `redlock://`: five independent servers.
mod redlock {
    conformance::conformance_suite!(async {
        testkit::redis::RedisFactory::shared_redlock(5).await
    });
}

/// `redis+sentinel://`: a primary with two replicas behind three Sentinels.
mod sentinel {
    conformance::conformance_suite!(async { testkit::redis::SentinelFactory::shared(false).await });
}

/// `rediss+sentinel://`: the same deployment with the Sentinels and the data servers on TLS
/// (clients know only the TLS ports).
/// The rules of the connection in `make test` (TLS changes nothing else), all in `make chaos`.
mod sentinel_tls {
    conformance::conformance_suite!(
        async { testkit::redis::SentinelFactory::shared(true).await },
        short: conformance::CONNECTION_RULES
    );
}
