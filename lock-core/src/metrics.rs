//! The metrics every lock client records through the [`metrics`](https://docs.rs/metrics)
//! facade: their names, kinds, labels and meaning ([`METRICS`], the one list
//! `docs/metrics.md` shows).
//!
//! The shared lease machinery records them, so every backend (the dual lock included)
//! reports the same series, labelled with its [`Capabilities::backend`](crate::Capabilities).
//! Install the recorder of your exporter (Prometheus, StatsD, OpenTelemetry, …) **before**
//! connecting: a client takes its metric handles when it is made. Without a recorder
//! nothing is recorded and each handle is a no-op. Call [`describe_metrics`] once after
//! installing the recorder to give the exporter each metric's unit and help text.
//!
//! Lock names are not labels unless asked for with
//! [`LockOptions::metrics_names`](crate::LockOptions::metrics_names): every lock name
//! then makes series of its own.

use ::metrics::Unit;

mod series;

pub(crate) use series::{ClientMetrics, HoldMetrics, Renewal, Series, ServiceSeries};

/// Acquire calls.
pub const ACQUIRE_ATTEMPTS: &str = "distlock_acquire_attempts_total";
/// Acquire calls that returned a guard.
pub const ACQUIRE_GRANTS: &str = "distlock_acquire_grants_total";
/// Tries that found the lock held.
pub const ACQUIRE_NOT_ACQUIRED: &str = "distlock_acquire_not_acquired_total";
/// Waits that ran out of time.
pub const ACQUIRE_TIMEOUTS: &str = "distlock_acquire_timeouts_total";
/// Acquire calls that failed otherwise, by error kind.
pub const ACQUIRE_ERRORS: &str = "distlock_acquire_errors_total";
/// Time from an acquire call to its grant.
pub const ACQUIRE_WAIT: &str = "distlock_acquire_wait_seconds";
/// Time from a grant to the hold's release or loss.
pub const HOLD_DURATION: &str = "distlock_hold_duration_seconds";
/// Renewals of one hold, by outcome.
pub const RENEWALS: &str = "distlock_renewals_total";
/// Duration of one renewal call to the backend.
pub const RENEWAL_LATENCY: &str = "distlock_renewal_latency_seconds";
/// How late a renewal was sent against its plan.
pub const RENEWAL_LAG: &str = "distlock_renewal_lag_seconds";
/// Holds lost, by reason.
pub const LOSSES: &str = "distlock_losses_total";
/// Holds currently held.
pub const HELD: &str = "distlock_held_locks";
/// Blocking acquire calls in progress.
pub const WAITERS: &str = "distlock_waiters";
/// Elections this client leads now.
pub const LEADERSHIPS: &str = "distlock_leaderships";
/// Elections won: each a new term.
pub const TERMS_WON: &str = "distlock_terms_won_total";
/// The term of the leadership won last.
pub const LEADER_TERM: &str = "distlock_leader_term";
/// Campaigns a leader service started.
pub const LEADER_CAMPAIGNS: &str = "distlock_leader_campaigns_total";
/// Leader changes a leader service saw.
pub const LEADER_CHANGES: &str = "distlock_leader_changes_total";
/// Permits, read holds and write holds held now, by [`KIND`].
pub const HOLDS_BY_KIND: &str = "distlock_holds_by_kind";
/// Blocking acquires of permits, reads and writes in progress, by [`KIND`].
pub const WAITERS_BY_KIND: &str = "distlock_waiters_by_kind";

/// Label: the backend (`memory`, `redis`, `zookeeper`, `etcd`, `dual`, …).
pub const BACKEND: &str = "backend";
/// Label: the lock name, only with [`LockOptions::metrics_names`](crate::LockOptions).
pub const LOCK: &str = "lock";
/// Label: an [`ErrorKind::label`](crate::ErrorKind::label).
pub const KIND: &str = "kind";
/// Label: a renewal's outcome (`renewed`, `lost`, `failed`).
pub const OUTCOME: &str = "outcome";
/// Label: a [`LostReason::label`](crate::LostReason::label).
pub const REASON: &str = "reason";
/// Label: the side of a dual lock a loss happened on ([`Side::label`](crate::migration::Side::label)).
pub const SIDE: &str = "side";

/// The kind of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

impl MetricKind {
    /// `counter`, `gauge` or `histogram`.
    pub fn label(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// A metric a lock client records.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Its kind.
    pub kind: MetricKind,
    /// The labels it may carry ([`LOCK`] only with the opt-in, [`SIDE`] only on dual locks).
    pub labels: &'static [&'static str],
    /// What it measures.
    pub help: &'static str,
}

impl Metric {
    /// The entry of [`METRICS`] for the metric `name`.
    const fn new(
        name: &'static str,
        kind: MetricKind,
        labels: &'static [&'static str],
        help: &'static str,
    ) -> Self {
        Metric {
            name,
            kind,
            labels,
            help,
        }
    }
}

/// Every metric a lock client records.
pub const METRICS: &[Metric] = &[
    Metric::new(
        ACQUIRE_ATTEMPTS,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Acquire calls (each ends in a grant, a not-acquired try, a timeout, an error, \
        or is cancelled).",
    ),
    Metric::new(
        ACQUIRE_GRANTS,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Acquire calls that returned a guard (reentrant ones included).",
    ),
    Metric::new(
        ACQUIRE_NOT_ACQUIRED,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Tries (no wait) that found the lock held by another owner.",
    ),
    Metric::new(
        ACQUIRE_TIMEOUTS,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Waiting acquires whose timeout ran out.",
    ),
    Metric::new(
        ACQUIRE_ERRORS,
        MetricKind::Counter,
        &[BACKEND, LOCK, KIND],
        "Acquire calls that failed with an error other than a timeout, by error kind.",
    ),
    Metric::new(
        ACQUIRE_WAIT,
        MetricKind::Histogram,
        &[BACKEND, LOCK],
        "Seconds from an acquire call to its grant.",
    ),
    Metric::new(
        HOLD_DURATION,
        MetricKind::Histogram,
        &[BACKEND, LOCK],
        "Seconds from a grant to the hold's release or loss.",
    ),
    Metric::new(
        RENEWALS,
        MetricKind::Counter,
        &[BACKEND, LOCK, OUTCOME],
        "Renewals of one hold (watchdog and explicit extensions), by outcome: renewed, \
        lost, failed (no answer, an error or an undecided outcome).",
    ),
    Metric::new(
        RENEWAL_LATENCY,
        MetricKind::Histogram,
        &[BACKEND],
        "Seconds one renewal call to the backend took (a watchdog batch or an extension).",
    ),
    Metric::new(
        RENEWAL_LAG,
        MetricKind::Histogram,
        &[BACKEND, LOCK],
        "Seconds a watchdog renewal was sent after it was planned (0 when on time): \
        the early warning of a lost lock.",
    ),
    Metric::new(
        LOSSES,
        MetricKind::Counter,
        &[BACKEND, LOCK, REASON, SIDE],
        "Holds lost (not released by their guard), by reason; `side` on dual locks.",
    ),
    Metric::new(
        HELD,
        MetricKind::Gauge,
        &[BACKEND, LOCK],
        "Holds currently held or suspect (reentrant guards of one hold count once).",
    ),
    Metric::new(
        WAITERS,
        MetricKind::Gauge,
        &[BACKEND, LOCK],
        "Blocking acquire calls in progress: queued, or with their request in flight \
        (tries not included).",
    ),
    Metric::new(
        LEADERSHIPS,
        MetricKind::Gauge,
        &[BACKEND, LOCK],
        "Elections this client leads now (held or suspect leaderships; also counted in \
        distlock_held_locks).",
    ),
    Metric::new(
        TERMS_WON,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Elections won by this client: each is a new term.",
    ),
    Metric::new(
        LEADER_TERM,
        MetricKind::Gauge,
        &[BACKEND, LOCK],
        "The term (fencing token) of the leadership this client won last.",
    ),
    Metric::new(
        LEADER_CAMPAIGNS,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Campaigns leader services started: the first, and each after a term or a failed \
        campaign.",
    ),
    Metric::new(
        LEADER_CHANGES,
        MetricKind::Counter,
        &[BACKEND, LOCK],
        "Leader changes leader services saw: a new leader (this service or another), a \
        proclaimed value, or nobody leading.",
    ),
    Metric::new(
        HOLDS_BY_KIND,
        MetricKind::Gauge,
        &[BACKEND, LOCK, KIND],
        "Semaphore permits (kind `permit`) and read-write lock holds (`read`, `write`, \
        `upgradeable`) held or suspect now; also counted in distlock_held_locks. A \
        downgrade moves a hold from `write` to `read`, an upgrade from `upgradeable` to \
        `write`.",
    ),
    Metric::new(
        WAITERS_BY_KIND,
        MetricKind::Gauge,
        &[BACKEND, LOCK, KIND],
        "Blocking acquires of permits, reads and writes in progress, by kind; also \
        counted in distlock_waiters.",
    ),
];

/// Histogram buckets (seconds) suited to every histogram of [`METRICS`], from half a
/// millisecond (an uncontended grant) to an hour (a long hold), for exporters that need
/// them (Prometheus renders histograms without buckets as summaries).
pub const BUCKETS_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
];

/// Gives the installed recorder the unit and help text of every metric of [`METRICS`].
/// Call it once, after installing the recorder.
pub fn describe_metrics() {
    for metric in METRICS {
        match metric.kind {
            MetricKind::Counter => {
                ::metrics::describe_counter!(metric.name, Unit::Count, metric.help)
            }
            MetricKind::Gauge => ::metrics::describe_gauge!(metric.name, Unit::Count, metric.help),
            MetricKind::Histogram => {
                ::metrics::describe_histogram!(metric.name, Unit::Seconds, metric.help)
            }
        }
    }
}
