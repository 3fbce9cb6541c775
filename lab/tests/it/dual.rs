//! The dual lock (`dual:<old>|<new>`) against real servers: the whole conformance suite on
//! ZooKeeper -> Redis, ZooKeeper -> RedLock (3 nodes), etcd -> Redis, PostgreSQL -> Redis
//! and ZooKeeper -> PostgreSQL, the fault scenarios with faults on either side (`faults`),
//! the attempts that end before a grant (`retries`), and the advance check with PostgreSQL
//! as the watched side (`check`). The conformance suites and the check share the binary's
//! servers (one ZooKeeper, one Redis, RedLock's three, one etcd, one PostgreSQL), each test
//! under namespaces of its own (a schema on PostgreSQL); the fault scenarios and retries
//! kill and pause servers, so each of those starts its own.
//!
//! The sides are the test kit's backend factories (`testkit::dual`), so the dual
//! deployments steal, crash and list leftovers exactly as each backend's suite does; this
//! crate's library stays free of backend crates.

mod check;
mod faults;
mod retries;

/// Every rule on ZooKeeper -> Redis; the suite's steal removes the new side's key.
mod zk_to_redis {
    conformance::conformance_suite!(async { testkit::dual::shared_zk_redis().await });
}

/// The rules that steal, with the steal on the old side (the ZooKeeper node).
mod zk_to_redis_old_side_stolen {
    use lab::dual::Sides;
    conformance::conformance_suite!(@rules
        async { testkit::dual::shared_zk_redis().await.map(|dual| dual.steal_on(Sides::Old)) };
        lost_signal_on_steal,
        reentrant_release_reports_loss,
        scoped_run_cancels_on_loss,
    );
}

/// Every rule on ZooKeeper -> RedLock over 3 nodes: the rules of the connection in `make
/// test` (the dual logic is ZooKeeper -> Redis's), all in `make chaos`.
mod zk_to_redlock {
    conformance::conformance_suite!(
        async { testkit::dual::shared_zk_redlock().await },
        short: conformance::CONNECTION_RULES
    );
}

/// Every rule on etcd -> Redis.
mod etcd_to_redis {
    conformance::conformance_suite!(async { testkit::dual::shared_etcd_redis().await });
}

/// Every rule on PostgreSQL -> Redis.
mod postgres_to_redis {
    conformance::conformance_suite!(async { testkit::dual::shared_postgres_redis().await });
}

/// Every rule on ZooKeeper -> PostgreSQL: the new side's counter honours the old side's
/// tokens (`fence_at_least`).
mod zk_to_postgres {
    conformance::conformance_suite!(async { testkit::dual::shared_zk_postgres().await });
}
