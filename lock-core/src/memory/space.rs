//! The shared state of a memory space: its slots (holder, fencing counter, FIFO queue,
//! broken owners), the grant and hand-off rules, and the change feed's version.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::backend::{AcquireRequest, HoldKind, Proclaimed};
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
    pub(super) holder: Option<Holder>,
    pub(super) fence: u64,
    pub(super) queue: VecDeque<Arc<Waiter>>,
    /// The owner tokens of the last holders broken by an operator, newest last.
    pub(super) broken: VecDeque<OwnerToken>,
}

/// How many broken owner tokens a slot remembers.
const BROKEN_REMEMBERED: usize = 8;

pub(super) struct Holder {
    pub(super) token: OwnerToken,
    pub(super) expires_at: Instant,
    pub(super) since: SystemTime,
    /// A candidate's value.
    pub(super) value: Option<Vec<u8>>,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) token: OwnerToken,
    pub(super) ttl: Duration,
    pub(super) fence_at_least: Option<FencingToken>,
    pub(super) value: Option<Vec<u8>>,
    pub(super) grant: Mutex<Option<(FencingToken, Instant)>>,
    pub(super) notify: Notify,
}

impl Slot {
    /// Drops an expired holder and hands a free lock to the first waiter.
    pub(super) fn settle(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
        if self.holder.is_none() {
            if let Some(waiter) = self.queue.pop_front() {
                let fence = self.grant(
                    &waiter.token,
                    waiter.ttl,
                    waiter.fence_at_least,
                    waiter.value.clone(),
                    now,
                );
                *lock_unpoisoned(&waiter.grant) = Some((fence, now));
                waiter.notify.notify_one();
            }
        }
    }

    pub(super) fn grant(
        &mut self,
        token: &OwnerToken,
        ttl: Duration,
        fence_at_least: Option<FencingToken>,
        value: Option<Vec<u8>>,
        now: Instant,
    ) -> FencingToken {
        self.fence = (self.fence + 1).max(fence_at_least.map_or(0, FencingToken::get));
        self.holder = Some(Holder {
            token: token.clone(),
            expires_at: now + ttl,
            since: SystemTime::now(),
            value,
        });
        FencingToken(self.fence)
    }

    /// Why `token` does not hold this slot, or `None` if it does.
    pub(super) fn not_owner(&self, token: &OwnerToken, now: Instant) -> Option<LostReason> {
        match &self.holder {
            Some(h) if h.token == *token && h.expires_at > now => None,
            Some(h) if h.token == *token => Some(LostReason::Expired),
            _ if self.broken.contains(token) => Some(LostReason::Broken),
            Some(_) => Some(LostReason::Taken),
            None => Some(LostReason::Vanished),
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }
}

/// The value a hold of `kind` stores: a candidate's.
pub(super) fn candidate_value(kind: &HoldKind) -> Option<Vec<u8>> {
    match kind {
        HoldKind::Candidate { value } => Some(value.clone()),
        HoldKind::Mutex => None,
    }
}

impl Holder {
    /// The holder as an inspection shows it, `fence` being its fencing token.
    pub(super) fn participant(&self, fence: u64, now: Instant) -> Participant {
        Participant::new(Some(self.token.to_string()))
            .fencing_token(Some(FencingToken(fence)))
            .lease_left(Some(self.expires_at.saturating_duration_since(now)))
            .since(Some(self.since))
            .value(self.value.clone())
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
        let had = slot.holder.take().is_some();
        slot.settle(Instant::now());
        drop(slots);
        self.touch();
        had
    }

    /// Removes the holder of `name` as an operator breaking it does, remembering its owner
    /// token so that its renewal finds [`LostReason::Broken`].
    pub(super) fn force_release(&self, name: &LockName) -> Option<Participant> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(now);
        let fence = slot.fence;
        let holder = slot.holder.take()?;
        if slot.broken.len() == BROKEN_REMEMBERED {
            slot.broken.pop_front();
        }
        slot.broken.push_back(holder.token.clone());
        slot.settle(now);
        drop(slots);
        self.touch();
        Some(holder.participant(fence, now))
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
                slot.holder.is_some().then(|| name.clone())
            })
            .collect();
        names.sort();
        names
    }

    /// The owner token currently holding `name`, if any.
    pub fn holder(&self, name: &LockName) -> Option<OwnerToken> {
        let mut slots = self.slots();
        let slot = slots.get_mut(name)?;
        slot.settle(Instant::now());
        slot.holder.as_ref().map(|h| h.token.clone())
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

    pub(super) fn try_take(&self, request: &AcquireRequest<'_>) -> Option<FencingToken> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = slots.entry(request.name.clone()).or_default();
        slot.settle(now);
        let fence = (slot.holder.is_none() && slot.queue.is_empty()).then(|| {
            slot.grant(
                request.token,
                request.ttl,
                request.fence_at_least,
                candidate_value(request.kind),
                now,
            )
        });
        drop(slots);
        if fence.is_some() {
            self.touch();
        }
        fence
    }

    /// Stores `value` as the value of `hold`, if it still holds.
    pub(super) fn proclaim(&self, hold: &MemoryHold, value: &[u8]) -> Proclaimed {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(&hold.name) else {
            return Proclaimed::NotOwner(LostReason::Vanished);
        };
        if let Some(reason) = slot.not_owner(&hold.token, now) {
            return Proclaimed::NotOwner(reason);
        }
        if let Some(holder) = slot.holder.as_mut() {
            holder.value = Some(value.to_vec());
        }
        drop(slots);
        self.touch();
        Proclaimed::Done
    }

    /// The holder and waiters of `name`; the token floor is the counter.
    pub(super) fn occupancy(&self, name: &LockName) -> Occupancy {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return Occupancy::new(None, Vec::new()).token_floor(Some(FencingToken(0)));
        };
        slot.settle(now);
        let holder = slot
            .holder
            .as_ref()
            .map(|holder| holder.participant(slot.fence, now));
        let waiters = slot
            .queue
            .iter()
            .map(|waiter| Participant::new(Some(waiter.token.to_string())))
            .collect();
        Occupancy::new(holder, waiters).token_floor(Some(FencingToken(slot.fence)))
    }

    /// Removes a waiter that gave up; releases the lock if it was granted meanwhile.
    pub(super) fn abandon(&self, name: &LockName, waiter: &Waiter) {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(name) else {
            return;
        };
        slot.queue.retain(|w| w.id != waiter.id);
        if slot
            .holder
            .as_ref()
            .is_some_and(|h| h.token == waiter.token)
        {
            slot.holder = None;
        }
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
