//! Safety under faults: scenarios that break servers, networks and holders while
//! contenders fight over a lock guarding a [`FencedResource`](conformance::FencedResource),
//! then check what the resource saw.
//!
//! Each scenario has a *victim* (a holder whose client, link or server the fault hits)
//! and healthy *contenders* that keep acquiring, writing and releasing. A victim that
//! loses its lock is also told so (its lost signal); a victim that cannot look (a paused
//! process) writes anyway, and the fence must turn it away. [`ScenarioReport`] holds what
//! the checker found; [`expectation`] says what each backend topology promises, so a
//! test asserts exactly the documented guarantee — no more, no less.
//!
//! The scenarios are listed once, in [`chaos_scenarios!`](crate::chaos_scenarios):
//! [`SCENARIOS`], [`run`], [`expectation`], the tests of
//! [`chaos_suite!`](crate::chaos_suite) and the reliability report's rows all follow it.
//!
//! Layout: [`topology`] (deployments, client links, [`ChaosTarget`]), `expect` (each
//! scenario's promise per topology), `victim` (scenarios around one victim holder, the
//! server clock jumps among them),
//! `waiters` (scenarios around queued waiters: lost release replies, reset links, a
//! crashed head), `failover` (replicated deployments: a primary killed, cut off from its
//! replicas, or split from the watchers), `scenarios` (the others with a choreography of
//! their own), `nemesis`
//! (the random fault mix), `workload` (contenders, recovery, crashes shared by all),
//! `report` (what a run found and how the reliability report stores it).

use std::fmt;
use std::time::Duration;

use conformance::OptionSet;

mod expect;
mod failover;
pub mod matrix;
mod nemesis;
mod primitives;
mod report;
mod scenarios;
mod service;
pub mod topology;
mod victim;
mod waiters;
mod workload;

pub use expect::Expect;
pub use failover::{
    primary_killed_while_holding, primary_partitioned_from_replicas, sentinel_split_brain,
    slot_migration_while_held,
};
pub use nemesis::nemesis;
pub use primitives::{kinded, KindOf, Kinded, Primitive, ELECTION_SHORT_SCENARIOS};
pub use report::{record_row, ReportRow, ScenarioReport};
pub use scenarios::{
    acquire_reply_delayed, cancellation_under_faults, majority_loss, stale_counter_restore,
};
pub use service::{
    leader_service_partitioned, leader_service_paused, leader_service_server_restart,
};
pub use topology::{ChaosTarget, Link, ServerControl, Sides, Switch, Topology};

use harness::WallClock;
pub use victim::{
    early_key_expiry, follower_partition, holder_partitioned, holder_paused_beyond_ttl,
    long_network_delay, member_crash, redlock_restart_delayed, redlock_restart_immediate,
    server_clock_jump_back, server_clock_jump_forward, server_crash_restart,
    server_restart_without_data, stuck_server, CLOCK_STEP,
};
pub use waiters::{
    crashed_head_waiter, release_reply_lost, waiter_connection_reset, waiter_long_connection_reset,
};

/// The fault scenarios, in report order: the one list the scenario names come from.
///
/// Calls `$callback! { $($args)* name, name, ... }` with every scenario (a function of
/// this module, and a promise in `expect`), so that each use of the list (tests,
/// dispatch, report order) is generated from it.
#[doc(hidden)]
#[macro_export]
macro_rules! chaos_scenarios {
    ($($callback:ident)::+ ! { $($args:tt)* }) => {
        $($callback)::+! { $($args)*
            holder_partitioned,
            follower_partition,
            holder_paused_beyond_ttl,
            long_network_delay,
            stuck_server,
            server_crash_restart,
            server_restart_without_data,
            early_key_expiry,
            server_clock_jump_forward,
            server_clock_jump_back,
            acquire_reply_delayed,
            release_reply_lost,
            waiter_connection_reset,
            waiter_long_connection_reset,
            crashed_head_waiter,
            cancellation_under_faults,
            member_crash,
            majority_loss,
            redlock_restart_immediate,
            redlock_restart_delayed,
            stale_counter_restore,
            primary_killed_while_holding,
            primary_partitioned_from_replicas,
            sentinel_split_brain,
            slot_migration_while_held,
            leader_service_partitioned,
            leader_service_paused,
            leader_service_server_restart,
            nemesis,
        }
    };
}

/// [`SCENARIOS`], [`run`] and [`expectation`] from the list.
macro_rules! scenario_table {
    ($($scenario:ident),* $(,)?) => {
        /// The scenarios, by name, in report order.
        pub const SCENARIOS: &[&str] = &[$(stringify!($scenario)),*];

        /// What `topology` promises in `scenario` (a name from [`SCENARIOS`]).
        pub fn expectation(scenario: &str, topology: &Topology) -> Expect {
            match scenario {
                $(stringify!($scenario) => expect::promise(topology, expect::$scenario),)*
                _ => Expect::Safe,
            }
        }

        /// What `target` promises in `scenario`: what its topology promises
        /// ([`expectation`]), unless its servers cannot take the scenario's fault (a clock
        /// jump on servers whose wall clock does not move).
        pub fn target_expectation(scenario: &str, target: &dyn ChaosTarget) -> Expect {
            let expect = expectation(scenario, &target.topology());
            if SERVICE_SCENARIOS.contains(&scenario)
                && matches!(target.primitive(), Some(Primitive::Semaphore | Primitive::Writer))
            {
                return Expect::NotApplicable(
                    "a leader service campaigns in an election; this deployment's clients \
                     take another kind of hold",
                );
            }
            if !CLOCK_SCENARIOS.contains(&scenario) || matches!(expect, Expect::NotApplicable(_)) {
                return expect;
            }
            for server in target.servers() {
                match server.wall_clock() {
                    WallClock::Movable => {}
                    WallClock::Real => return Expect::NotApplicable(
                        "the servers run on the machine's clock (the backend's chaos suite \
                         `clock` starts them on a movable one)",
                    ),
                    WallClock::Fixed(why) => return Expect::NotApplicable(why),
                }
            }
            match (scenario, expect, target.wall_clock_leases()) {
                ("server_clock_jump_forward", Expect::Safe, Some(why)) => Expect::FencedOnly(why),
                (_, expect, _) => expect,
            }
        }

        /// Runs `scenario` (a name from [`SCENARIOS`]) on `target`; `None` if it does
        /// not apply.
        pub async fn run(
            scenario: &str,
            target: &dyn ChaosTarget,
            plan: Plan,
        ) -> Option<ScenarioReport> {
            if let Expect::NotApplicable(_) = target_expectation(scenario, target) {
                return None;
            }
            match scenario {
                $(stringify!($scenario) => {
                    Option::from($scenario(Scene {
                        scenario: stringify!($scenario),
                        target,
                        plan,
                    }).await)
                })*
                _ => None,
            }
        }
    };
}

crate::chaos_scenarios!(scenario_table! {});

/// One run of a scenario: what every scenario function takes.
#[derive(Clone, Copy)]
pub struct Scene<'a> {
    /// The scenario's name (from [`SCENARIOS`]): its lock name and report carry it.
    pub scenario: &'static str,
    /// The deployment it breaks.
    pub target: &'a dyn ChaosTarget,
    /// Its timing.
    pub plan: Plan,
}

impl fmt::Debug for Scene<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scene")
            .field("scenario", &self.scenario)
            .field("target", &self.target.label())
            .field("plan", &self.plan)
            .finish()
    }
}

/// Timing of a scenario run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// TTL of every client.
    pub ttl: Duration,
    /// Recheck of every client.
    pub recheck: Duration,
    /// How long healthy contenders keep cycling.
    pub contend: Duration,
    /// Healthy contenders.
    pub contenders: usize,
    /// How long the nemesis injects faults.
    pub nemesis: Duration,
    /// Seed of the nemesis' random fault schedule.
    pub seed: u64,
}

impl Plan {
    /// The short plan used by `make test`: a few seconds per scenario (four TTLs, and six
    /// seconds past one TTL where that is shorter), the default recheck.
    pub fn short(ttl: Duration) -> Self {
        let busy = (ttl * 4).min(ttl + Duration::from_secs(6));
        Plan {
            ttl,
            recheck: lock_core::LockOptions::default().recheck,
            contend: busy,
            contenders: 2,
            nemesis: busy,
            seed: 1,
        }
    }

    /// The plan of `make chaos`: the nemesis runs `seconds` with `seed`.
    pub fn long(ttl: Duration, seconds: u64, seed: u64) -> Self {
        Plan {
            nemesis: Duration::from_secs(seconds),
            seed,
            ..Plan::short(ttl)
        }
    }

    /// The short plan, or the long one when `CHAOS_LONG=1` (with `CHAOS_SECONDS`,
    /// default 60, and `CHAOS_SEED`, default 1).
    pub fn from_env(ttl: Duration) -> Self {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        if long() {
            Plan::long(
                ttl,
                var("CHAOS_SECONDS").unwrap_or(60),
                var("CHAOS_SEED").unwrap_or(1),
            )
        } else {
            Plan::short(ttl)
        }
    }

    /// [`Plan::from_env`] with the TTL and recheck of the option set `set` on a target
    /// whose shortest TTL is `shortest`.
    pub fn for_set(set: OptionSet, shortest: Duration) -> Self {
        Plan {
            recheck: set.recheck(),
            ..Plan::from_env(set.ttl(shortest))
        }
    }
}

fn long() -> bool {
    conformance::long_plan()
}

/// Which scenarios of a [`chaos_suite!`](crate::chaos_suite) run in the short plan (`make
/// test`); the long plan (`make chaos`) runs them all.
#[derive(Debug, Clone, Copy)]
pub enum ShortRun {
    /// Every scenario.
    All,
    /// Only these.
    Only(&'static [&'static str]),
    /// All but these.
    Except(&'static [&'static str]),
}

/// The scenarios that need a deployment of their own: replicated (and sharded) ones for
/// the failovers, servers on a movable wall clock for the clock jumps
/// ([`CLOCK_SCENARIOS`]). Not applicable elsewhere, so suites of other deployments leave
/// them to the long plan ([`ShortRun::Except`]), where they record that they do not
/// apply, rather than start servers for nothing in `make test`.
pub const OWN_DEPLOYMENT_SCENARIOS: &[&str] = &[
    "primary_killed_while_holding",
    "primary_partitioned_from_replicas",
    "sentinel_split_brain",
    "slot_migration_while_held",
    "server_clock_jump_forward",
    "server_clock_jump_back",
];

/// The scenarios about replication: a follower cut off, a member crashed, a majority
/// lost. A replicated deployment runs only these in the short plan; the others are the
/// same client paths as on a single server, which runs them there.
pub const REPLICATION_SCENARIOS: &[&str] = &["follower_partition", "member_crash", "majority_loss"];

/// The scenarios of the leader service ([`LeaderService`](lock_core::LeaderService)): they
/// campaign in an election, so a deployment whose clients take permits or writers has
/// none.
pub const SERVICE_SCENARIOS: &[&str] = &[
    "leader_service_partitioned",
    "leader_service_paused",
    "leader_service_server_restart",
];

/// The scenarios that step the servers' wall clocks: they apply only where every server
/// runs on a clock the harness moves ([`WallClock::Movable`]).
pub const CLOCK_SCENARIOS: &[&str] = &["server_clock_jump_forward", "server_clock_jump_back"];

/// Whether `scenario` runs now: always in the long plan (`CHAOS_LONG=1`), in the short
/// one as `short` says. Says so when it does not.
///
/// # Panics
/// If `short` names a scenario that is not in [`SCENARIOS`].
pub fn runs_now(scenario: &str, short: ShortRun) -> bool {
    let (ShortRun::Only(listed) | ShortRun::Except(listed)) = short else {
        return true;
    };
    if let Some(unknown) = listed.iter().find(|s| !SCENARIOS.contains(s)) {
        panic!("no fault scenario is called {unknown:?}");
    }
    let runs = long() || matches!(short, ShortRun::Only(_)) == listed.contains(&scenario);
    if !runs {
        eprintln!("[chaos] {scenario} runs on this deployment in `make chaos` only (CHAOS_LONG=1)");
    }
    runs
}

/// Runs `scenario` on `target` with the short TTL and asserts the topology's
/// promise. Prints the report (and appends it as a JSON line to
/// `$CHAOS_REPORT_DIR/<scenario>.jsonl` when that is set); says loudly when the scenario
/// does not apply.
pub async fn check(scenario: &str, target: &dyn ChaosTarget) {
    check_plan(scenario, target, Plan::from_env(target.short_ttl())).await;
}

/// [`check`] under the option set `set`: its TTL, recheck and queue.
pub async fn check_under(scenario: &str, target: &dyn ChaosTarget, set: OptionSet) {
    target.set_queue(set.queue);
    check_plan(scenario, target, Plan::for_set(set, target.short_ttl())).await;
}

async fn check_plan(scenario: &str, target: &dyn ChaosTarget, plan: Plan) {
    let topology = target.topology();
    let expect = target_expectation(scenario, target);
    let report = run(scenario, target, plan).await;
    report::record(scenario, target, &topology, expect, plan, report.as_ref());
    match report {
        None => eprintln!(
            "[chaos] {scenario} does not apply to {}: {expect:?}",
            target.label()
        ),
        Some(report) => {
            eprintln!("[chaos] {report}");
            report.assert_meets(expect);
        }
    }
}
