//! The fault scenarios on Redis: one server without persistence, RedLock over five
//! independent servers, a primary with two replicas behind three Sentinels (with and
//! without `wait_replicas`), and a cluster of three primaries with a replica each. Each asserts the guarantee `conformance::chaos::expectation`
//! states for the topology: where Redis cannot keep mutual exclusion (data loss, early
//! expiry, RedLock nodes restarted at once), the fence must still turn the stale writer
//! away and the lock must work again afterwards.

mod common;

/// Scenarios on one server.
mod single {
    conformance::chaos_suite!(
        async { crate::common::RedisFactory::single().await },
        short: conformance::chaos::ShortRun::Except(conformance::chaos::FAILOVER_SCENARIOS)
    );
}

/// Scenarios on RedLock with five servers.
mod redlock {
    conformance::chaos_suite!(
        async { crate::common::RedisFactory::redlock(5).await },
        short: conformance::chaos::ShortRun::Except(conformance::chaos::FAILOVER_SCENARIOS)
    );
}

/// Scenarios on a primary with two replicas behind three Sentinels; the partition from
/// the replicas and the split brain run in `make test` (`tests/sentinel.rs` kills the
/// primary there too), the others in `make chaos`.
mod sentinel {
    conformance::chaos_suite!(
        async { crate::common::SentinelFactory::chaos(0).await },
        short: conformance::chaos::ShortRun::Only(&[
            "primary_partitioned_from_replicas",
            "sentinel_split_brain",
        ])
    );
}

/// The same deployment, with grants acknowledged by a replica (`wait_replicas=1`); the
/// partition from the replicas runs in `make test`, the others in `make chaos`.
mod sentinel_wait {
    conformance::chaos_suite!(
        async { crate::common::SentinelFactory::chaos(1).await },
        short: conformance::chaos::ShortRun::Only(&["primary_partitioned_from_replicas"])
    );
}

/// Scenarios on a cluster of three primaries with a replica each, those that need no
/// linked client (see `ClusterFactory`'s `ChaosTarget`): a slot moved while held in `make
/// test` (`tests/cluster.rs` kills a primary there), the primary killed in `make chaos`.
mod cluster {
    use conformance::chaos::{check, runs_now, ShortRun};

    use crate::common::ClusterFactory;

    /// Runs `scenario` on a fresh cluster, in `make test` only if it is the slot move.
    async fn on_a_cluster(scenario: &str) {
        if runs_now(scenario, ShortRun::Only(&["slot_migration_while_held"])) {
            if let Some(target) = ClusterFactory::start().await {
                check(scenario, &target).await;
            }
        }
    }

    /// Fault scenario [`conformance::chaos::primary_killed_while_holding`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn primary_killed_while_holding() {
        on_a_cluster("primary_killed_while_holding").await;
    }

    /// Fault scenario [`conformance::chaos::slot_migration_while_held`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slot_migration_while_held() {
        on_a_cluster("slot_migration_while_held").await;
    }
}
