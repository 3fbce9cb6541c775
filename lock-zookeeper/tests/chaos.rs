//! The fault scenarios on ZooKeeper: a standalone server and a 3-member ensemble. Each
//! asserts the guarantee `conformance::chaos::expectation` states for the topology.

mod common;

/// Scenarios on a standalone server.
mod standalone {
    use super::common::ZkFactory;
    conformance::chaos_suite!(async { ZkFactory::start().await });
}

/// Scenarios on a 3-member ensemble (a follower can be cut off from its peers).
mod ensemble {
    use super::common::ZkFactory;
    conformance::chaos_suite!(async { ZkFactory::start_partitionable_ensemble().await });
}
