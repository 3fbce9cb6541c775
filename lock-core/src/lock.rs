//! The `DistributedLock` trait and its forwarding impls.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::changes::ChangeFeed;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::kind::SemaphoreResize;
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::{AcquireOptions, LockOptions, Wait};

/// A distributed lock service: Redis, ZooKeeper, etcd or the in-memory reference.
///
/// Used as `Arc<dyn DistributedLock>` (see [`crate::connect`]); the convenience methods
/// live in [`DistributedLockExt`](crate::DistributedLockExt).
///
/// # Contract
/// Every implementation honours these rules, each checked against real servers by the
/// conformance function it links to:
/// - a try on a held lock says "not acquired" (`Ok(None)`); a waiter is woken by a push,
///   re-checking at least every `recheck` ([`try_on_held_is_not_acquired`]).
/// - mutual exclusion: while a guard is valid no other owner is granted the lock; K
///   clients × M iterations lose no update ([`mutual_exclusion`]).
/// - fencing tokens strictly increase per name, also after a takeover by expiry
///   ([`fencing_tokens_increase`]).
/// - every hold has a server-side lease: a crashed holder blocks others for at most TTL
///   plus a bound, and its guard is Lost first ([`crashed_holder_blocks_at_most_ttl`]).
/// - automatic renewal (at TTL/3) keeps a lock for as long as the guard lives
///   ([`auto_renewal_keeps_lock`]).
/// - the hold cap (`max_hold`) ends renewal ([`hold_cap_ends_renewal`]).
/// - a TTL chosen per acquire is honoured where `per_lock_ttl` says so, and refused with
///   `Unsupported`, taking nothing, where the lease is the session's
///   ([`per_acquire_ttl_honoured_or_refused`]).
/// - manual renewal: `extend` is owner-checked and atomic, a lapsed lease is Lost,
///   extending it says so ([`manual_mode`]).
/// - the lost signal fires when the lock is taken behind its holder; the release then
///   says `AlreadyLost` ([`lost_signal_on_steal`]).
/// - a wait with a timeout fails close to its deadline with `Error::Timeout`
///   ([`wait_timeout`]).
/// - cancellation safety: an acquire dropped at any await point leaves nothing queued or
///   held ([`cancellation_leaves_nothing`]).
/// - a dropped guard frees the lock promptly, without blocking in `Drop`
///   ([`drop_releases_promptly`]).
/// - waiters are granted in arrival order where the backend claims fairness
///   ([`fifo_when_fair`]).
/// - reentrancy only by explicit owner id ([`reentrancy_by_owner`]).
/// - releasing a reentrant guard of a lost hold says `AlreadyLost`
///   ([`reentrant_release_reports_loss`]).
/// - names are escaped and independent; bad names get `Error::InvalidName`
///   ([`names_are_independent_and_checked`]); a name held as one primitive refuses
///   the others with `Error::Conflict` ([`names_used_as_two_kinds_refused`]).
/// - one client holds 1,000 locks through renewals ([`thousand_locks_one_client`]).
/// - malformed URLs and options get typed errors, never a panic
///   ([`bad_urls_and_options`]).
/// - a scoped run is cancelled when its lock is lost ([`scoped_run_cancels_on_loss`]).
/// - an operator sees the holder and waiters, lists held names by prefix, and breaks a
///   hold: the waiter gets it, the broken guard is Lost with `Broken`
///   ([`operator_inspects_lists_and_breaks`]).
/// - a closed client frees what it held and queued at once, though its runtime ends right
///   after ([`close_frees_everything`]).
/// - a closed client ends its waiting acquires with an error and takes their waiters off
///   the server before `close` returns ([`close_ends_waiting_acquires`]).
/// - a closed client refuses every call with `Error::Closed`, naming the lock, and leaves
///   nothing behind ([`closed_client_refuses_every_call`]).
///
/// Where [`Capabilities::election`] is set, leader elections ([`crate::Election`]) too:
/// - one leader at a time, fenced on terms that strictly increase
///   ([`election_one_leader_at_a_time`]).
/// - the leader's value and term are readable; a proclaim keeps the term
///   ([`election_value_and_proclaim`]).
/// - a resign hands over at once; a stolen leadership is Lost
///   ([`election_resign_hands_over`]).
/// - a leader cut off is Lost before the next one leads, within TTL and a bound
///   ([`election_cut_off_leader_is_replaced`]).
/// - observers see every leader, proclaim and vacancy in order
///   ([`election_observers_see_terms_in_order`]).
/// - abandoned campaigns leave no candidate ([`election_cancellation_leaves_nothing`]).
/// - a leader service runs one term's work at a time across re-campaigns, and resigns
///   on shutdown leaving nothing ([`leader_service_one_term_at_a_time`]); it campaigns
///   again after a lost term, whose work was cancelled first
///   ([`leader_service_requeues_after_loss`]).
///
/// Where [`Capabilities::semaphore`] and [`Capabilities::rwlock`] are set, semaphores
/// ([`crate::Semaphore`]) and read-write locks ([`crate::RwLock`]) too:
/// - never more holders than permits, and all of them used under load
///   ([`semaphore_never_exceeds_permits`]); FIFO by push where fair
///   ([`semaphore_fifo_with_push`]).
/// - a disagreement on the number of permits is `Error::Conflict` and leaves nothing
///   ([`semaphore_permits_disagreement_refused`]).
/// - a permit holder cut off is Lost before its permit is given again
///   ([`semaphore_cut_off_holder_is_replaced`]).
/// - several permits in one hold never over-grant ([`semaphore_many_never_over_grants`]);
///   a big request at the head holds back smaller ones where fair
///   ([`semaphore_many_fifo_big_head`]); requests for n and m never deadlock
///   ([`semaphore_many_no_deadlock`]); tries, timeouts and bad counts behave
///   ([`semaphore_many_try_and_timeout`]); abandoned requests leave nothing
///   ([`semaphore_many_cancellation_leaves_nothing`]). Where
///   [`Capabilities::semaphore_many`] is unset, each is `Error::Unsupported`.
/// - a resize never over-grants, before, during or after it, or is `Error::Unsupported`
///   where [`Capabilities::semaphore_resize`] is unset
///   ([`semaphore_resize_never_over_grants`]).
/// - readers together, never a writer beside anyone
///   ([`rwlock_readers_share_writers_exclude`]); a waiting writer is not overtaken
///   ([`rwlock_writer_not_starved`]); a downgrade has no window
///   ([`rwlock_downgrade_without_window`]); a writer cut off is Lost before the lock
///   is given again ([`rwlock_cut_off_writer_is_replaced`]).
/// - where [`Capabilities::upgradeable`](crate::Capabilities::upgradeable), else a typed
///   `Error::Unsupported`: one upgradeable reader at a time, beside readers
///   ([`rwlock_upgradeable_one_beside_readers`]); no writer between its grant and the end
///   of the writer it becomes ([`rwlock_upgrade_no_writer_between`]); an upgrade waits
///   for the readers beside it, and newcomers wait behind it
///   ([`rwlock_upgrade_waits_for_readers`]); a waiting writer is not overtaken
///   ([`rwlock_writer_not_starved_by_upgradeable`]); abandoned upgrades leave nothing
///   ([`rwlock_upgrade_cancellation_leaves_nothing`]).
/// - abandoned permits, reads and writes leave nothing
///   ([`primitives_cancellation_leaves_nothing`]).
///
/// Multi-locks ([`crate::MultiLock`]) on every backend: no deadlock and all or nothing
/// ([`multilock_all_or_nothing_without_deadlock`]); Lost with any part, nothing kept after a
/// cancellation ([`multilock_lost_part_and_cancellation`]).
///
/// [`try_on_held_is_not_acquired`]: ../conformance/rules/fn.try_on_held_is_not_acquired.html
/// [`mutual_exclusion`]: ../conformance/rules/fn.mutual_exclusion.html
/// [`fencing_tokens_increase`]: ../conformance/rules/fn.fencing_tokens_increase.html
/// [`crashed_holder_blocks_at_most_ttl`]: ../conformance/rules/fn.crashed_holder_blocks_at_most_ttl.html
/// [`auto_renewal_keeps_lock`]: ../conformance/rules/fn.auto_renewal_keeps_lock.html
/// [`hold_cap_ends_renewal`]: ../conformance/rules/fn.hold_cap_ends_renewal.html
/// [`per_acquire_ttl_honoured_or_refused`]: ../conformance/rules/fn.per_acquire_ttl_honoured_or_refused.html
/// [`manual_mode`]: ../conformance/rules/fn.manual_mode.html
/// [`lost_signal_on_steal`]: ../conformance/rules/fn.lost_signal_on_steal.html
/// [`wait_timeout`]: ../conformance/rules/fn.wait_timeout.html
/// [`cancellation_leaves_nothing`]: ../conformance/rules/fn.cancellation_leaves_nothing.html
/// [`drop_releases_promptly`]: ../conformance/rules/fn.drop_releases_promptly.html
/// [`fifo_when_fair`]: ../conformance/rules/fn.fifo_when_fair.html
/// [`reentrancy_by_owner`]: ../conformance/rules/fn.reentrancy_by_owner.html
/// [`reentrant_release_reports_loss`]: ../conformance/rules/fn.reentrant_release_reports_loss.html
/// [`names_are_independent_and_checked`]: ../conformance/rules/fn.names_are_independent_and_checked.html
/// [`names_used_as_two_kinds_refused`]: ../conformance/rules/fn.names_used_as_two_kinds_refused.html
/// [`thousand_locks_one_client`]: ../conformance/rules/fn.thousand_locks_one_client.html
/// [`bad_urls_and_options`]: ../conformance/rules/fn.bad_urls_and_options.html
/// [`scoped_run_cancels_on_loss`]: ../conformance/rules/fn.scoped_run_cancels_on_loss.html
/// [`operator_inspects_lists_and_breaks`]: ../conformance/rules/fn.operator_inspects_lists_and_breaks.html
/// [`close_frees_everything`]: ../conformance/rules/fn.close_frees_everything.html
/// [`close_ends_waiting_acquires`]: ../conformance/rules/fn.close_ends_waiting_acquires.html
/// [`closed_client_refuses_every_call`]: ../conformance/rules/fn.closed_client_refuses_every_call.html
/// [`election_one_leader_at_a_time`]: ../conformance/rules/fn.election_one_leader_at_a_time.html
/// [`election_value_and_proclaim`]: ../conformance/rules/fn.election_value_and_proclaim.html
/// [`election_resign_hands_over`]: ../conformance/rules/fn.election_resign_hands_over.html
/// [`election_cut_off_leader_is_replaced`]: ../conformance/rules/fn.election_cut_off_leader_is_replaced.html
/// [`election_observers_see_terms_in_order`]: ../conformance/rules/fn.election_observers_see_terms_in_order.html
/// [`election_cancellation_leaves_nothing`]: ../conformance/rules/fn.election_cancellation_leaves_nothing.html
/// [`leader_service_one_term_at_a_time`]: ../conformance/rules/fn.leader_service_one_term_at_a_time.html
/// [`leader_service_requeues_after_loss`]: ../conformance/rules/fn.leader_service_requeues_after_loss.html
/// [`semaphore_never_exceeds_permits`]: ../conformance/rules/fn.semaphore_never_exceeds_permits.html
/// [`semaphore_fifo_with_push`]: ../conformance/rules/fn.semaphore_fifo_with_push.html
/// [`semaphore_permits_disagreement_refused`]: ../conformance/rules/fn.semaphore_permits_disagreement_refused.html
/// [`semaphore_cut_off_holder_is_replaced`]: ../conformance/rules/fn.semaphore_cut_off_holder_is_replaced.html
/// [`semaphore_many_never_over_grants`]: ../conformance/rules/fn.semaphore_many_never_over_grants.html
/// [`semaphore_many_fifo_big_head`]: ../conformance/rules/fn.semaphore_many_fifo_big_head.html
/// [`semaphore_many_no_deadlock`]: ../conformance/rules/fn.semaphore_many_no_deadlock.html
/// [`semaphore_many_try_and_timeout`]: ../conformance/rules/fn.semaphore_many_try_and_timeout.html
/// [`semaphore_many_cancellation_leaves_nothing`]: ../conformance/rules/fn.semaphore_many_cancellation_leaves_nothing.html
/// [`semaphore_resize_never_over_grants`]: ../conformance/rules/fn.semaphore_resize_never_over_grants.html
/// [`rwlock_readers_share_writers_exclude`]: ../conformance/rules/fn.rwlock_readers_share_writers_exclude.html
/// [`rwlock_writer_not_starved`]: ../conformance/rules/fn.rwlock_writer_not_starved.html
/// [`rwlock_downgrade_without_window`]: ../conformance/rules/fn.rwlock_downgrade_without_window.html
/// [`rwlock_cut_off_writer_is_replaced`]: ../conformance/rules/fn.rwlock_cut_off_writer_is_replaced.html
/// [`rwlock_upgradeable_one_beside_readers`]: ../conformance/rules/fn.rwlock_upgradeable_one_beside_readers.html
/// [`rwlock_upgrade_no_writer_between`]: ../conformance/rules/fn.rwlock_upgrade_no_writer_between.html
/// [`rwlock_upgrade_waits_for_readers`]: ../conformance/rules/fn.rwlock_upgrade_waits_for_readers.html
/// [`rwlock_writer_not_starved_by_upgradeable`]: ../conformance/rules/fn.rwlock_writer_not_starved_by_upgradeable.html
/// [`rwlock_upgrade_cancellation_leaves_nothing`]: ../conformance/rules/fn.rwlock_upgrade_cancellation_leaves_nothing.html
/// [`primitives_cancellation_leaves_nothing`]: ../conformance/rules/fn.primitives_cancellation_leaves_nothing.html
/// [`multilock_all_or_nothing_without_deadlock`]: ../conformance/rules/fn.multilock_all_or_nothing_without_deadlock.html
/// [`multilock_lost_part_and_cancellation`]: ../conformance/rules/fn.multilock_lost_part_and_cancellation.html
///
/// # Cancellation
/// Dropping an acquire future at any await point leaves nothing queued or held on the
/// server: whatever was created is removed in a background task.
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug + fmt::Display {
    /// Acquires `name` as `options` say.
    ///
    /// Returns `Ok(None)` only for [`Wait::Try`] when another owner holds the lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when a [`Wait::Timeout`] runs out; [`Error::InvalidConfig`] or
    /// [`Error::Unsupported`] for options the backend cannot honour; [`Error::Closed`]
    /// once the client is closed; connection and availability errors from the backend.
    async fn acquire(&self, name: &LockName, options: &AcquireOptions)
        -> Result<Option<LockGuard>>;

    /// What this backend offers.
    fn capabilities(&self) -> Capabilities;

    /// The client-wide defaults.
    fn options(&self) -> &LockOptions;

    /// Who holds `name` (owner token, fencing token, lease left, session and since when,
    /// each where the server keeps it) and who waits for it, in queue order where the
    /// backend queues, as the server shows them at one moment.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a backend that cannot tell (the default); connection
    /// errors.
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        Err(OperatorCall::Inspect(name).unsupported(self.capabilities().backend))
    }

    /// The names that start with `prefix` (`""` for all) and have a holder right now,
    /// sorted.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a backend that cannot tell (the default);
    /// [`Error::InvalidName`] for a prefix no name can start with (a control character,
    /// too long); connection errors.
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        Err(OperatorCall::List(prefix).unsupported(self.capabilities().backend))
    }

    /// Breaks `name`: removes its current hold on the server, whoever holds it, and
    /// returns the holder removed (`None` if nobody held it). An operator's last resort
    /// for a hold whose process is wedged but still renewing.
    ///
    /// The next waiter is granted the lock at once. The broken holder's guard turns
    /// [`LockState::Lost`](crate::LockState::Lost) with [`LostReason::Broken`] at its
    /// next renewal at the latest (a third of its TTL), so a holder that checks its guard
    /// or fences its writes stops; one that does neither overlaps with the next holder
    /// until then. A hold in manual renewal mode learns it at its next `extend` or release
    /// (and is Lost with `Expired` at its validity deadline otherwise). Breaking is not a
    /// release: the holder never agreed to stop.
    ///
    /// [`LostReason::Broken`]: crate::LostReason::Broken
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a backend that cannot (the default); connection errors,
    /// after which the hold may or may not be removed (inspect to know).
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        Err(OperatorCall::Break(name).unsupported(self.capabilities().backend))
    }

    /// Rewrites the number of permits of every hold and request of the semaphore `name`
    /// as `resize` says, in one atomic write on the server: grants count with the new
    /// number from then on. The step of [`Semaphore::resize`](crate::Semaphore::resize)
    /// that commits; alone, a shrink is safe only behind a reservation (see
    /// [`SemaphoreResize::reservation`]). A semaphore's number lives with its holders and
    /// waiters: on an idle name there is nothing to write.
    ///
    /// # Errors
    /// [`Error::Conflict`] as [`SemaphoreResize::rewrite`]; [`Error::InvalidConfig`] for
    /// 0 permits; [`Error::Unsupported`] for a backend whose layout cannot change it
    /// safely (the default), saying why; connection errors, after which the change may or
    /// may not be made (a retry is accepted).
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        let _ = resize;
        Err(OperatorCall::Resize(name).unsupported(self.capabilities().backend))
    }

    /// A feed of server-side changes to `name` from now on (grants, releases, expiries,
    /// proclaimed values), for readers that follow it, as an election's observers do. A
    /// hint to read again, not the state: it may fire for nothing, and may miss changes
    /// across a reconnect, so readers re-read every `recheck` as well. Default: a feed that
    /// never fires.
    ///
    /// # Errors
    /// Connection errors of subscribing.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let _ = name;
        Ok(ChangeFeed::never())
    }

    /// Closes the client, as Curator's `close()` or etcd's `Session.Close()`: releases
    /// what it still holds (its guards turn Lost with `Released`), waits for the releases
    /// and the cleanups of abandoned acquires under way (at most the request timeout),
    /// then ends its session (ZooKeeper) or revokes its lease (etcd), so that nothing it
    /// held or queued outlives it. Call it before the process exits: a runtime that ends
    /// takes the client's background tasks with it, and what they had not done waits for
    /// the server-side expiry. Acquires under way end (their waiters taken off the server
    /// first) and every call after it fails, with [`Error::Closed`] naming the call (an
    /// acquire of any kind, `inspect`, `list`, `force_release`, `changes`, and a guard's
    /// `extend`; a guard's release says the hold is already lost); closing twice is
    /// harmless.
    ///
    /// # Errors
    /// Connection errors of the releases or of ending the session, after everything was
    /// tried; the server-side expiry ends what could not be removed.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

macro_rules! forward_impl {
    ($ty:ty) => {
        #[async_trait]
        impl<L: DistributedLock + ?Sized> DistributedLock for $ty {
            async fn acquire(
                &self,
                name: &LockName,
                options: &AcquireOptions,
            ) -> Result<Option<LockGuard>> {
                (**self).acquire(name, options).await
            }

            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }

            fn options(&self) -> &LockOptions {
                (**self).options()
            }

            async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
                (**self).inspect(name).await
            }

            async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
                (**self).list(prefix).await
            }

            async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
                (**self).force_release(name).await
            }

            async fn resize_semaphore(
                &self,
                name: &LockName,
                resize: &SemaphoreResize<'_>,
            ) -> Result<()> {
                (**self).resize_semaphore(name, resize).await
            }

            async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
                (**self).changes(name).await
            }

            async fn close(&self) -> Result<()> {
                (**self).close().await
            }
        }
    };
}

forward_impl!(Arc<L>);
forward_impl!(Box<L>);

/// An operator call that a lock service may not offer: what the defaults of
/// [`DistributedLock`] and of [`Backend`](crate::raw::backend::Backend) refuse.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OperatorCall<'a> {
    /// [`DistributedLock::inspect`].
    Inspect(&'a LockName),
    /// [`DistributedLock::list`].
    List(&'a str),
    /// [`DistributedLock::force_release`].
    Break(&'a LockName),
    /// [`DistributedLock::resize_semaphore`].
    Resize(&'a LockName),
}

impl OperatorCall<'_> {
    /// The [`Error::Unsupported`] of `backend`, which does not offer this call.
    pub(crate) fn unsupported(self, backend: &'static str) -> Error {
        let operation = match self {
            OperatorCall::Inspect(name) => format!("inspecting `{name}`"),
            OperatorCall::List(prefix) => format!("listing the locks under `{prefix}`"),
            OperatorCall::Break(name) => format!("breaking `{name}`"),
            OperatorCall::Resize(name) => format!("resizing the semaphore `{name}`"),
        };
        Error::unsupported(backend, operation)
    }
}

/// Checks that a wait option is acceptable.
pub(crate) fn check_wait(wait: Wait) -> Result<()> {
    if let Wait::Timeout(timeout) = wait {
        if timeout > crate::durations::MAX_DURATION {
            return Err(Error::config(format!(
                "acquire timeout must be at most one year, got {timeout:?}"
            )));
        }
    }
    Ok(())
}
