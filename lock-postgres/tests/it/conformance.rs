//! The whole conformance suite on PostgreSQL: one server shared by the binary's tests,
//! each factory in a schema of its own (its leftovers are its own tables' rows).

/// Every rule on one server.
mod single {
    use testkit::postgres::PostgresFactory;
    conformance::conformance_suite!(async { PostgresFactory::shared().await });
}

/// Every rule with advisory locks taken beside the table (`advisory_locks=on`).
mod advisory {
    use testkit::postgres::PostgresFactory;
    conformance::conformance_suite!(async {
        PostgresFactory::shared()
            .await
            .map(PostgresFactory::with_advisory_locks)
    });
}
