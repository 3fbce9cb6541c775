//! What a backend offers, so callers and the conformance suite know which rules apply.

use std::time::Duration;

/// Where a backend's fencing tokens come from.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencingSource {
    /// A per-name counter incremented atomically with the acquire.
    Counter,
    /// A per-name counter read and written back through a quorum of independent nodes.
    QuorumCounter,
    /// The store's global revision (transaction id) at which the lock's entry was
    /// created: it grows with every write to the store, so a later grant always has a
    /// larger one.
    CreateRevision,
}

/// What a backend offers.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Short backend name, as in errors and metrics (`memory` for the built-in one).
    pub backend: &'static str,
    /// Waiters are granted in arrival (FIFO) order.
    pub fair: bool,
    /// Each acquire may choose its own TTL; `false` means one session-wide lease.
    pub per_lock_ttl: bool,
    /// Shortest TTL the backend accepts.
    pub min_ttl: Duration,
    /// Waiters are woken by a push (pub/sub, watch), not by polling.
    pub push_wakeup: bool,
    /// Holds survive a restart of the lock service.
    pub durable: bool,
    /// A hold whose holder stays alive but stops renewing (hung, cut off) ends on the
    /// server after its TTL: the contract's lease rule. `false` where a hold lasts as
    /// long as its holder's process (OS file locks, which the kernel ends when the
    /// process dies, not when it hangs): the rules about cut-off holders do not apply.
    pub lease: bool,
    /// Where fencing tokens come from.
    pub fencing: FencingSource,
    /// Honours [`AcquireRequest::fence_at_least`](crate::raw::backend::AcquireRequest): it can
    /// grant a fencing token no lower than one given, so it can be the new side of a
    /// dual (migration) lock.
    pub fence_at_least: bool,
    /// Grants [`HoldKind::Candidate`](crate::raw::backend::HoldKind) holds, stores their values
    /// and shows them in inspections: leader elections
    /// ([`Election`](crate::Election)) work on it.
    pub election: bool,
    /// Grants [`HoldKind::Permit`](crate::raw::backend::HoldKind) holds: semaphores
    /// ([`Semaphore`](crate::Semaphore)) work on it.
    pub semaphore: bool,
    /// Grants permit holds of several permits at once
    /// ([`Semaphore::acquire_many`](crate::Semaphore::acquire_many)).
    pub semaphore_many: bool,
    /// Changes the number of permits of a semaphore in use
    /// ([`Semaphore::resize`](crate::Semaphore::resize)); a shrink by more than one
    /// permit also needs [`Capabilities::semaphore_many`].
    pub semaphore_resize: bool,
    /// Grants [`HoldKind::Read`](crate::raw::backend::HoldKind) and `Write` holds and downgrades a
    /// write to a read ([`Amendment::Downgrade`](crate::raw::backend::Amendment)):
    /// read-write locks ([`RwLock`](crate::RwLock)) work on it.
    pub rwlock: bool,
    /// Grants [`HoldKind::Upgradeable`](crate::raw::backend::HoldKind) holds and upgrades
    /// them to writers ([`Amendment::Upgrade`](crate::raw::backend::Amendment)):
    /// [`RwLock::upgradeable_read`](crate::RwLock::upgradeable_read) works on it.
    pub upgradeable: bool,
}

impl Capabilities {
    /// Capabilities with conservative defaults: unfair, per-lock TTL of at least 1 ms,
    /// push wake-up, not durable, leased holds, counter fencing, no fence floor, no elections, no
    /// semaphores (nor several permits per hold, nor resizing), no read-write locks, no
    /// upgradeable readers.
    pub const fn new(backend: &'static str) -> Self {
        Capabilities {
            backend,
            fair: false,
            per_lock_ttl: true,
            min_ttl: Duration::from_millis(1),
            push_wakeup: true,
            durable: false,
            lease: true,
            fencing: FencingSource::Counter,
            fence_at_least: false,
            election: false,
            semaphore: false,
            semaphore_many: false,
            semaphore_resize: false,
            rwlock: false,
            upgradeable: false,
        }
    }

    /// Sets [`Capabilities::fair`].
    pub const fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Sets [`Capabilities::per_lock_ttl`].
    pub const fn per_lock_ttl(mut self, per_lock_ttl: bool) -> Self {
        self.per_lock_ttl = per_lock_ttl;
        self
    }

    /// Sets [`Capabilities::min_ttl`].
    pub const fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Sets [`Capabilities::push_wakeup`].
    pub const fn push_wakeup(mut self, push_wakeup: bool) -> Self {
        self.push_wakeup = push_wakeup;
        self
    }

    /// Sets [`Capabilities::durable`].
    pub const fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Sets [`Capabilities::lease`].
    pub const fn lease(mut self, lease: bool) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`Capabilities::fencing`].
    pub const fn fencing(mut self, fencing: FencingSource) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`Capabilities::election`].
    pub const fn election(mut self, election: bool) -> Self {
        self.election = election;
        self
    }

    /// Sets [`Capabilities::semaphore`].
    pub const fn semaphore(mut self, semaphore: bool) -> Self {
        self.semaphore = semaphore;
        self
    }

    /// Sets [`Capabilities::semaphore_many`].
    pub const fn semaphore_many(mut self, semaphore_many: bool) -> Self {
        self.semaphore_many = semaphore_many;
        self
    }

    /// Sets [`Capabilities::semaphore_resize`].
    pub const fn semaphore_resize(mut self, semaphore_resize: bool) -> Self {
        self.semaphore_resize = semaphore_resize;
        self
    }

    /// Sets [`Capabilities::rwlock`].
    pub const fn rwlock(mut self, rwlock: bool) -> Self {
        self.rwlock = rwlock;
        self
    }

    /// Sets [`Capabilities::upgradeable`].
    pub const fn upgradeable(mut self, upgradeable: bool) -> Self {
        self.upgradeable = upgradeable;
        self
    }

    /// Sets [`Capabilities::fence_at_least`].
    pub const fn fence_at_least(mut self, fence_at_least: bool) -> Self {
        self.fence_at_least = fence_at_least;
        self
    }
}
