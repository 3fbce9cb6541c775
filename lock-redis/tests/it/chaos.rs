//! The fault scenarios on Redis: one server without persistence, RedLock over five
//! independent servers, a primary with two replicas behind three Sentinels (with and
//! without `wait_replicas`), and a cluster of three primaries with a replica each. Each asserts the guarantee `lab::chaos::expectation`
//! states for the topology: where Redis cannot keep mutual exclusion (data loss, early
//! expiry, RedLock nodes restarted at once), the fence must still turn the stale writer
//! away and the lock must work again afterwards.

/// Scenarios on one server.
mod single {
    lab::chaos_suite!(
        async { testkit::redis::RedisFactory::single().await },
        short: lab::chaos::ShortRun::Except(lab::chaos::OWN_DEPLOYMENT_SCENARIOS)
    );
}

/// Leader elections: every client campaigns where the scenarios lock
/// (`lab::chaos::Kinded`). The short plan runs a few scenarios on one server; `make
/// chaos` runs them all there, on RedLock and behind Sentinel (its failovers).
mod election {
    mod single {
        lab::chaos_suite!(
            kinded: Election on "redis",
            async { testkit::redis::RedisFactory::single().await },
            short: lab::chaos::ShortRun::Only(lab::chaos::ELECTION_SHORT_SCENARIOS)
        );
    }

    mod redlock {
        lab::chaos_suite!(
            kinded: Election on "redlock-5",
            async { testkit::redis::RedisFactory::redlock(5).await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod sentinel {
        lab::chaos_suite!(
            kinded: Election on "sentinel",
            async { testkit::redis::SentinelFactory::chaos(0).await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// Semaphores of one permit: every client takes the permit where the scenarios lock
/// (`lab::chaos::Kinded`). `make test` runs them on memory (lab/tests/it/chaos.rs); `make chaos`
/// runs them all on one server and behind Sentinel (RedLock grants no semaphores: see
/// `lab::chaos::matrix`).
mod semaphore {
    mod single {
        lab::chaos_suite!(
            kinded: Semaphore on "redis",
            async { testkit::redis::RedisFactory::single().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod sentinel {
        lab::chaos_suite!(
            kinded: Semaphore on "sentinel",
            async { testkit::redis::SentinelFactory::chaos(0).await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// Read-write locks' writers: every client takes the write side where the scenarios lock.
/// `make test` runs them on memory (lab/tests/it/chaos.rs); `make chaos` runs them all where
/// offered (not on RedLock).
mod writer {
    mod single {
        lab::chaos_suite!(
            kinded: Writer on "redis",
            async { testkit::redis::RedisFactory::single().await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }

    mod sentinel {
        lab::chaos_suite!(
            kinded: Writer on "sentinel",
            async { testkit::redis::SentinelFactory::chaos(0).await },
            short: lab::chaos::ShortRun::Only(&[])
        );
    }
}

/// The server clock jumps, on one server whose wall clock the harness moves (see
/// `harness::ClockHook`), in `make test` and `make chaos` alike.
mod clock {
    use harness::RedisOptions;
    lab::chaos_suite!(
        async {
            let options = RedisOptions::default().movable_clock(true);
            testkit::redis::RedisFactory::single_with(options).await
        },
        scenarios: [server_clock_jump_forward, server_clock_jump_back]
    );
}

/// Scenarios on RedLock with five servers.
mod redlock {
    lab::chaos_suite!(
        async { testkit::redis::RedisFactory::redlock(5).await },
        short: lab::chaos::ShortRun::Except(NOT_IN_MAKE_TEST)
    );

    /// The scenarios of other deployments.
    const NOT_IN_MAKE_TEST: &[&str] = &[
        "primary_killed_while_holding",
        "primary_partitioned_from_replicas",
        "sentinel_split_brain",
        "slot_migration_while_held",
        "server_clock_jump_forward",
        "server_clock_jump_back",
    ];
}

/// Scenarios on a primary with two replicas behind three Sentinels; the partition from
/// the replicas and the split brain run in `make test` (`tests/it/sentinel.rs` kills the
/// primary there too), the others in `make chaos`.
mod sentinel {
    lab::chaos_suite!(
        async { testkit::redis::SentinelFactory::chaos(0).await },
        short: lab::chaos::ShortRun::Only(&[
            "primary_partitioned_from_replicas",
            "sentinel_split_brain",
        ])
    );
}

/// The same deployment, with grants acknowledged by a replica (`wait_replicas=1`); the
/// partition from the replicas runs in `make test`, the others in `make chaos`.
mod sentinel_wait {
    lab::chaos_suite!(
        async { testkit::redis::SentinelFactory::chaos(1).await },
        short: lab::chaos::ShortRun::Only(&["primary_partitioned_from_replicas"])
    );
}

/// Scenarios on a cluster of three primaries with a replica each: those that act on
/// servers and keys, and those whose linked client needs only to be cut off or reset (see
/// `ClusterFactory`'s `ChaosTarget`: no proxy stands in a cluster client's path, so the
/// scenarios that delay a link or drop a reply do not run here, and the nemesis skips its
/// delays; nor does a waiter's long reset run: a client locked out gets an authentication
/// error on reconnect, which it takes as final, not as an outage to wait out). A slot moved while
/// held and a partitioned holder run in `make test` (`tests/it/cluster.rs` kills a primary
/// there), the others in `make chaos`.
mod cluster {
    use std::time::Duration;

    use conformance::Factory;
    use lab::chaos::{check, runs_now, ChaosTarget, ShortRun};
    use lock_core::{DistributedLockExt, ErrorKind, LockState};
    use tokio::time::{sleep, Instant};

    use testkit::redis::ClusterFactory;

    /// A linked client's cut takes its hold away (its renewals stop reaching the cluster,
    /// the lock goes to another client) and its heal lets it acquire again: the scenarios
    /// above would pass on a link that did nothing, with no takeover to see.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_linked_client_is_cut_off_and_healed() {
        let Some(target) = ClusterFactory::start().await else {
            return;
        };
        let ttl = Duration::from_secs(1);
        let (linked, link) = target.linked_client(conformance::with_ttl(ttl)).await;
        let other = target.client(conformance::with_ttl(ttl)).await;
        let name = conformance::rules::unique_name("linked");
        let guard = linked.lock(name.as_str()).await.expect("linked acquires");
        link.cut();
        let taken = other
            .lock_timeout(name.as_str(), ttl * 5)
            .await
            .expect("another client takes over from the cut-off holder");
        let deadline = Instant::now() + ttl * 3;
        while !matches!(guard.state(), LockState::Lost(_)) && Instant::now() < deadline {
            sleep(Duration::from_millis(20)).await;
        }
        assert!(
            matches!(guard.state(), LockState::Lost(_)),
            "the cut-off holder's guard says {:?}",
            guard.state()
        );
        taken.release().await.expect("release");
        link.heal();
        // The heal lets the client's user in again in a task of its own: a reconnect that
        // comes first is refused as a bad password, a few milliseconds at most.
        let healing = Instant::now() + Duration::from_secs(5);
        let again = loop {
            match linked
                .lock_timeout(name.as_str(), Duration::from_secs(10))
                .await
            {
                Err(err) if err.kind() == ErrorKind::InvalidConfig && Instant::now() < healing => {
                    sleep(Duration::from_millis(50)).await;
                }
                again => break again.expect("the healed client acquires again"),
            }
        };
        again.release().await.expect("release");
    }

    /// Runs `scenario` on a fresh cluster, in `make test` only if it is listed here.
    async fn on_a_cluster(scenario: &str) {
        const SHORT: &[&str] = &["slot_migration_while_held", "holder_partitioned"];
        if runs_now(scenario, ShortRun::Only(SHORT)) {
            // The scenarios of `make test` kill no primary: they run with the default node
            // timeout, as a busy machine can set off the fast failover by itself.
            let target = if SHORT.contains(&scenario) {
                ClusterFactory::start().await
            } else {
                ClusterFactory::start_for_failover().await
            };
            if let Some(target) = target {
                check(scenario, &target).await;
                eprintln!("[chaos] {scenario}: {}", target.failed_over().await);
            }
        }
    }

    macro_rules! on_a_cluster {
        ($($scenario:ident),* $(,)?) => {$(
            #[doc = concat!("Fault scenario [`lab::chaos::", stringify!($scenario), "`].")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                on_a_cluster(stringify!($scenario)).await;
            }
        )*};
    }

    on_a_cluster!(
        holder_partitioned,
        holder_paused_beyond_ttl,
        stuck_server,
        server_crash_restart,
        server_restart_without_data,
        early_key_expiry,
        waiter_connection_reset,
        crashed_head_waiter,
        cancellation_under_faults,
        stale_counter_restore,
        primary_killed_while_holding,
        slot_migration_while_held,
        nemesis,
    );
}

/// A semaphore's or a writer's rows keep the waiter queue whatever queue class an option
/// set draws: Redis grants the shared kinds only on the queue, so a set with the queue off
/// must not turn every acquire of those rows into a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_kind_rows_keep_the_queue() {
    use conformance::Factory;
    use lab::chaos::{kinded, Primitive};
    use lock_core::{AcquireOptions, LockName};

    for primitive in [Primitive::Semaphore, Primitive::Writer] {
        let Some(rows) = kinded(primitive, testkit::redis::RedisFactory::single().await) else {
            return;
        };
        rows.set_queue(false);
        let client = rows
            .client(conformance::with_ttl(std::time::Duration::from_secs(2)))
            .await;
        let name = LockName::new(format!("queue-kept-{}", uuid::Uuid::new_v4().simple()))
            .expect("a valid name");
        let granted = client.acquire(&name, &AcquireOptions::default()).await;
        let guard = granted
            .unwrap_or_else(|err| panic!("{} on a free name: {err}", primitive.label()))
            .expect("a free name is granted");
        guard.release().await.expect("release");
        client.close().await.expect("close");
    }
}
