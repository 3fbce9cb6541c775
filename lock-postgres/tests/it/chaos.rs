//! The fault scenarios on PostgreSQL, a server of each test's own. Each asserts the
//! guarantee `lab::chaos::expectation` states for a single durable server.

/// Scenarios on one server.
mod single {
    use testkit::postgres::PostgresFactory;
    lab::chaos_suite!(
        async { PostgresFactory::start().await },
        short: lab::chaos::ShortRun::Except(lab::chaos::OWN_DEPLOYMENT_SCENARIOS)
    );
}

/// The server clock jumps, on a server whose wall clock the harness moves (see
/// `harness::ClockHook`), in `make test` and `make chaos` alike.
mod clock {
    use harness::PostgresOptions;
    use testkit::postgres::PostgresFactory;
    lab::chaos_suite!(
        async { PostgresFactory::start_with(PostgresOptions::default().movable_clock(true)).await },
        scenarios: [server_clock_jump_forward, server_clock_jump_back]
    );
}

/// Leader elections: every client campaigns where the scenarios lock
/// (`lab::chaos::Kinded`). The short plan runs a few scenarios; `make chaos` all.
mod election {
    use testkit::postgres::PostgresFactory;
    lab::chaos_suite!(
        kinded: Election on "postgres",
        async { PostgresFactory::start().await },
        short: lab::chaos::ShortRun::Only(lab::chaos::ELECTION_SHORT_SCENARIOS)
    );
}

/// Semaphores of one permit, in `make chaos`.
mod semaphore {
    lab::chaos_suite!(
        kinded: Semaphore on "postgres",
        async { testkit::postgres::PostgresFactory::start().await },
        short: lab::chaos::ShortRun::Only(&[])
    );
}

/// Read-write locks' writers, in `make chaos`.
mod writer {
    lab::chaos_suite!(
        kinded: Writer on "postgres",
        async { testkit::postgres::PostgresFactory::start().await },
        short: lab::chaos::ShortRun::Only(&[])
    );
}
