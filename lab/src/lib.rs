//! distlock's lab: the fault suites that put a backend through real servers and real
//! faults, beyond the contract's rules (those are the `conformance` crate's). The servers,
//! the fault proxy and the Curator holders are the `harness` crate's.
//!
//! - [`chaos`]: fault scenarios around a lock guarding a fenced resource, what each
//!   deployment promises under them, and the reliability report's rows;
//!   [`chaos_suite!`] expands them into tests for a [`chaos::ChaosTarget`].
//! - [`interleavings`]: rare interleavings of the lease machinery, opened on purpose;
//!   [`interleavings_suite!`] expands the ones that need only a target.
//! - [`dual`]: dual deployments (`dual:<old>|<new>`) built from two backends' factories.
//! - [`kinds`]: one name used as two kinds, checked alike on every backend.
//!
//! Backends use the lab as a dev-dependency only (through their suites' macros and the
//! `testkit` deployments); the chaos report of the `tools` crate reads its scenario list.

pub mod chaos;
pub mod dual;
pub mod interleavings;
pub mod kinds;
mod memory;

/// What the lab's macros name from the conformance crate, so that their callers need not
/// depend on it by name.
#[doc(hidden)]
pub mod __private {
    pub use conformance::explore::run_explored;
    pub use conformance::factory::StartedFactory;
}

/// Expands to one test per fault scenario of [`chaos::SCENARIOS`] for a
/// [`chaos::ChaosTarget`], run under the option sets of [`conformance::explore::sets_for`]
/// (one drawn in `make test`, every class in `make chaos`); each asserts what
/// [`chaos::target_expectation`] promises for the target and says loudly when a scenario
/// does not apply. The tests follow
/// the one list of scenarios, [`chaos_scenarios!`].
///
/// With `short:` a [`chaos::ShortRun`], only some scenarios run in the short plan (`make
/// test`), the others only in the long one (`CHAOS_LONG=1`, `make chaos`): see
/// [`chaos::runs_now`]. With `scenarios: [a, b]`, only those scenarios, in both plans (a
/// deployment that exists for them, e.g. servers on a movable clock).
///
/// With `kinded: Primitive on "deployment",` the clients take that primitive's hold
/// ([`chaos::Kinded`]) on the deployment of that name in [`chaos::matrix`]; each test first
/// checks that the matrix has that row ([`chaos::matrix::assert_row`]), so that a row the
/// deployment cannot run fails in `make test` too.
#[macro_export]
macro_rules! chaos_suite {
    (kinded: $primitive:ident on $deployment:literal, $target:expr, short: $short:expr) => {
        $crate::chaos_scenarios!($crate::chaos_suite! { @scenarios
            async {
                $crate::chaos::kinded($crate::chaos::Primitive::$primitive, $target.await)
            };
            $short;
            [$deployment, $crate::chaos::Primitive::$primitive];
        });
    };
    (kinded: $primitive:ident on $deployment:literal, $target:expr) => {
        $crate::chaos_suite!(
            kinded: $primitive on $deployment, $target, short: $crate::chaos::ShortRun::All
        );
    };
    ($target:expr, short: $short:expr) => {
        $crate::chaos_scenarios!($crate::chaos_suite! { @scenarios $target; $short; []; });
    };
    ($target:expr) => {
        $crate::chaos_suite!($target, short: $crate::chaos::ShortRun::All);
    };
    ($target:expr, scenarios: [$($scenario:ident),* $(,)?]) => {
        $crate::chaos_suite! {
            @scenarios $target; $crate::chaos::ShortRun::All; []; $($scenario),*
        }
    };
    (@row []) => {};
    (@row [$deployment:literal, $primitive:expr]) => {
        $crate::chaos::matrix::assert_row($deployment, $primitive);
    };
    (@scenarios $target:expr; $short:expr; $row:tt; $($scenario:ident),* $(,)?) => {
        $(
            #[doc = concat!("Fault scenario [`lab::chaos::", stringify!($scenario), "`].")]
            #[test]
            fn $scenario() {
                $crate::chaos_suite!(@row $row);
                if !$crate::chaos::runs_now(stringify!($scenario), $short) {
                    return;
                }
                $crate::__private::run_explored(
                    concat!(module_path!(), "::", stringify!($scenario)),
                    |set| async move {
                        let Some(target) = $crate::__private::StartedFactory::started($target.await) else {
                            return;
                        };
                        $crate::chaos::check_under(stringify!($scenario), &target, set).await;
                    },
                );
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
            #[doc = concat!("Interleaving [`lab::interleavings::", stringify!($check), "`].")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(target) = $crate::__private::StartedFactory::started($target.await) else {
                    return;
                };
                $crate::interleavings::$check(&target).await;
            }
        )*
    };
}
