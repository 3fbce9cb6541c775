//! The fault scenarios on etcd: a single member and a 3-member cluster. Each asserts the
//! guarantee `lab::chaos::expectation` states for the topology.

/// Scenarios on a single member.
mod single {
    use testkit::etcd::EtcdFactory;
    lab::chaos_suite!(
        async { EtcdFactory::start().await },
        short: lab::chaos::ShortRun::Except(lab::chaos::OWN_DEPLOYMENT_SCENARIOS)
    );
}

/// Scenarios on a 3-member cluster: the replication scenarios in `make test`, the others
/// in `make chaos` (the single member runs them in both).
mod cluster {
    use testkit::etcd::EtcdFactory;
    lab::chaos_suite!(
        async { EtcdFactory::start_cluster().await },
        short: lab::chaos::ShortRun::Only(lab::chaos::REPLICATION_SCENARIOS)
    );
}

/// Leader elections on a single member and on a 3-member cluster: every client campaigns
/// where the scenarios lock (`lab::chaos::Kinded`). The short plan runs a few scenarios
/// on the single member; `make chaos` runs them all on both.
mod election {
    mod single {
        use testkit::etcd::EtcdFactory;
        lab::chaos_suite!(
            kinded: Election on "etcd",
            async { EtcdFactory::start().await },
            short: lab::chaos::ShortRun::Only(lab::chaos::ELECTION_SHORT_SCENARIOS)
        );
    }

    mod cluster {
        use testkit::etcd::EtcdFactory;
        lab::chaos_suite!(
            kinded: Election on "etcd-3",
            async { EtcdFactory::start_cluster().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// Semaphores of one permit: every client takes the permit where the scenarios lock
/// (`lab::chaos::Kinded`). `make test` runs them on memory (lab/tests/it/chaos.rs); `make chaos`
/// runs them all on every deployment here.
mod semaphore {
    mod single {
        lab::chaos_suite!(
            kinded: Semaphore on "etcd",
            async { testkit::etcd::EtcdFactory::start().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod cluster {
        lab::chaos_suite!(
            kinded: Semaphore on "etcd-3",
            async { testkit::etcd::EtcdFactory::start_cluster().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// Read-write locks' writers: every client takes the write side where the scenarios lock.
/// `make test` runs them on memory (lab/tests/it/chaos.rs); `make chaos` runs them all.
mod writer {
    mod single {
        lab::chaos_suite!(
            kinded: Writer on "etcd",
            async { testkit::etcd::EtcdFactory::start().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod cluster {
        lab::chaos_suite!(
            kinded: Writer on "etcd-3",
            async { testkit::etcd::EtcdFactory::start_cluster().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// The server clock jumps do not apply to etcd, and the suite records why: a Go program
/// reads the clock without the C library, so no preloaded library moves it (see
/// `harness::ClockHook`).
mod clock {
    use testkit::etcd::EtcdFactory;
    lab::chaos_suite!(
        async { EtcdFactory::start().await },
        scenarios: [server_clock_jump_forward, server_clock_jump_back]
    );
}
