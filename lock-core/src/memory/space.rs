//! The shared state of a memory space: its slots (holders, fencing counter, FIFO queue,
//! broken owners), the grant and hand-off rules, and the change feed's version.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::backend::{AcquireRequest, Amended};
use crate::error::{Error, Result};
use crate::kind::{Amendment, HoldKind, SemaphoreResize};
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::plumbing::lock_unpoisoned;
use crate::state::LostReason;
use crate::token::{FencingToken, OwnerToken};

use super::MemoryHold;

/// A set of locks shared by the memory clients connected to it.
pub struct MemorySpace {
    pub(super) name: String,
    pub(super) slots: Mutex<HashMap<LockName, Slot>>,
    pub(super) next_waiter: AtomicU64,
    /// Bumped by every write to the space: the change feed of every name.
    pub(super) changed: watch::Sender<u64>,
}

#[derive(Default)]
pub(super) struct Slot {
    /// The holders, oldest first: one, or several where the kind shares.
    pub(super) holders: Vec<Holder>,
    pub(super) fence: u64,
    pub(super) queue: VecDeque<Arc<Waiter>>,
    /// The owner tokens of the last holders broken by an operator, newest last.
    pub(super) broken: VecDeque<OwnerToken>,
}

/// How many broken owner tokens a slot remembers.
const BROKEN_REMEMBERED: usize = 8;

pub(super) struct Holder {
    pub(super) token: OwnerToken,
    pub(super) kind: HoldKind,
    pub(super) fence: u64,
    pub(super) expires_at: Instant,
    pub(super) since: SystemTime,
    /// A candidate's proclaims since the grant.
    pub(super) proclaims: u64,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) token: OwnerToken,
    /// What it asks for; a resize rewrites a permit's number here.
    pub(super) kind: Mutex<HoldKind>,
    pub(super) ttl: Duration,
    pub(super) fence_at_least: Option<FencingToken>,
    pub(super) grant: Mutex<Option<(FencingToken, Instant)>>,
    pub(super) notify: Notify,
}

impl Slot {
    /// Drops expired holders and grants the waiters at the head of the queue that the
    /// holders admit, in order ([`HoldKind::granted_behind`]).
    pub(super) fn settle(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
        while let Some(waiter) = self.queue.front() {
            let kind = waiter.kind();
            if !kind.granted_behind(self.holders.iter().map(|h| &h.kind)) {
                break;
            }
            let Some(waiter) = self.queue.pop_front() else {
                break;
            };
            let fence = self.grant(&waiter.token, &kind, waiter.ttl, waiter.fence_at_least, now);
            *lock_unpoisoned(&waiter.grant) = Some((fence, now));
            waiter.notify.notify_one();
        }
    }

    /// Refuses `kind` beside the kinds already held or queued here.
    pub(super) fn check_kind(&self, kind: &HoldKind, name: &LockName) -> Result<()> {
        let queued: Vec<HoldKind> = self.queue.iter().map(|w| w.kind()).collect();
        self.holders
            .iter()
            .map(|h| &h.kind)
            .chain(&queued)
            .try_for_each(|other| kind.check_beside(other, name))
    }

    /// Rewrites every hold and request here as `resize` says
    /// ([`SemaphoreResize::rewrite`]), all or none.
    pub(super) fn resize(&mut self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        let holders = self
            .holders
            .iter()
            .map(|h| resize.rewrite(&h.kind, Some(h.token.as_str()), name))
            .collect::<Result<Vec<_>>>()?;
        let queued = self
            .queue
            .iter()
            .map(|w| resize.rewrite(&w.kind(), Some(w.token.as_str()), name))
            .collect::<Result<Vec<_>>>()?;
        for (holder, kind) in self.holders.iter_mut().zip(holders) {
            holder.kind = kind;
        }
        for (waiter, kind) in self.queue.iter().zip(queued) {
            *lock_unpoisoned(&waiter.kind) = kind;
        }
        Ok(())
    }

    /// Whether `kind` would be granted now, with nobody queued before it.
    pub(super) fn admits(&self, kind: &HoldKind) -> bool {
        self.queue.is_empty() && kind.granted_behind(self.holders.iter().map(|h| &h.kind))
    }

    pub(super) fn grant(
        &mut self,
        token: &OwnerToken,
        kind: &HoldKind,
        ttl: Duration,
        fence_at_least: Option<FencingToken>,
        now: Instant,
    ) -> FencingToken {
        self.fence = (self.fence + 1).max(fence_at_least.map_or(0, FencingToken::get));
        self.holders.push(Holder {
            token: token.clone(),
            kind: kind.clone(),
            fence: self.fence,
            expires_at: now + ttl,
            since: SystemTime::now(),
            proclaims: 0,
        });
        FencingToken(self.fence)
    }

    /// The live hold of `token`, or why it has none.
    pub(super) fn own(
        &mut self,
        token: &OwnerToken,
        now: Instant,
    ) -> Result<&mut Holder, LostReason> {
        let reason = match self.holders.iter().find(|h| h.token == *token) {
            Some(h) if h.expires_at <= now => LostReason::Expired,
            Some(_) => {
                return self
                    .holders
                    .iter_mut()
                    .find(|h| h.token == *token)
                    .ok_or(LostReason::Vanished)
            }
            None if self.broken.contains(token) => LostReason::Broken,
            None if !self.holders.is_empty() => LostReason::Taken,
            None => LostReason::Vanished,
        };
        Err(reason)
    }

    /// Removes the hold of `token`, if any.
    pub(super) fn drop_hold(&mut self, token: &OwnerToken) {
        self.holders.retain(|h| h.token != *token);
    }

    pub(super) fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }
}

impl Holder {
    /// The holder as an inspection shows it.
    pub(super) fn participant(&self, now: Instant) -> Participant {
        let (value, version) = match &self.kind {
            HoldKind::Candidate { value } => (Some(value.clone()), Some(self.proclaims)),
            _ => (None, None),
        };
        Participant::new(Some(self.token.to_string()))
            .fencing_token(Some(FencingToken(self.fence)))
            .lease_left(Some(self.expires_at.saturating_duration_since(now)))
            .since(Some(self.since))
            .value(value)
            .value_version(version)
            .kind(self.kind.shown())
    }
}

impl Waiter {
    /// What it asks for now.
    pub(super) fn kind(&self) -> HoldKind {
        lock_unpoisoned(&self.kind).clone()
    }
}

impl MemorySpace {
    /// The space called `name`, shared by everyone in this process who asks for it.
    pub fn named(name: &str) -> Arc<MemorySpace> {
        static SPACES: OnceLock<Mutex<HashMap<String, Weak<MemorySpace>>>> = OnceLock::new();
        let mut spaces = lock_unpoisoned(SPACES.get_or_init(Default::default));
        spaces.retain(|_, space| space.strong_count() > 0);
        if let Some(space) = spaces.get(name).and_then(Weak::upgrade) {
            return space;
        }
        let space = Arc::new(MemorySpace {
            name: name.to_owned(),
            slots: Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(1),
            changed: watch::Sender::new(0),
        });
        spaces.insert(name.to_owned(), Arc::downgrade(&space));
        space
    }

    pub(super) fn slots(&self) -> MutexGuard<'_, HashMap<LockName, Slot>> {
        lock_unpoisoned(&self.slots)
    }

    /// Tells the change feeds that the space was written.
    pub(super) fn touch(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    /// Removes the holder of `name` behind its back (as an operator or a clock jump
    /// would). Returns whether there was one.
    pub fn steal(&self, name: &LockName) -> bool {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        let had = !slot.holders.is_empty();
        slot.holders.clear();
        slot.settle(Instant::now());
        drop(slots);
        self.touch();
        had
    }

    /// Removes the (oldest) holder of `name` as an operator breaking it does, remembering
    /// its owner token so that its renewal finds [`LostReason::Broken`].
    pub(super) fn force_release(&self, name: &LockName) -> Option<Participant> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(now);
        if slot.holders.is_empty() {
            return None;
        }
        let holder = slot.holders.remove(0);
        if slot.broken.len() == BROKEN_REMEMBERED {
            slot.broken.pop_front();
        }
        slot.broken.push_back(holder.token.clone());
        slot.settle(now);
        drop(slots);
        self.touch();
        Some(holder.participant(now))
    }

    /// The held names that start with `prefix`, sorted.
    pub(super) fn held_names(&self, prefix: &str) -> Vec<LockName> {
        let now = Instant::now();
        let mut slots = self.slots();
        let mut names: Vec<LockName> = slots
            .iter_mut()
            .filter(|(name, _)| name.as_str().starts_with(prefix))
            .filter_map(|(name, slot)| {
                slot.settle(now);
                (!slot.holders.is_empty()).then(|| name.clone())
            })
            .collect();
        names.sort();
        names
    }

    /// The owner token currently holding `name` (the oldest holder), if any.
    pub fn holder(&self, name: &LockName) -> Option<OwnerToken> {
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(Instant::now());
        slot.holders.first().map(|h| h.token.clone())
    }

    /// How long the hold of `owner` on `name` has left, if it holds.
    pub fn lease_left(&self, name: &LockName, owner: &OwnerToken) -> Option<Duration> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(now);
        let holder = slot.holders.iter().find(|h| &h.token == owner)?;
        Some(holder.expires_at.saturating_duration_since(now))
    }

    /// How many acquirers are queued on `name`.
    pub fn waiters(&self, name: &LockName) -> usize {
        self.slots().get(name).map_or(0, |slot| slot.queue.len())
    }

    /// Names with a live holder or a queued waiter.
    pub fn busy_names(&self) -> Vec<LockName> {
        let now = Instant::now();
        let mut slots = self.slots();
        slots
            .iter_mut()
            .filter_map(|(name, slot)| {
                slot.settle(now);
                (!slot.is_idle()).then(|| name.clone())
            })
            .collect()
    }

    /// Grants `request` if nobody must go first; `Err` for a kind that conflicts with
    /// the name's.
    pub(super) fn try_take(&self, request: &AcquireRequest<'_>) -> Result<Option<FencingToken>> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(request.name.clone()).or_default();
        slot.settle(now);
        slot.check_kind(request.kind, request.name)?;
        let fence = slot.admits(request.kind).then(|| {
            slot.grant(
                request.token,
                request.kind,
                request.ttl,
                request.fence_at_least,
                now,
            )
        });
        drop(slots);
        if fence.is_some() {
            self.touch();
        }
        Ok(fence)
    }

    /// Resizes the semaphore `name` (see [`Slot::resize`]).
    pub(super) fn resize(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Ok(());
        };
        slot.settle(now);
        slot.resize(name, resize)?;
        slot.settle(now);
        drop(slots);
        self.touch();
        Ok(())
    }

    /// Amends `hold`, if it still holds: stores a candidate's value, turns a writer into a
    /// reader in its place (the readers behind it may then be granted), or an upgradeable
    /// reader into a writer (`Pending` until the readers beside it have left).
    pub(super) fn amend(&self, hold: &MemoryHold, amendment: Amendment<'_>) -> Result<Amended> {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(&hold.name) else {
            return Ok(Amended::NotOwner(LostReason::Vanished));
        };
        let holder = match slot.own(&hold.token, now) {
            Ok(holder) => holder,
            Err(reason) => return Ok(Amended::NotOwner(reason)),
        };
        match (amendment, &holder.kind) {
            (Amendment::Proclaim(value), HoldKind::Candidate { .. }) => {
                holder.kind = HoldKind::Candidate {
                    value: value.to_vec(),
                };
                holder.proclaims += 1;
            }
            (Amendment::Downgrade, HoldKind::Write) => holder.kind = HoldKind::Read,
            // Waiters are granted behind the holders' kinds: as a writer, it lets nobody
            // new in; it holds alone once the readers beside it have left.
            (Amendment::Upgrade, HoldKind::Upgradeable) => holder.kind = HoldKind::Write,
            (Amendment::Upgrade, HoldKind::Write) => {
                let alone = slot.holders.len() == 1;
                return Ok(if alone {
                    Amended::Done
                } else {
                    Amended::Pending
                });
            }
            (amendment, kind) => {
                return Err(Error::config(format!(
                    "cannot {} a hold of {}",
                    amendment.label(),
                    kind.describe()
                )))
            }
        }
        slot.settle(now);
        let alone = slot.holders.len() == 1;
        drop(slots);
        self.touch();
        Ok(if alone || amendment != Amendment::Upgrade {
            Amended::Done
        } else {
            Amended::Pending
        })
    }

    /// The holder and waiters of `name`; the token floor is the counter.
    pub(super) fn occupancy(&self, name: &LockName) -> Occupancy {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Occupancy::new(None, Vec::new()).token_floor(Some(FencingToken(0)));
        };
        slot.settle(now);
        let holders = slot.holders.iter().map(|h| h.participant(now)).collect();
        let waiters = slot
            .queue
            .iter()
            .map(|waiter| {
                Participant::new(Some(waiter.token.to_string())).kind(waiter.kind().shown())
            })
            .collect();
        Occupancy::shared(holders, waiters).token_floor(Some(FencingToken(slot.fence)))
    }

    /// Removes a waiter that gave up; releases the lock if it was granted meanwhile.
    pub(super) fn abandon(&self, name: &LockName, waiter: &Waiter) {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return;
        };
        slot.queue.retain(|w| w.id != waiter.id);
        slot.drop_hold(&waiter.token);
        slot.settle(now);
        if slot.is_idle() && slot.fence == 0 {
            slots.remove(name);
        }
        drop(slots);
        self.touch();
    }
}

impl fmt::Debug for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySpace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
