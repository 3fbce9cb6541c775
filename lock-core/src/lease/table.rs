//! The table of tracked holds: each hold's entry (state, lease, renewal mark, guard
//! count) and the reentrancy index.

use super::*;

/// One tracked hold.
pub(super) struct Entry<H> {
    pub(super) info: Arc<HoldInfo>,
    /// The hold's metrics, also its [`HoldInfo::observer`].
    pub(super) metrics: Arc<HoldMetrics>,
    pub(super) hold: Arc<H>,
    pub(super) ttl: Duration,
    pub(super) renewal: RenewalMode,
    pub(super) cap_at: Option<Instant>,
    pub(super) session: u64,
    pub(super) owner: Option<OwnerId>,
    /// Guards sharing this hold (reentrancy).
    pub(super) refs: usize,
    /// When the watchdog renews next: the plan, or a retry after a failed renewal.
    pub(super) renew_due: Instant,
    /// When the watchdog planned to renew, from the last successful renewal (or the
    /// grant): the renewal lag is measured against it, not against the retries.
    pub(super) renew_planned: Instant,
    /// The last renewal attempt failed.
    pub(super) renew_failing: bool,
    /// The server copy was already released (hold cap).
    pub(super) server_released: bool,
    /// A renewal of this hold (batched or an extend) is in flight. Renewals of one hold
    /// are serialized, so the reply handled last is the one the server applied last.
    pub(super) renewing: bool,
}

impl<H> Entry<H> {
    /// The TTL to ask for now: the hold's TTL, cut at the hold cap.
    pub(super) fn effective_ttl(&self, wanted: Duration, now: Instant) -> Option<Duration> {
        match self.cap_at {
            Some(cap) if cap <= now => None,
            Some(cap) => Some(wanted.min(cap - now)),
            None => Some(wanted),
        }
    }

    /// Records a successful renewal sent at `requested_at` that granted `lease`; the next
    /// one is planned from that lease (an extension may grant another than the TTL).
    pub(super) fn renewed(
        &mut self,
        requested_at: Instant,
        lease: Duration,
        session_suspended: bool,
    ) {
        self.info
            .valid_until
            .store(validity_deadline(requested_at, lease));
        self.renew_planned = requested_at + lease / 3;
        self.renew_due = self.renew_planned;
        self.renew_failing = false;
        self.refresh_state(session_suspended);
    }

    /// Records a renewal that could not be done: Suspect, and retried soon.
    pub(super) fn renewal_failed(&mut self, session_suspended: bool) {
        self.renew_failing = true;
        self.renew_due = Instant::now() + (self.ttl / 10).max(Duration::from_millis(10));
        self.refresh_state(session_suspended);
    }

    /// When the keeper must next look at this hold, whose deadline is `valid_until`:
    /// [`Attention::Due`] when its automatic renewal is due within a quarter of its TTL.
    ///
    /// A batch starts when one hold of its group is overdue, and takes every hold of the
    /// group due within that quarter, renewed early rather than in a call of its own. As
    /// a quarter is more than half the renewal interval (a third), holds taken at
    /// different times join one batch per interval after a round. A retry after a failed
    /// renewal waits for its time, or it would follow at once.
    pub(super) fn attention(&self, valid_until: Instant, now: Instant) -> Attention {
        let mut at = valid_until;
        if let Some(cap) = self.cap_at {
            at = at.min(cap);
        }
        if self.renewal == RenewalMode::Auto {
            let early = if self.renew_failing {
                Duration::ZERO
            } else {
                self.ttl / 4
            };
            if self.renew_due <= now {
                return Attention::Due { at, overdue: true };
            }
            if self.renew_due <= now + early {
                let at = at.min(self.renew_due);
                return Attention::Due { at, overdue: false };
            }
            at = at.min(self.renew_due);
        }
        Attention::At(at)
    }

    pub(super) fn refresh_state(&self, session_suspended: bool) {
        let next = if self.renew_failing || session_suspended {
            LockState::Suspect
        } else {
            LockState::Held
        };
        self.info.transition(next);
    }

    pub(super) fn lost_error(&self) -> Option<Error> {
        match self.info.state() {
            LockState::Lost(reason) => Some(Error::Lost {
                name: self.info.name.to_string(),
                reason,
            }),
            _ => None,
        }
    }
}

/// See [`Entry::attention`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Attention {
    /// Renew in a batch: now if `overdue`, else with an overdue hold of its group; if that
    /// cannot start, look again at `at` at the latest.
    Due { at: Instant, overdue: bool },
    /// Nothing to do before this instant.
    At(Instant),
}

/// A tracked hold and when it ends on the server by itself.
#[derive(Debug, Clone)]
pub(super) struct HoldEnd {
    /// The hold it is about.
    pub(super) info: Arc<HoldInfo>,
    pub(super) server: ServerEnd,
}

impl<H> Entry<H> {
    /// Marks the hold as ended on the client (the caller made its state Lost), to be
    /// released on the server in the background: the server may still keep it, or part
    /// of it (the side of a dual lock that was not lost).
    pub(super) fn end(&mut self) -> (Arc<H>, HoldEnd) {
        self.server_released = true;
        (Arc::clone(&self.hold), HoldEnd::of(self))
    }
}

impl HoldEnd {
    pub(super) fn of<H>(entry: &Entry<H>) -> Self {
        HoldEnd {
            info: Arc::clone(&entry.info),
            server: ServerEnd::new(entry.session, entry.info.valid_until.load(), entry.ttl),
        }
    }
}

/// What dropping one guard's reference to a hold left.
pub(super) enum Unref<H> {
    /// It was the last reference: the entry is the caller's to release.
    Last(Entry<H>),
    /// Other guards of the reentrant hold remain; the hold's state.
    Shared(LockState),
    /// The hold is no longer tracked.
    Gone,
}

pub(super) struct Table<H> {
    pub(super) holds: HashMap<u64, Entry<H>>,
    pub(super) reentrant: HashMap<(LockName, OwnerId), u64>,
    pub(super) session_suspended: bool,
    /// The last session status, for backends with sessions.
    pub(super) session: Option<SessionStatus>,
    /// The renewal groups (see [`Backend::renewal_group`]) with a watchdog renewal in
    /// flight: marked when the keeper starts it, cleared when it has ended, before the
    /// keeper is woken to plan again.
    pub(super) renewing_groups: HashSet<u64>,
    /// When the keeper task wakes up next by itself, as its last plan set (under this
    /// table's lock); `None` before its first plan. A new hold that needs no attention
    /// before then is left for that wake-up, without waking the task now.
    pub(super) planned_wake: Option<Instant>,
}

impl<H> Default for Table<H> {
    fn default() -> Self {
        Table {
            holds: HashMap::new(),
            reentrant: HashMap::new(),
            session_suspended: false,
            session: None,
            renewing_groups: HashSet::new(),
            planned_wake: None,
        }
    }
}
