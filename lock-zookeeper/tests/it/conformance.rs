//! The whole conformance suite on ZooKeeper: a standalone server, a 3-member ensemble,
//! and a standalone server over TLS (`zks://`, mutual TLS).
//! The tests of each deployment share its servers (started by the first test that needs
//! them, killed when the last one ends), each test with its own clients under a base
//! path of its own: no rule restarts, pauses or reconfigures a server.

/// Every rule on a standalone server.
mod standalone {
    use testkit::zookeeper::ZkFactory;
    conformance::conformance_suite!(async { ZkFactory::shared().await });
}

/// Every rule on a 3-member ensemble (clients know all members).
mod ensemble {
    use testkit::zookeeper::ZkFactory;
    conformance::conformance_suite!(async { ZkFactory::shared_ensemble().await });
}

/// Over TLS (`zks://`) with a client certificate the server requires: the rules of the
/// connection in `make test` (TLS changes nothing else), every rule in `make chaos`.
mod tls {
    use testkit::zookeeper::ZkFactory;
    conformance::conformance_suite!(
        async { ZkFactory::shared_tls().await },
        short: conformance::CONNECTION_RULES
    );
}
