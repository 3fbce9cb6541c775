//! The fault scenarios on ZooKeeper: a standalone server, the same over mutual TLS
//! (`zks://`), and a 3-member ensemble. Each
//! asserts the guarantee `conformance::chaos::expectation` states for the topology.

mod common;

/// Scenarios on a standalone server.
mod standalone {
    use super::common::ZkFactory;
    conformance::chaos_suite!(
        async { ZkFactory::start().await },
        short: conformance::chaos::ShortRun::Except(conformance::chaos::FAILOVER_SCENARIOS)
    );
}

/// Scenarios on a 3-member ensemble (a follower can be cut off from its peers).
mod ensemble {
    use super::common::ZkFactory;
    conformance::chaos_suite!(
        async { ZkFactory::start_partitionable_ensemble().await },
        short: conformance::chaos::ShortRun::Except(conformance::chaos::FAILOVER_SCENARIOS)
    );
}

/// Scenarios on a standalone server that clients reach over mutual TLS (`zks://`, through
/// the fault proxies like the others): the same promises as without TLS. A partition and
/// a crash with restart (a new TLS session) in `make test`, the others in `make chaos`.
mod tls {
    use super::common::ZkFactory;
    use conformance::harness::ZkTls;
    conformance::chaos_suite!(
        async {
            let tls = ZkTls::make().await.expect("certificates").client_auth(true);
            ZkFactory::start_tls(tls).await
        },
        short: conformance::chaos::ShortRun::Only(&["holder_partitioned", "server_crash_restart"])
    );
}
