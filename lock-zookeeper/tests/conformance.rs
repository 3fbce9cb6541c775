//! The whole conformance suite on ZooKeeper: a standalone server, a 3-member ensemble,
//! and a standalone server over TLS (`zks://`, mutual TLS).
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

/// Over TLS (`zks://`) with a client certificate the server requires: the rules of the
/// connection in `make test` (TLS changes nothing else), every rule in `make chaos`.
mod tls {
    use super::common::ZkFactory;
    use lab::harness::ZkTls;
    conformance::conformance_suite!(
        async {
            let tls = ZkTls::make().await.expect("certificates").client_auth(true);
            ZkFactory::start_tls(tls).await
        },
        short: conformance::CONNECTION_RULES
    );
}
