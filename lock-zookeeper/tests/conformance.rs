//! The whole conformance suite on ZooKeeper: a standalone server and a 3-member ensemble.
//! Each test starts its own server(s), killed when the test ends.

mod common;

/// Every rule on a standalone server.
mod standalone {
    use super::common::ZkFactory;
    conformance::conformance_suite!(async { ZkFactory::start().await });
}

/// Every rule on a 3-member ensemble (clients know all members).
mod ensemble {
    use super::common::ZkFactory;
    conformance::conformance_suite!(async { ZkFactory::start_ensemble().await });
}
