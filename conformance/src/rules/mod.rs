//! One public async function per rule of the contract. Each takes a [`Factory`] and
//! panics with a message naming the rule when the backend breaks it.
//!
//! Rules use fresh random lock names, so they can share one server and run in parallel.
//!
//! By theme: `exclusion` (mutual exclusion, fencing, crashed holders), `renewal` (holds
//! over time and their loss), `waiting` (timeouts, cancellation, release, fairness),
//! `reentrancy`, `names` (names, many locks, bad URLs and options), `election`,
//! `leader_service`,
//! `semaphore`, `rwlock` (and the cancellation of every primitive), `multi`. Every rule is
//! re-exported here: its path is `conformance::rules::<rule>`.

use std::time::Duration;

use std::future::Future;

use lock_core::{DistributedLock, LockName, LockOptions, LockWatch, LostReason};
use tokio::time::{sleep, timeout, Instant};

use crate::factory::{Crash, Factory};
use crate::with_ttl;

mod election;
mod exclusion;
mod leader_service;
mod multi;
mod names;
mod operations;
mod reentrancy;
mod renewal;
mod rwlock;
mod semaphore;
mod semaphore_many;
mod shutdown;
mod upgrade;
mod waiting;

pub use election::{
    election_cancellation_leaves_nothing, election_cut_off_leader_is_replaced,
    election_observers_see_terms_in_order, election_one_leader_at_a_time,
    election_resign_hands_over, election_value_and_proclaim,
};
pub use exclusion::{
    crashed_holder_blocks_at_most_ttl, fencing_tokens_increase, mutual_exclusion,
    try_on_held_is_not_acquired,
};
pub use leader_service::{leader_service_one_term_at_a_time, leader_service_requeues_after_loss};
pub use multi::{multilock_all_or_nothing_without_deadlock, multilock_lost_part_and_cancellation};
pub use names::{
    bad_urls_and_options, names_are_independent_and_checked, names_used_as_two_kinds_refused,
    thousand_locks_one_client,
};
pub use operations::operator_inspects_lists_and_breaks;
pub use reentrancy::{reentrancy_by_owner, reentrant_release_reports_loss};
pub use renewal::{
    auto_renewal_keeps_lock, hold_cap_ends_renewal, lost_signal_on_steal, manual_mode,
    per_acquire_ttl_honoured_or_refused, scoped_run_cancels_on_loss,
};
pub use rwlock::{
    primitives_cancellation_leaves_nothing, rwlock_cut_off_writer_is_replaced,
    rwlock_downgrade_without_window, rwlock_readers_share_writers_exclude,
    rwlock_writer_not_starved,
};
pub use semaphore::{
    semaphore_cut_off_holder_is_replaced, semaphore_fifo_with_push,
    semaphore_never_exceeds_permits, semaphore_permits_disagreement_refused,
};
pub use semaphore_many::{
    semaphore_many_cancellation_leaves_nothing, semaphore_many_fifo_big_head,
    semaphore_many_never_over_grants, semaphore_many_no_deadlock, semaphore_many_try_and_timeout,
    semaphore_resize_never_over_grants,
};
pub use shutdown::{
    close_ends_waiting_acquires, close_frees_everything, closed_client_refuses_every_call,
};
pub use upgrade::{
    rwlock_upgrade_cancellation_leaves_nothing, rwlock_upgrade_no_writer_between,
    rwlock_upgrade_waits_for_readers, rwlock_upgradeable_one_beside_readers,
    rwlock_writer_not_starved_by_upgradeable,
};
pub use waiting::{
    cancellation_leaves_nothing, drop_releases_promptly, fifo_when_fair, wait_timeout,
};

/// [`RULES`] from the one list, [`conformance_rules!`](crate::conformance_rules).
macro_rules! rule_names {
    ($($rule:ident),* $(,)?) => {
        /// The rules, by name, in report order.
        pub const RULES: &[&str] = &[$(stringify!($rule)),*];
    };
}
crate::conformance_rules!(rule_names! {});

/// Generous bound for "promptly": pushes, background releases and renewals must act
/// well within it, while a polling loop or a wait for the TTL would not.
const PROMPT: Duration = Duration::from_secs(3);

/// A fresh lock name for one rule.
pub fn unique_name(rule: &str) -> LockName {
    let name = format!("conformance/{rule}/{}", uuid::Uuid::new_v4().simple());
    LockName::new(name).expect("generated names are valid")
}

/// Options whose recheck is long, so only a push can make a waiter act promptly.
fn push_only_options() -> LockOptions {
    let mut options = LockOptions::default();
    options.recheck = Duration::from_secs(20);
    options
}

/// Waits (up to 10 s) until `factory` finds nothing left on its servers for `names`;
/// panics naming `rule` and what is left otherwise.
pub async fn eventually_empty(factory: &dyn Factory, names: &[LockName], rule: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = factory.leftovers(names).await;
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "[{rule}] {}: state left on the server after 10 s: {left:?}",
            factory.label()
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// The primitive `made` by its constructor, or `None` (said loudly) when the backend does
/// not offer it: the rule `rule` does not apply there. Any other error fails the rule.
pub(crate) fn offered<T>(made: lock_core::Result<T>, rule: &str) -> Option<T> {
    match made {
        Ok(primitive) => Some(primitive),
        Err(err) if err.kind() == lock_core::ErrorKind::Unsupported => {
            eprintln!("[conformance] {rule}: {err}; the rule does not apply");
            None
        }
        Err(err) => panic!("[{rule}] making the primitive: {err}"),
    }
}

/// Whether the rule `rule`, about holders cut off while alive, applies to `factory`'s
/// backend: its holds end by a lease ([`Capabilities::lease`](lock_core::Capabilities)),
/// not only with their holder's process (said loudly when not).
pub(crate) async fn leased(factory: &dyn Factory, rule: &str) -> bool {
    let client = factory.client(LockOptions::default()).await;
    let leased = client.capabilities().lease;
    if !leased {
        eprintln!(
            "[conformance] {rule}: {} holds last as long as their process, not a lease; \
             the rule does not apply",
            factory.label()
        );
    }
    leased
}

/// Waits (at most 5 s) until `name` shows at least `n` waiters on `client`.
pub(crate) async fn waiters_reach(client: &dyn DistributedLock, name: &LockName, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting = client.inspect(name).await.map_or(0, |o| o.waiters.len());
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {n} waiters never showed ({waiting})"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Cuts off (`crash`) the holder whose guard `watch` follows, then takes its place with
/// `next`: `next` must succeed within `ttl` plus [`PROMPT`], and the cut-off guard must
/// have turned Lost (expired, or its session did) no later than that. Returns what `next`
/// took.
pub(crate) async fn cut_off_then_replaced<T>(
    mut watch: LockWatch,
    crash: &dyn Crash,
    ttl: Duration,
    next: impl Future<Output = T>,
) -> T {
    let lost_at = tokio::spawn(async move {
        let reason = watch.lost().await;
        (reason, Instant::now())
    });
    crash.crash().await;
    let crashed_at = Instant::now();
    let taken = next.await;
    let taken_at = Instant::now();
    let waited = taken_at - crashed_at;
    assert!(
        waited <= ttl + PROMPT,
        "the takeover took {waited:?}, more than TTL {ttl:?} + {PROMPT:?}"
    );
    let (reason, lost_at) = timeout(PROMPT, lost_at)
        .await
        .expect("the cut-off holder turns Lost")
        .expect("watch task");
    assert!(
        lost_at <= taken_at,
        "the cut-off holder turned Lost {:?} after the next one took over",
        lost_at - taken_at
    );
    assert!(
        matches!(
            reason.without_side(),
            LostReason::Expired | LostReason::SessionExpired
        ),
        "unexpected reason {reason:?}"
    );
    taken
}
