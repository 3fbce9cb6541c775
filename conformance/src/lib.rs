//! The distlock conformance suite: what a backend author needs to prove a backend.
//!
//! - [`Factory`]: how the suite makes clients of your backend, crashes one, steals a lock
//!   behind its holder's back and lists what is left on the server.
//! - [`conformance_suite!`]: expanded in one of your test files, one test per
//!   rule of the contract, each named after its function in [`rules`].
//! - [`FencedResource`] and [`FenceServer`]: the fenced resource the rules write through,
//!   which turns away stale fencing tokens and reports overlapping sections.
//! - [`inspection`]: `Backend::inspect` checked the same way on every backend that queues.
//! - [`memory::MemoryFactory`]: the reference backend, which passes the whole suite.
//!
//! Real servers, the fault proxy and the fault scenarios are the `lab` crate's, not this
//! one's: a backend needs none of them to run the suite.

pub mod explore;
pub mod factory;
pub mod fence;
pub mod inspection;
pub mod limits;
pub mod memory;
pub mod oracle;
pub mod rules;
pub mod wrap;

pub use explore::{Explored, OptionSet};
pub use factory::{
    connect_patiently, lock_patiently, with_query, with_ttl, Crash, Factory, ServerLease,
};
pub use fence::{FenceClient, FenceReport, FenceServer, FencedResource, Section, StaleToken};

/// Whether the long plan runs (`CHAOS_LONG=1`, as `make chaos` sets it): every rule and
/// every fault scenario on every deployment, where `make test` runs a short form.
pub fn long_plan() -> bool {
    std::env::var("CHAOS_LONG").is_ok_and(|v| v.trim() == "1")
}

/// Whether `rule` runs now on a deployment whose short form is `short`: always in the
/// long plan, in `make test` only if listed. Says so when it does not.
///
/// # Panics
/// If `short` names a rule that is not in [`rules::RULES`].
pub fn runs_now(rule: &str, short: &[&str]) -> bool {
    if let Some(unknown) = short.iter().find(|s| !rules::RULES.contains(s)) {
        panic!("no conformance rule is called {unknown:?}");
    }
    let runs = long_plan() || short.contains(&rule);
    if !runs {
        eprintln!(
            "[conformance] {rule} runs on this deployment in `make chaos` only (CHAOS_LONG=1)"
        );
    }
    runs
}

/// The short form of the suite on a deployment that repeats another's paths (TLS over the
/// same servers, a second new side of a dual lock): the rules that exercise the
/// connection, the session and the pushes; the others are client-side logic the first
/// deployment proves.
pub const CONNECTION_RULES: &[&str] = &[
    "try_on_held_is_not_acquired",
    "mutual_exclusion",
    "fencing_tokens_increase",
    "crashed_holder_blocks_at_most_ttl",
    "lost_signal_on_steal",
    "cancellation_leaves_nothing",
    "drop_releases_promptly",
    "operator_inspects_lists_and_breaks",
    "close_frees_everything",
    "close_ends_waiting_acquires",
    "election_resign_hands_over",
    "election_cut_off_leader_is_replaced",
    "election_observers_see_terms_in_order",
];

/// The one list of conformance rules, in report order: calls `$callback! { $args... rule,
/// rule, ... }`. [`rules::RULES`], the tests of [`conformance_suite!`] and the checks of the
/// documented lists (the trait's `# Contract`, the table of docs/conformance.md) follow it.
#[doc(hidden)]
#[macro_export]
macro_rules! conformance_rules {
    ($($callback:ident)::+ ! { $($args:tt)* }) => {
        $($callback)::+! { $($args)*
            try_on_held_is_not_acquired,
            mutual_exclusion,
            fencing_tokens_increase,
            crashed_holder_blocks_at_most_ttl,
            auto_renewal_keeps_lock,
            hold_cap_ends_renewal,
            per_acquire_ttl_honoured_or_refused,
            manual_mode,
            lost_signal_on_steal,
            wait_timeout,
            cancellation_leaves_nothing,
            drop_releases_promptly,
            fifo_when_fair,
            reentrancy_by_owner,
            reentrant_release_reports_loss,
            names_are_independent_and_checked,
            names_used_as_two_kinds_refused,
            thousand_locks_one_client,
            bad_urls_and_options,
            scoped_run_cancels_on_loss,
            operator_inspects_lists_and_breaks,
            close_frees_everything,
            close_ends_waiting_acquires,
            closed_client_refuses_every_call,
            election_one_leader_at_a_time,
            election_value_and_proclaim,
            election_resign_hands_over,
            election_cut_off_leader_is_replaced,
            election_observers_see_terms_in_order,
            election_cancellation_leaves_nothing,
            leader_service_one_term_at_a_time,
            leader_service_requeues_after_loss,
            semaphore_never_exceeds_permits,
            semaphore_fifo_with_push,
            semaphore_permits_disagreement_refused,
            semaphore_cut_off_holder_is_replaced,
            semaphore_many_never_over_grants,
            semaphore_many_fifo_big_head,
            semaphore_many_no_deadlock,
            semaphore_many_try_and_timeout,
            semaphore_many_cancellation_leaves_nothing,
            semaphore_resize_never_over_grants,
            rwlock_readers_share_writers_exclude,
            rwlock_writer_not_starved,
            rwlock_downgrade_without_window,
            rwlock_cut_off_writer_is_replaced,
            rwlock_upgradeable_one_beside_readers,
            rwlock_upgrade_no_writer_between,
            rwlock_upgrade_waits_for_readers,
            rwlock_writer_not_starved_by_upgradeable,
            rwlock_upgrade_cancellation_leaves_nothing,
            primitives_cancellation_leaves_nothing,
            multilock_all_or_nothing_without_deadlock,
            multilock_lost_part_and_cancellation,
        }
    };
}

/// Expands to one test per conformance rule for a backend.
///
/// Each test runs its rule under the option sets of [`explore::sets_for`] (one drawn from
/// `LOCK_TEST_SEED`, every class in the long plan), each on a runtime of the set's class,
/// through an [`Explored`] factory whose clients the lease [`oracle`] audits.
///
/// `$factory` is an expression of a future that yields a [`Factory`] (a server may
/// need starting), or an `Option` of one: `None` skips the test (the harness has said
/// loudly that a server binary is missing; under `LOCK_TEST_STRICT=1` it fails
/// instead). It is evaluated once per set, inside the set's runtime.
///
/// ```text
/// conformance::conformance_suite!(async { conformance::memory::MemoryFactory::new() });
/// ```
///
/// A deployment that repeats another one's paths (the same servers over TLS, say) may run
/// only some rules in `make test` and the rest in `make chaos`, where every rule runs
/// ([`long_plan`]): `conformance_suite!(factory, short: &["mutual_exclusion", ...])`.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_rules!($crate::conformance_suite! { @rules $factory; });
    };
    ($factory:expr, short: $short:expr) => {
        $crate::conformance_rules!($crate::conformance_suite! { @short $factory; $short; });
    };
    (@short $factory:expr; $short:expr; $($rule:ident),* $(,)?) => {
        $(
            #[doc = concat!("Conformance rule [`conformance::rules::", stringify!($rule), "`].")]
            #[test]
            fn $rule() {
                if !$crate::runs_now(stringify!($rule), $short) {
                    return;
                }
                $crate::conformance_suite!(@run $factory; $rule);
            }
        )*
    };
    (@rules $factory:expr; $($rule:ident),* $(,)?) => {
        $(
            #[doc = concat!("Conformance rule [`conformance::rules::", stringify!($rule), "`].")]
            #[test]
            fn $rule() {
                $crate::conformance_suite!(@run $factory; $rule);
            }
        )*
    };
    (@run $factory:expr; $rule:ident) => {
        $crate::explore::run_explored(
            concat!(module_path!(), "::", stringify!($rule)),
            |set| async move {
                let Some(factory) = $crate::factory::StartedFactory::started($factory.await) else {
                    return;
                };
                let factory = $crate::Explored::under(factory, set);
                $crate::rules::$rule(&factory).await;
                factory.finish().await;
            },
        );
    };
}
