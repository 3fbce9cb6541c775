//! The fault scenarios on etcd: a single member and a 3-member cluster. Each asserts the
//! guarantee `conformance::chaos::expectation` states for the topology.

mod common;

/// Scenarios on a single member.
mod single {
    use super::common::EtcdFactory;
    conformance::chaos_suite!(
        async { EtcdFactory::start().await },
        short: conformance::chaos::ShortRun::Except(conformance::chaos::FAILOVER_SCENARIOS)
    );
}

/// Scenarios on a 3-member cluster.
mod cluster {
    use super::common::EtcdFactory;
    conformance::chaos_suite!(
        async { EtcdFactory::start_cluster().await },
        short: conformance::chaos::ShortRun::Except(conformance::chaos::FAILOVER_SCENARIOS)
    );
}
