//! The dual lock: a [`Backend`] made of two backends, the old one taken first, then the
//! new one. [`LeaseClient`](crate::raw::backend::LeaseClient) adds the watchdog, the state machine,
//! reentrancy and drop-release exactly as for a single backend.
//!
//! One side's hold on the acquire path is in `sides.rs`; how the two sides' answers
//! merge into one is in `merge.rs`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::merge::{combine_renewals, merge_sessions, session_change};
use super::sides::{NewSide, OldHold, ReleaseSide};
use super::DUAL_TOKEN_PREFIX;
use crate::backend::{
    AcquireRequest, Acquired, Amended, Backend, BackendRelease, RenewItem, RenewOutcome,
    SessionStatus,
};
use crate::capabilities::Capabilities;
use crate::changes::ChangeFeed;
use crate::erased::{AnyBackend, AnyHold};
use crate::error::{Error, Result};
use crate::kind::{Amendment, SemaphoreResize};
use crate::lease::{validity_deadline, ServerEnd};
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::plumbing::{lock_unpoisoned, Background, CleanupOnDrop};
use crate::state::{LostReason, Side};
use crate::token::OwnerToken;

/// The two backends of a dual lock.
pub(crate) struct DualBackend {
    old: Arc<dyn AnyBackend>,
    new: Arc<dyn AnyBackend>,
    /// The session status of each side (old, new), for the backends that have sessions.
    sessions: [Option<watch::Receiver<SessionStatus>>; 2],
    capabilities: Capabilities,
    /// The side releases left to the background, which closing waits for.
    background: Background,
    /// How long closing waits for them (the sides' request timeout).
    request_timeout: Duration,
}

/// A dual hold: one hold on each side.
pub(crate) struct DualHold {
    old: AnyHold,
    new: AnyHold,
    /// What releasing each side (old, new) found, once it has been done: a retried
    /// release does not release a side twice.
    released: Mutex<[Option<BackendRelease>; 2]>,
    /// Until when each side (old, new) is known to be held: from its grant or its last
    /// renewal. Names the side when the hold expires.
    valid_until: Mutex<[Instant; 2]>,
}

impl fmt::Debug for DualHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DualHold")
            .field("released", &*lock_unpoisoned(&self.released))
            .finish_non_exhaustive()
    }
}

impl DualHold {
    fn side(&self, side: Side) -> &AnyHold {
        match side {
            Side::Old => &self.old,
            Side::New => &self.new,
        }
    }

    /// Moves each side's validity forward for a renewal sent at `sent` that found
    /// `outcomes` (old, new).
    fn renewed(&self, sent: Instant, outcomes: [RenewOutcome; 2]) {
        let mut valid_until = lock_unpoisoned(&self.valid_until);
        for (until, outcome) in valid_until.iter_mut().zip(outcomes) {
            if let RenewOutcome::Renewed { lease } = outcome {
                *until = (*until).max(validity_deadline(sent, lease));
            }
        }
    }
}

impl DualBackend {
    /// A dual lock from `old` to `new`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `new` cannot raise its fencing tokens to the old side's.
    pub(crate) fn new(
        old: Arc<dyn AnyBackend>,
        new: Arc<dyn AnyBackend>,
        request_timeout: Duration,
    ) -> Result<Self> {
        let (o, n) = (old.capabilities(), new.capabilities());
        if !n.fence_at_least {
            return Err(Error::Unsupported {
                backend: n.backend,
                operation: "being the new side of a dual lock (its fencing tokens cannot be \
                            raised above the old side's)"
                    .to_owned(),
            });
        }
        let capabilities = Capabilities::new("dual")
            .fair(o.fair && n.fair)
            .per_lock_ttl(o.per_lock_ttl && n.per_lock_ttl)
            .min_ttl(o.min_ttl.max(n.min_ttl))
            .push_wakeup(o.push_wakeup && n.push_wakeup)
            .durable(o.durable && n.durable)
            .lease(o.lease && n.lease)
            .election(o.election && n.election)
            .semaphore(o.semaphore && n.semaphore)
            .semaphore_many(o.semaphore_many && n.semaphore_many)
            .semaphore_resize(o.semaphore_resize && n.semaphore_resize)
            .rwlock(o.rwlock && n.rwlock)
            .upgradeable(o.upgradeable && n.upgradeable)
            .fencing(n.fencing);
        Ok(DualBackend {
            background: Background::new(),
            request_timeout,
            sessions: [old.session(), new.session()],
            old,
            new,
            capabilities,
        })
    }

    fn side(&self, side: Side) -> &Arc<dyn AnyBackend> {
        match side {
            Side::Old => &self.old,
            Side::New => &self.new,
        }
    }

    /// A release of `won`, acquired on `side` with TTL `ttl`: done in the background (which
    /// closing waits for) unless disarmed.
    fn release_of(
        &self,
        side: Side,
        won: Acquired<AnyHold>,
        ttl: Duration,
    ) -> CleanupOnDrop<ReleaseSide> {
        CleanupOnDrop::new(ReleaseSide {
            backend: Arc::clone(self.side(side)),
            hold: Some(won.hold),
            end: ServerEnd::new(
                won.session,
                validity_deadline(won.requested_at, won.lease),
                ttl,
            ),
            session: self.sessions[side as usize].clone(),
        })
        .tracked_by(&self.background)
    }

    /// Whether the old side's session `epoch` has ended (and its holds with it).
    fn old_session_ended(&self, epoch: u64) -> bool {
        self.sessions[Side::Old as usize]
            .as_ref()
            .is_some_and(|status| status.borrow().has_ended(epoch))
    }

    /// Acquires the new side while holding the old one, renewing the old hold meanwhile
    /// (a wait on the new side may outlast the old side's lease), and giving up the wait
    /// as soon as the old side's session ends.
    async fn acquire_new(&self, request: AcquireRequest<'_>, old: &mut OldHold) -> Result<NewSide> {
        let attempt = self.new.acquire(request);
        tokio::pin!(attempt);
        let mut next_renewal = old.requested_at + request.ttl / 3;
        let mut old_session = self.sessions[Side::Old as usize].clone();
        loop {
            tokio::select! {
                result = &mut attempt => {
                    let old_held =
                        Instant::now() < old.valid_until() && !self.old_session_ended(old.session);
                    return Ok(match result? {
                        Some(won) if old_held => NewSide::Won(won),
                        Some(won) => NewSide::OldLapsed(won),
                        None => NewSide::Refused,
                    });
                }
                Some(()) = session_change(&mut old_session) => {
                    if self.old_session_ended(old.session) {
                        return Ok(NewSide::OldLost);
                    }
                }
                () = sleep_until(next_renewal) => {
                    let Some(hold) = old.release.state_mut().hold.as_ref() else {
                        return Ok(NewSide::OldLost);
                    };
                    let sent = Instant::now();
                    let item = RenewItem { hold, ttl: request.ttl };
                    match self.old.renew(&[item]).await.map(|outcomes| outcomes.first().copied()) {
                        Ok(Some(RenewOutcome::Renewed { lease })) => {
                            old.renewed(sent, lease, request.ttl);
                            next_renewal = sent + request.ttl / 3;
                        }
                        Ok(Some(RenewOutcome::Lost(_))) => return Ok(NewSide::OldLost),
                        _ if Instant::now() >= old.valid_until() => return Ok(NewSide::OldLost),
                        _ => next_renewal = Instant::now() + request.ttl / 10,
                    }
                }
            }
        }
    }

    async fn release_side(&self, side: Side, hold: &DualHold) -> Result<BackendRelease> {
        let index = side as usize;
        if let Some(done) = lock_unpoisoned(&hold.released)[index] {
            return Ok(done);
        }
        let outcome = self.side(side).release(hold.side(side)).await?;
        lock_unpoisoned(&hold.released)[index] = Some(outcome);
        Ok(outcome)
    }
}

#[async_trait]
impl Backend for DualBackend {
    type Hold = DualHold;

    fn capabilities(&self) -> Capabilities {
        self.capabilities.clone()
    }

    /// One attempt: the old side, then the new side. An attempt whose old side runs out
    /// while it waits on the new side gives back what it holds and fails with a retryable
    /// error, so that the lease client starts over with a fresh owner token: the cleanup
    /// of this attempt (the new side's, which may run late) compares only its token, and
    /// must never touch what the next attempt takes.
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<DualHold>>> {
        let token = OwnerToken::from_string(format!("{DUAL_TOKEN_PREFIX}{}", request.token));
        let on_sides = AcquireRequest {
            token: &token,
            fence_at_least: None,
            ..request
        };
        let Some(won_old) = self.old.acquire(on_sides).await? else {
            return Ok(None);
        };
        let (old_token, old_session) = (won_old.fencing_token, won_old.session);
        let mut old = OldHold {
            session: old_session,
            requested_at: won_old.requested_at,
            lease: won_old.lease,
            release: self.release_of(Side::Old, won_old, request.ttl),
        };
        let on_new = AcquireRequest {
            fence_at_least: Some(old_token),
            ..on_sides
        };
        let outcome = self.acquire_new(on_new, &mut old).await;
        let won_new = match outcome {
            Ok(NewSide::Won(won_new)) => won_new,
            // The old side ran out first: give back what is held.
            Ok(lapsed @ (NewSide::OldLapsed(_) | NewSide::OldLost)) => {
                // Under a cleanup guard too: dropped mid-release, it finishes in the
                // background.
                let mut new_release = match lapsed {
                    NewSide::OldLapsed(won_new) => {
                        Some(self.release_of(Side::New, won_new, request.ttl))
                    }
                    _ => None,
                };
                let release_new = async {
                    if let Some(release) = &mut new_release {
                        release.state_mut().release().await;
                    }
                };
                tokio::join!(old.release.state_mut().release(), release_new);
                if !request.wait {
                    return Ok(None);
                }
                return Err(Error::Unavailable {
                    backend: "dual",
                    message: format!(
                        "the old side's hold on `{}` ran out while the new side was being \
                         acquired",
                        request.name
                    ),
                    source: None,
                });
            }
            Ok(NewSide::Refused) => {
                old.release.state_mut().release().await;
                return Ok(None);
            }
            Err(err) => {
                old.release.state_mut().release().await;
                return Err(err);
            }
        };
        let (old_end, new_end) = (
            old.requested_at + old.lease,
            won_new.requested_at + won_new.lease,
        );
        let requested_at = old.requested_at.min(won_new.requested_at);
        let old_valid_until = old.valid_until();
        let old_hold = old.release.disarm().hold.ok_or_else(|| Error::Protocol {
            backend: "dual",
            message: "the old side's hold was released while the new side was won".to_owned(),
            source: None,
        })?;
        Ok(Some(Acquired {
            hold: DualHold {
                old: old_hold,
                new: won_new.hold,
                released: Mutex::new([None, None]),
                valid_until: Mutex::new([
                    old_valid_until,
                    validity_deadline(won_new.requested_at, won_new.lease),
                ]),
            },
            fencing_token: won_new.fencing_token,
            requested_at,
            lease: old_end.min(new_end).saturating_duration_since(requested_at),
            session: old_session + won_new.session,
        }))
    }

    async fn renew(&self, items: &[RenewItem<'_, DualHold>]) -> Result<Vec<RenewOutcome>> {
        let on = |side: Side| -> Vec<RenewItem<'_, AnyHold>> {
            items
                .iter()
                .map(|item| RenewItem {
                    hold: item.hold.side(side),
                    ttl: item.ttl,
                })
                .collect()
        };
        let (old_items, new_items) = (on(Side::Old), on(Side::New));
        let sent = Instant::now();
        let (old, new) = tokio::join!(self.old.renew(&old_items), self.new.renew(&new_items));
        let outcomes = |side: Side, result: Result<Vec<RenewOutcome>>| match result {
            Ok(outcomes) if outcomes.len() == items.len() => Ok(outcomes),
            Ok(_) => Err(Error::Protocol {
                backend: "dual",
                message: format!("the {side} side answered a renewal with the wrong count"),
                source: None,
            }),
            Err(err) => Err(err),
        };
        match (outcomes(Side::Old, old), outcomes(Side::New, new)) {
            (Err(err), Err(_)) => Err(err),
            (old, new) => {
                let undecided = || vec![RenewOutcome::Undecided; items.len()];
                let old = old.unwrap_or_else(|_| undecided());
                let new = new.unwrap_or_else(|_| undecided());
                for ((item, old), new) in items.iter().zip(&old).zip(&new) {
                    item.hold.renewed(sent, [*old, *new]);
                }
                // A hold lost on one side is lost, and its other side must not be freed
                // before its guard says so (that side is what still keeps others out):
                // the lease client releases a lost hold once it is Lost, at once rather
                // than when the guard goes (a session-bound side would block everyone
                // until then).
                Ok(old.into_iter().zip(new).map(combine_renewals).collect())
            }
        }
    }

    fn expired_reason(&self, hold: &DualHold) -> LostReason {
        let [old, new] = *lock_unpoisoned(&hold.valid_until);
        let side = if old <= new { Side::Old } else { Side::New };
        LostReason::on_side(side, LostReason::Expired)
    }

    async fn release(&self, hold: &DualHold) -> Result<BackendRelease> {
        let (old, new) = tokio::join!(
            self.release_side(Side::Old, hold),
            self.release_side(Side::New, hold)
        );
        Ok(match (old?, new?) {
            (BackendRelease::NotOwner(reason), _) => {
                BackendRelease::NotOwner(LostReason::on_side(Side::Old, reason))
            }
            (_, BackendRelease::NotOwner(reason)) => {
                BackendRelease::NotOwner(LostReason::on_side(Side::New, reason))
            }
            (BackendRelease::Released, BackendRelease::Released) => BackendRelease::Released,
        })
    }

    /// The holders: each dual holder as the new side shows it (its fencing token is the
    /// dual guard's, and an election's term), the old-only holders, then the new-only
    /// ones (a semaphore's permits and a lock's readers are several); the old side's
    /// waiters, then the new side's; the new side's token floor, which every later dual
    /// or new-only token exceeds.
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        let (old, new) = tokio::try_join!(self.old.inspect(name), self.new.inspect(name))?;
        let new_holders: Vec<Participant> = new.holders().cloned().collect();
        let is_dual = |holder: &Participant| {
            holder.owner_token.is_some()
                && new_holders
                    .iter()
                    .any(|n| n.owner_token == holder.owner_token)
        };
        let (dual, old_only): (Vec<Participant>, Vec<Participant>) =
            old.holders().cloned().partition(|holder| is_dual(holder));
        let dual_tokens: Vec<_> = dual.iter().map(|d| d.owner_token.clone()).collect();
        let (dual_new, new_only): (Vec<Participant>, Vec<Participant>) = new_holders
            .into_iter()
            .partition(|holder| dual_tokens.contains(&holder.owner_token));
        let holders = dual_new
            .into_iter()
            .chain(old_only)
            .chain(new_only)
            .collect();
        let waiters = old.waiters.into_iter().chain(new.waiters).collect();
        Ok(Occupancy::shared(holders, waiters).token_floor(new.token_floor))
    }

    /// The names held on either side.
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        let (old, new) = tokio::try_join!(self.old.list(prefix), self.new.list(prefix))?;
        let mut names: Vec<LockName> = old.into_iter().chain(new).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Breaks both sides; returns the old side's holder, else the new side's.
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        let (old, new) = tokio::join!(self.old.force_release(name), self.new.force_release(name));
        Ok(old?.or(new?))
    }

    /// The old side is amended first, then the new one, as the acquire went: a side that
    /// is no longer ours ends the amendment (the hold is lost). A downgrade is safe in
    /// either order: the holder reads only once both sides are done. An upgrade steps both
    /// sides each time and is done once both hold alone: each side then excludes its own
    /// clients, so old-only and new-only readers are both gone.
    async fn amend(&self, hold: &DualHold, amendment: Amendment<'_>) -> Result<Amended> {
        let mut pending = false;
        for side in [Side::Old, Side::New] {
            match self.side(side).amend(hold.side(side), amendment).await? {
                Amended::NotOwner(reason) => {
                    return Ok(Amended::NotOwner(LostReason::on_side(side, reason)))
                }
                Amended::Pending => pending = true,
                Amended::Done => {}
            }
        }
        Ok(if pending {
            Amended::Pending
        } else {
            Amended::Done
        })
    }

    /// The old side first, then the new one, as the acquire goes, the reservation as
    /// each side knows it (a dual hold's side token). Retried after a failure in between,
    /// the side already resized accepts the call again.
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        let side_token = resize
            .reservation
            .map(|token| OwnerToken::from_string(format!("{DUAL_TOKEN_PREFIX}{token}")));
        let on_sides = SemaphoreResize {
            reservation: side_token.as_ref(),
            ..*resize
        };
        self.old.resize_semaphore(name, &on_sides).await?;
        self.new.resize_semaphore(name, &on_sides).await
    }

    /// The changes of either side.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let (old, new) = tokio::try_join!(self.old.changes(name), self.new.changes(name))?;
        Ok(old.merge(new))
    }

    /// Waits (at most the request timeout) for the side releases left to the background,
    /// then closes both sides.
    async fn close(&self) -> Result<()> {
        self.background.settle(self.request_timeout).await;
        let (old, new) = tokio::join!(self.old.close(), self.new.close());
        old.and(new)
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        match (self.old.session(), self.new.session()) {
            (None, None) => None,
            (Some(one), None) | (None, Some(one)) => Some(one),
            (Some(old), Some(new)) => Some(merge_sessions(old, new)),
        }
    }
}

impl fmt::Debug for DualBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DualBackend")
            .field("old", &self.old)
            .field("new", &self.new)
            .finish()
    }
}

impl fmt::Display for DualBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dual lock (old: {}, new: {})", self.old, self.new)
    }
}
