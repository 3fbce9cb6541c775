//! The series a client records: the handles it takes when it is made ([`ClientMetrics`],
//! [`Series`]), per hold ([`HoldMetrics`]) and per leader service ([`ServiceSeries`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Label};
use tokio::time::Instant;

use super::{
    ACQUIRE_ATTEMPTS, ACQUIRE_ERRORS, ACQUIRE_GRANTS, ACQUIRE_NOT_ACQUIRED, ACQUIRE_TIMEOUTS,
    ACQUIRE_WAIT, BACKEND, HELD, HOLDS_BY_KIND, HOLD_DURATION, KIND, LEADERSHIPS, LEADER_CAMPAIGNS,
    LEADER_CHANGES, LEADER_TERM, LOCK, LOSSES, OUTCOME, REASON, RENEWALS, RENEWAL_LAG,
    RENEWAL_LATENCY, SIDE, TERMS_WON, WAITERS, WAITERS_BY_KIND,
};
use crate::error::{Error, ErrorKind};
use crate::guard::{HoldObserver, LockGuard};
use crate::kind::HoldKind;
use crate::name::LockName;
use crate::plumbing::lock_unpoisoned;
use crate::state::LostReason;
use crate::token::FencingToken;

/// The labels of a client's series: its backend, and `lock` when names are labels.
fn client_labels(backend: &'static str, lock: Option<&LockName>) -> Vec<Label> {
    let mut labels = vec![Label::from_static_parts(BACKEND, backend)];
    if let Some(lock) = lock {
        labels.push(Label::new(LOCK, lock.as_str().to_owned()));
    }
    labels
}

/// The metric handles of one leader service.
#[derive(Debug)]
pub(crate) struct ServiceSeries {
    campaigns: Counter,
    changes: Counter,
}

impl ServiceSeries {
    /// The handles of `backend`, and of election `lock` if given.
    pub(crate) fn new(backend: &'static str, lock: Option<&LockName>) -> Self {
        let labels = client_labels(backend, lock);
        ServiceSeries {
            campaigns: ::metrics::counter!(LEADER_CAMPAIGNS, labels.iter()),
            changes: ::metrics::counter!(LEADER_CHANGES, labels.iter()),
        }
    }

    /// Counts a campaign.
    pub(crate) fn campaign(&self) {
        self.campaigns.increment(1);
    }

    /// Counts a leader change.
    pub(crate) fn leader_changed(&self) {
        self.changes.increment(1);
    }
}

/// The outcome of one hold's renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    Lost,
    Failed,
}

/// The metric handles of one client, or of one lock name of it when names are labels.
#[derive(Debug)]
pub(crate) struct Series {
    labels: Vec<Label>,
    attempts: Counter,
    grants: Counter,
    not_acquired: Counter,
    timeouts: Counter,
    wait: Histogram,
    hold: Histogram,
    held: Gauge,
    waiters: Gauge,
    leaderships: Gauge,
    terms_won: Counter,
    leader_term: Gauge,
    renewed: Counter,
    renewal_lost: Counter,
    renewal_failed: Counter,
    lag: Histogram,
}

impl Series {
    /// The handles of `backend`, and of `lock` if given.
    pub(crate) fn new(backend: &'static str, lock: Option<&LockName>) -> Self {
        let labels = client_labels(backend, lock);
        let with = |key, value| extended(&labels, [(key, value)]);
        Series {
            attempts: ::metrics::counter!(ACQUIRE_ATTEMPTS, labels.iter()),
            grants: ::metrics::counter!(ACQUIRE_GRANTS, labels.iter()),
            not_acquired: ::metrics::counter!(ACQUIRE_NOT_ACQUIRED, labels.iter()),
            timeouts: ::metrics::counter!(ACQUIRE_TIMEOUTS, labels.iter()),
            wait: ::metrics::histogram!(ACQUIRE_WAIT, labels.iter()),
            hold: ::metrics::histogram!(HOLD_DURATION, labels.iter()),
            held: ::metrics::gauge!(HELD, labels.iter()),
            waiters: ::metrics::gauge!(WAITERS, labels.iter()),
            leaderships: ::metrics::gauge!(LEADERSHIPS, labels.iter()),
            terms_won: ::metrics::counter!(TERMS_WON, labels.iter()),
            leader_term: ::metrics::gauge!(LEADER_TERM, labels.iter()),
            renewed: ::metrics::counter!(RENEWALS, with(OUTCOME, "renewed")),
            renewal_lost: ::metrics::counter!(RENEWALS, with(OUTCOME, "lost")),
            renewal_failed: ::metrics::counter!(RENEWALS, with(OUTCOME, "failed")),
            lag: ::metrics::histogram!(RENEWAL_LAG, labels.iter()),
            labels,
        }
    }

    /// Counts an acquire call.
    pub(crate) fn attempt(&self) {
        self.attempts.increment(1);
    }

    /// Counts the end of an acquire call started at `started`.
    pub(crate) fn acquired(&self, result: &Result<Option<LockGuard>, Error>, started: Instant) {
        match result {
            Ok(Some(_)) => {
                self.grants.increment(1);
                self.wait.record(started.elapsed());
            }
            Ok(None) => self.not_acquired.increment(1),
            Err(err) if err.kind() == ErrorKind::Timeout => self.timeouts.increment(1),
            Err(err) => {
                let labels = extended(&self.labels, [(KIND, err.kind().label())]);
                ::metrics::counter!(ACQUIRE_ERRORS, labels).increment(1);
            }
        }
    }

    /// Counts a blocking acquire call in [`WAITERS`] until the returned guard is dropped:
    /// from the call to its end, whether the backend queued it or its first request
    /// found the lock free.
    pub(crate) fn waiting(&self, kind: &HoldKind) -> Waiting<'_> {
        self.waiters.increment(1.0);
        let by_kind = self.by_kind(WAITERS_BY_KIND, kind);
        if let Some(gauge) = &by_kind {
            gauge.increment(1.0);
        }
        Waiting(&self.waiters, by_kind)
    }

    /// The gauge `metric` of `kind`, for the kinds counted by kind (permits, reads,
    /// writes); looked up when used, so a client that uses none exports none.
    fn by_kind(&self, metric: &'static str, kind: &HoldKind) -> Option<Gauge> {
        let label = kind.shown()?.label();
        Some(::metrics::gauge!(
            metric,
            extended(&self.labels, [(KIND, label)])
        ))
    }

    /// Counts one hold's renewal, sent `lag` after it was planned (watchdog renewals).
    pub(crate) fn renewal(&self, outcome: Renewal, lag: Option<Duration>) {
        match outcome {
            Renewal::Renewed => self.renewed.increment(1),
            Renewal::Lost => self.renewal_lost.increment(1),
            Renewal::Failed => self.renewal_failed.increment(1),
        }
        if let Some(lag) = lag {
            self.lag.record(lag);
        }
    }

    /// Counts a loss, unless `reason` is [`LostReason::Released`]: a release by the
    /// hold's own guard is no loss.
    pub(crate) fn lost(&self, reason: LostReason) {
        if reason == LostReason::Released {
            return;
        }
        let side = reason.side().map(|side| (SIDE, side.label()));
        let labels = extended(
            &self.labels,
            [(REASON, reason.label())].into_iter().chain(side),
        );
        ::metrics::counter!(LOSSES, labels).increment(1);
    }
}

/// `labels` and `more`.
fn extended(
    labels: &[Label],
    more: impl IntoIterator<Item = (&'static str, &'static str)>,
) -> Vec<Label> {
    let more = more
        .into_iter()
        .map(|(key, value)| Label::from_static_parts(key, value));
    labels.iter().cloned().chain(more).collect()
}

/// The metric handles of one client.
#[derive(Debug)]
pub(crate) struct ClientMetrics {
    backend: &'static str,
    series: Arc<Series>,
    latency: Histogram,
    /// With names as labels, the series of each name that an acquire call or a hold still
    /// uses; `None` without.
    names: Option<Mutex<HashMap<LockName, Weak<Series>>>>,
}

impl ClientMetrics {
    /// The handles of a client of `backend`; with `names`, every lock name gets series of
    /// its own.
    pub(crate) fn new(backend: &'static str, names: bool) -> Self {
        ClientMetrics {
            backend,
            series: Arc::new(Series::new(backend, None)),
            latency: ::metrics::histogram!(RENEWAL_LATENCY, BACKEND => backend),
            names: names.then(Mutex::default),
        }
    }

    /// The series of lock `name`: the client's own unless names are labels. A name's
    /// series are registered with the recorder once and shared while an acquire call or a
    /// hold of the name uses them; the first acquire after that registers them again.
    pub(crate) fn series(&self, name: &LockName) -> Arc<Series> {
        let Some(names) = &self.names else {
            return Arc::clone(&self.series);
        };
        let mut names = lock_unpoisoned(names);
        if let Some(series) = names.get(name).and_then(Weak::upgrade) {
            return series;
        }
        names.retain(|_, series| series.strong_count() > 0);
        let series = Arc::new(Series::new(self.backend, Some(name)));
        names.insert(name.clone(), Arc::downgrade(&series));
        series
    }

    /// Records the duration of one renewal call.
    pub(crate) fn renewal_call(&self, took: Duration) {
        self.latency.record(took);
    }
}

/// An acquire counted in [`WAITERS`] until dropped (also when the acquire is cancelled).
#[derive(Debug)]
pub(crate) struct Waiting<'a>(&'a Gauge, Option<Gauge>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
        if let Some(by_kind) = &self.1 {
            by_kind.decrement(1.0);
        }
    }
}

/// What the metrics know of one hold: counted in [`HELD`] from [`HoldMetrics::start`] to
/// the first [`HoldMetrics::end`], exactly once whatever path ends it.
#[derive(Debug)]
pub(crate) struct HoldMetrics {
    series: Arc<Series>,
    granted: Instant,
    /// The term, for a leadership (a candidate's hold).
    term: Option<FencingToken>,
    /// The by-kind gauge of a permit, read or write hold (a downgrade replaces it).
    by_kind: Mutex<Option<Gauge>>,
    /// [`PHASE_NEW`], [`PHASE_HELD`] or [`PHASE_ENDED`].
    phase: AtomicU8,
}

/// Not counted yet (or never: its lease ran out before the grant arrived).
const PHASE_NEW: u8 = 0;
/// Counted in [`HELD`].
const PHASE_HELD: u8 = 1;
/// Counted, then ended.
const PHASE_ENDED: u8 = 2;

impl HoldMetrics {
    /// A hold of `kind` granted at `granted`, not counted yet; a leadership of term
    /// `term`.
    pub(crate) fn new(
        series: Arc<Series>,
        granted: Instant,
        kind: &HoldKind,
        term: Option<FencingToken>,
    ) -> Self {
        HoldMetrics {
            by_kind: Mutex::new(series.by_kind(HOLDS_BY_KIND, kind)),
            series,
            granted,
            term,
            phase: AtomicU8::new(PHASE_NEW),
        }
    }

    /// The series of the hold.
    pub(crate) fn series(&self) -> &Series {
        &self.series
    }

    fn advance(&self, from: u8, to: u8) -> bool {
        self.phase
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Counts the hold as held.
    pub(crate) fn start(&self) {
        if self.advance(PHASE_NEW, PHASE_HELD) {
            self.series.held.increment(1.0);
            if let Some(by_kind) = &*lock_unpoisoned(&self.by_kind) {
                by_kind.increment(1.0);
            }
            if let Some(term) = self.term {
                self.series.leaderships.increment(1.0);
                self.series.terms_won.increment(1);
                // A gauge is a float: exact up to 2^53, past any real term.
                #[allow(clippy::cast_precision_loss)]
                self.series.leader_term.set(term.get() as f64);
            }
        }
    }

    /// Ends the hold for `reason`: no longer held, its duration recorded, and a loss
    /// counted unless its guard released it. Only the first call after
    /// [`HoldMetrics::start`] counts.
    pub(crate) fn end(&self, reason: LostReason) {
        if self.advance(PHASE_HELD, PHASE_ENDED) {
            self.series.held.decrement(1.0);
            if let Some(by_kind) = &*lock_unpoisoned(&self.by_kind) {
                by_kind.decrement(1.0);
            }
            if self.term.is_some() {
                self.series.leaderships.decrement(1.0);
            }
            self.series.hold.record(self.granted.elapsed());
            self.series.lost(reason);
        }
    }

    /// Counts the hold as a `kind` hold from now on (a write downgraded to a read, an
    /// upgradeable read upgraded to a write).
    pub(crate) fn became(&self, kind: &HoldKind) {
        let mut by_kind = lock_unpoisoned(&self.by_kind);
        let counted = self.phase.load(Ordering::Acquire) == PHASE_HELD;
        if counted {
            if let Some(old) = &*by_kind {
                old.decrement(1.0);
            }
        }
        *by_kind = self.series.by_kind(HOLDS_BY_KIND, kind);
        if counted {
            if let Some(new) = &*by_kind {
                new.increment(1.0);
            }
        }
    }

    /// Counts a loss that the release of the hold found (gone on the server while it
    /// counted as held), if the hold was ever counted.
    pub(crate) fn found_lost(&self, reason: LostReason) {
        if self.phase.load(Ordering::Acquire) == PHASE_ENDED {
            self.series.lost(reason);
        }
    }
}

impl HoldObserver for HoldMetrics {
    fn ended(&self, reason: LostReason) {
        self.end(reason);
    }
}
