//! The distlock conformance suite, real-server harness, TCP fault proxy and
//! fenced-resource checker.
//!
//! A backend proves itself by implementing [`Factory`] and expanding
//! [`conformance_suite!`] in one of its test files: one `#[tokio::test]` per rule of
//! the contract, each named after the rule in [`rules`].

pub mod chaos;
pub mod curator;
pub mod dual;
pub mod factory;
pub mod fence;
pub mod harness;
pub mod inspection;
pub mod interleavings;
pub mod memory;
pub mod proxy;
pub mod rules;

pub use factory::{connect_patiently, lock_patiently, with_ttl, Crash, Factory};
pub use fence::{FenceClient, FenceReport, FenceServer, FencedResource, Section, StaleToken};

/// The one list of conformance rules, in report order: calls `$callback! { $args... rule,
/// rule, ... }`. [`rules::RULES`], the tests of [`conformance_suite!`] and the checks of the
/// documented lists (the trait's `# Contract`, the README's table) follow it.
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
            manual_mode,
            lost_signal_on_steal,
            wait_timeout,
            cancellation_leaves_nothing,
            drop_releases_promptly,
            fifo_when_fair,
            reentrancy_by_owner,
            reentrant_release_reports_loss,
            names_are_independent_and_checked,
            thousand_locks_one_client,
            bad_urls_and_options,
            scoped_run_cancels_on_loss,
            operator_inspects_lists_and_breaks,
            close_frees_everything,
        }
    };
}

/// Expands to one `#[tokio::test]` per conformance rule for a backend.
///
/// `$factory` is an expression of a future that yields a [`Factory`] (a server may
/// need starting), or an `Option` of one: `None` skips the test (the harness has said
/// loudly that a server binary is missing; under `LOCK_TEST_STRICT=1` it fails
/// instead). The calling crate needs `tokio` (with `macros` and `rt-multi-thread`)
/// among its dev-dependencies.
///
/// ```text
/// conformance::conformance_suite!(async { conformance::memory::MemoryFactory::new() });
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_rules!($crate::conformance_suite! { @rules $factory; });
    };
    (@rules $factory:expr; $($rule:ident),* $(,)?) => {
        $(
            #[doc = concat!("Conformance rule [`conformance::rules::", stringify!($rule), "`].")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $rule() {
                let Some(factory) = $crate::factory::StartedFactory::started($factory.await) else {
                    return;
                };
                $crate::rules::$rule(&factory).await;
            }
        )*
    };
}

/// Expands to one `#[tokio::test]` per fault scenario of [`chaos::SCENARIOS`] for a
/// [`chaos::ChaosTarget`]; each asserts what [`chaos::target_expectation`] promises
/// for the target and says loudly when a scenario does not apply. The tests follow
/// the one list of scenarios, [`chaos_scenarios!`].
///
/// With `short:` a [`chaos::ShortRun`], only some scenarios run in the short plan (`make
/// test`), the others only in the long one (`CHAOS_LONG=1`, `make chaos`): see
/// [`chaos::runs_now`]. With `scenarios: [a, b]`, only those scenarios, in both plans (a
/// deployment that exists for them, e.g. servers on a movable clock).
#[macro_export]
macro_rules! chaos_suite {
    ($target:expr, short: $short:expr) => {
        $crate::chaos_scenarios!($crate::chaos_suite! { @scenarios $target; $short; });
    };
    ($target:expr) => {
        $crate::chaos_suite!($target, short: $crate::chaos::ShortRun::All);
    };
    ($target:expr, scenarios: [$($scenario:ident),* $(,)?]) => {
        $crate::chaos_suite! { @scenarios $target; $crate::chaos::ShortRun::All; $($scenario),* }
    };
    (@scenarios $target:expr; $short:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[doc = concat!("Fault scenario [`conformance::chaos::", stringify!($scenario), "`].")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                if !$crate::chaos::runs_now(stringify!($scenario), $short) {
                    return;
                }
                let Some(target) = $crate::factory::StartedFactory::started($target.await) else {
                    return;
                };
                $crate::chaos::check(stringify!($scenario), &target).await;
            }
        )*
    };
}

/// Expands to one `#[tokio::test]` per interleaving of [`interleavings`] that needs only a
/// [`chaos::ChaosTarget`] (the ones that wrap a backend's protocol half are written per
/// backend, since each opens its backend in its own way).
#[macro_export]
macro_rules! interleavings_suite {
    ($target:expr) => {
        $crate::interleavings_suite!(@checks $target;
            extend_for_keeps_an_auto_renewed_hold,
            ended_hold_released_despite_a_broken_link,
            waiter_outlives_its_session,
        );
    };
    (@checks $target:expr; $($check:ident),* $(,)?) => {
        $(
            #[doc = concat!("Interleaving [`conformance::interleavings::", stringify!($check), "`].")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(target) = $crate::factory::StartedFactory::started($target.await) else {
                    return;
                };
                $crate::interleavings::$check(&target).await;
            }
        )*
    };
}
