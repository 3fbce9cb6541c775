//! The fault scenarios on ZooKeeper: a standalone server, the same over mutual TLS
//! (`zks://`), and a 3-member ensemble. Each
//! asserts the guarantee `lab::chaos::expectation` states for the topology.

/// Scenarios on a standalone server.
mod standalone {
    use testkit::zookeeper::ZkFactory;
    lab::chaos_suite!(
        async { ZkFactory::start().await },
        short: lab::chaos::ShortRun::Except(lab::chaos::OWN_DEPLOYMENT_SCENARIOS)
    );
}

/// Leader elections on a standalone server and on a 3-member ensemble: every client
/// campaigns where the scenarios lock (`lab::chaos::Kinded`). The short plan runs a few
/// scenarios on the standalone server; `make chaos` runs them all on both.
mod election {
    mod standalone {
        use testkit::zookeeper::ZkFactory;
        lab::chaos_suite!(
            kinded: Election on "zookeeper",
            async { ZkFactory::start().await },
            short: lab::chaos::ShortRun::Only(lab::chaos::ELECTION_SHORT_SCENARIOS)
        );
    }

    mod ensemble {
        use testkit::zookeeper::ZkFactory;
        lab::chaos_suite!(
            kinded: Election on "zookeeper-3",
            async { ZkFactory::start_partitionable_ensemble().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// Semaphores of one permit: every client takes the permit where the scenarios lock
/// (`lab::chaos::Kinded`). `make test` runs them on memory (lab/tests/it/chaos.rs); `make chaos`
/// runs them all on every deployment here.
mod semaphore {
    mod standalone {
        lab::chaos_suite!(
            kinded: Semaphore on "zookeeper",
            async { testkit::zookeeper::ZkFactory::start().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod ensemble {
        lab::chaos_suite!(
            kinded: Semaphore on "zookeeper-3",
            async { testkit::zookeeper::ZkFactory::start_partitionable_ensemble().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// Read-write locks' writers: every client takes the write side where the scenarios lock.
/// `make test` runs them on memory (lab/tests/it/chaos.rs); `make chaos` runs them all.
mod writer {
    mod standalone {
        lab::chaos_suite!(
            kinded: Writer on "zookeeper",
            async { testkit::zookeeper::ZkFactory::start().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod ensemble {
        lab::chaos_suite!(
            kinded: Writer on "zookeeper-3",
            async { testkit::zookeeper::ZkFactory::start_partitionable_ensemble().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// The server clock jumps, on a standalone server whose wall clock the harness moves
/// (libfaketime), in `make test` and `make chaos` alike.
mod clock {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use harness::{ClockHook, ClockJump, ZkOptions};
    use testkit::zookeeper::{create_persistent, ZkFactory, BASE};
    use zookeeper_client as zk;

    lab::chaos_suite!(
        async { ZkFactory::start_with(ZkOptions::default().movable_clock(true)).await },
        scenarios: [server_clock_jump_forward, server_clock_jump_back]
    );

    /// The server's wall clock, as the creation time of a fresh node (ms since 1970).
    async fn server_ms(factory: &ZkFactory) -> i64 {
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let path = format!("{BASE}/clock-{}", uuid::Uuid::new_v4().simple());
        let (stat, _) = factory
            .admin()
            .create(&path, &[], &persistent)
            .await
            .expect("create a node");
        stat.ctime
    }

    fn machine_ms() -> i64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        i64::try_from(now.as_millis()).expect("ms")
    }

    /// The scenarios above move the server for real: a node created after a jump carries
    /// the moved time, while the session of the client that watched it all stays alive
    /// (ZooKeeper times sessions on `System.nanoTime`, which the jump leaves alone).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_server_wall_clock_moves_and_sessions_do_not() {
        let options = ZkOptions::default().movable_clock(true);
        let Some(factory) = ZkFactory::start_with(options).await else {
            return;
        };
        create_persistent(factory.admin(), [BASE.to_owned()]).await;
        let off = |factory| async move { server_ms(factory).await - machine_ms() };
        assert!(
            off(&factory).await.abs() < 2_000,
            "unmoved, the machine's clock"
        );
        let step = Duration::from_secs(600);
        let server = factory.servers.members()[0];
        for (jump, expected) in [
            (ClockJump::Forward(step), 600_000),
            (ClockJump::Back(step * 2), -600_000),
        ] {
            server.jump_clock(jump).expect("jump");
            tokio::time::sleep(ClockHook::Libfaketime.lag() + Duration::from_millis(500)).await;
            let moved = off(&factory).await;
            assert!(
                (moved - expected).abs() < 5_000,
                "{jump:?}: the server's clock is {moved} ms off the machine's"
            );
        }
        let state = factory.admin().state();
        assert_eq!(state, zk::SessionState::SyncConnected, "the admin session");
    }
}

/// Scenarios on a 3-member ensemble (a follower can be cut off from its peers).
/// The replication scenarios in `make test`, the others in `make chaos` (the standalone
/// server runs them in both).
mod ensemble {
    use testkit::zookeeper::ZkFactory;
    lab::chaos_suite!(
        async { ZkFactory::start_partitionable_ensemble().await },
        short: lab::chaos::ShortRun::Only(lab::chaos::REPLICATION_SCENARIOS)
    );
}

/// Scenarios on a standalone server that clients reach over mutual TLS (`zks://`, through
/// the fault proxies like the others): the same promises as without TLS. A partition and
/// a crash with restart (a new TLS session) in `make test`, the others in `make chaos`.
mod tls {
    use harness::ZkTls;
    use testkit::zookeeper::ZkFactory;
    lab::chaos_suite!(
        async {
            let tls = ZkTls::make().await.expect("certificates").client_auth(true);
            ZkFactory::start_tls(tls).await
        },
        short: lab::chaos::ShortRun::Only(&["holder_partitioned", "server_crash_restart"])
    );
}
