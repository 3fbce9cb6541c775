//! The fault scenarios on ZooKeeper: a standalone server and a 3-member ensemble. Each
//! asserts the guarantee `conformance::chaos::expectation` states for the topology.

mod common;

/// Scenarios on a standalone server.
mod standalone {
    use super::common::ZkFactory;
    conformance::chaos_suite!(async { ZkFactory::start().await });
}

/// Scenarios on a 3-member ensemble.
mod ensemble {
    use super::common::ZkFactory;
    conformance::chaos_suite!(async { ZkFactory::start_ensemble().await });
}
