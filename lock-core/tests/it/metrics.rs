//! The metrics of the lease machinery, read from a debugging recorder on the memory
//! backend for a scripted sequence; and the documented table of metrics, checked against
//! the one list in code.
//!
//! Each test installs its own recorder for its thread (a current-thread runtime runs every
//! task there), so tests running side by side do not see each other's metrics.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::metrics::{
    Counter, Gauge, Histogram, Key, KeyName, LocalRecorderGuard, Metadata, Recorder, SharedString,
    Unit,
};
use lock_core::memory::{MemoryBackend, MemoryLock, MemorySpace};
use lock_core::metrics::{self, METRICS};
use lock_core::migration::Side;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockName, LockOptions,
    LostReason, ReleaseOutcome,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::{sleep, timeout};

/// A series: its name and its labels, sorted.
type SeriesKey = (String, Vec<(String, String)>);

/// What the recorder saw so far. A snapshot drains the recorder (counters and gauges back to
/// zero, histograms emptied), so each read adds what it finds: the library only counts up
/// and moves gauges up and down, never sets them.
struct Seen {
    /// The backend whose series [`Seen::counter`] and the others read.
    backend: &'static str,
    snapshotter: Snapshotter,
    counters: HashMap<SeriesKey, u64>,
    gauges: HashMap<SeriesKey, f64>,
    observations: HashMap<SeriesKey, Vec<f64>>,
}

impl Seen {
    fn new(snapshotter: Snapshotter) -> Self {
        Seen {
            backend: "memory",
            snapshotter,
            counters: HashMap::new(),
            gauges: HashMap::new(),
            observations: HashMap::new(),
        }
    }

    fn read(&mut self) -> &mut Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(series).or_default() += n,
                DebugValue::Gauge(v) => *self.gauges.entry(series).or_default() += v.into_inner(),
                DebugValue::Histogram(values) => {
                    let values = values.into_iter().map(|v| v.into_inner());
                    self.observations.entry(series).or_default().extend(values);
                }
            }
        }
        self
    }

    fn key(&self, name: &str, labels: &[(&str, &str)]) -> SeriesKey {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.push(("backend".to_owned(), self.backend.to_owned()));
        labels.sort();
        (name.to_owned(), labels)
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters
            .get(&self.key(name, labels))
            .copied()
            .unwrap_or(0)
    }

    fn gauge(&self, name: &str) -> f64 {
        self.gauge_of(name, &[])
    }

    fn gauge_of(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.gauges
            .get(&self.key(name, labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn observed(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.observations(name, labels).len()
    }

    /// What histogram `name` recorded.
    fn observations(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.observations
            .get(&self.key(name, labels))
            .map_or(&[], Vec::as_slice)
    }

    /// Every series of `name`, with its labels.
    fn series_of(&self, name: &str) -> Vec<Vec<(String, String)>> {
        let counters = self.counters.keys();
        let gauges = self.gauges.keys();
        counters
            .chain(gauges)
            .chain(self.observations.keys())
            .filter(|(n, _)| n == name)
            .map(|(_, labels)| labels.clone())
            .collect()
    }
}

/// A recorder for this thread (kept until the guard is dropped), what it saw, and a
/// private memory space.
fn recording() -> (Seen, LocalRecorderGuard<'static>, Arc<MemorySpace>) {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let seen = Seen::new(recorder.snapshotter());
    let local = ::metrics::set_default_local_recorder(recorder);
    let space = MemorySpace::named(&format!("metrics-{}", uuid::Uuid::new_v4().simple()));
    (seen, local, space)
}

fn client(space: &Arc<MemorySpace>, options: LockOptions) -> Arc<MemoryLock> {
    Arc::new(MemoryBackend::client(Arc::clone(space), options).expect("valid options"))
}

fn options(ttl: Duration) -> LockOptions {
    let mut options = LockOptions::default();
    options.ttl = ttl;
    options
}

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

/// A scripted sequence on two clients counts exactly: a try on a held lock is not
/// acquired, a wait runs out, a cancelled wait leaves no waiter behind, a bad option is an
/// error by kind, reentrant guards make one hold, a hold stolen behind its holder's back is
/// one loss (with its reason) and its release counts no second one, and every hold ends.
#[tokio::test]
async fn a_scripted_sequence_counts_exactly() {
    let (mut seen, _local, space) = recording();
    let ttl = Duration::from_millis(300);
    let (a, b) = (client(&space, options(ttl)), client(&space, options(ttl)));
    let (x, r) = (name("jobs/x"), name("jobs/r"));

    let stolen = a.lock("jobs/x").await.expect("a takes x");
    assert!(b.try_lock("jobs/x").await.expect("try").is_none());
    let briefly = AcquireOptions::timeout(Duration::from_millis(50));
    let err = b.acquire(&x, &briefly).await.expect_err("x is held");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let bad = AcquireOptions::try_once().with_ttl(Duration::ZERO);
    let err = b.acquire(&x, &bad).await.expect_err("a zero ttl");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);

    let pending = tokio::spawn({
        let (b, x) = (Arc::clone(&b), x.clone());
        async move { b.acquire(&x, &AcquireOptions::forever()).await }
    });
    sleep(Duration::from_millis(30)).await;
    assert_eq!(seen.read().gauge(metrics::WAITERS), 1.0);
    pending.abort();
    assert!(pending.await.expect_err("aborted").is_cancelled());
    assert_eq!(seen.read().gauge(metrics::WAITERS), 0.0);

    let first = a
        .acquire(&r, &AcquireOptions::try_once().reentrant("owner"))
        .await
        .expect("a takes r")
        .expect("free");
    let second = a
        .acquire(&r, &AcquireOptions::try_once().reentrant("owner"))
        .await
        .expect("a re-enters r")
        .expect("re-entered");
    assert_eq!(seen.read().gauge(metrics::HELD), 2.0, "x, and r once");

    // Renewed on plan while held, then stolen behind the holder's back.
    sleep(ttl).await;
    assert!(space.steal(&x));
    let reason = timeout(ttl * 3, stolen.lost())
        .await
        .expect("the loss is seen");
    assert_eq!(reason, LostReason::Vanished);
    assert_eq!(seen.read().gauge(metrics::HELD), 1.0, "r only");
    assert_eq!(
        stolen.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(LostReason::Vanished)
    );
    first.release().await.expect("release");
    assert_eq!(seen.read().gauge(metrics::HELD), 1.0, "one guard of r left");
    second.release().await.expect("release");

    let seen = seen.read();
    assert_eq!(seen.gauge(metrics::HELD), 0.0);
    assert_eq!(seen.gauge(metrics::WAITERS), 0.0);
    assert_eq!(seen.counter(metrics::ACQUIRE_ATTEMPTS, &[]), 7);
    assert_eq!(seen.counter(metrics::ACQUIRE_GRANTS, &[]), 3);
    assert_eq!(seen.counter(metrics::ACQUIRE_NOT_ACQUIRED, &[]), 1);
    assert_eq!(seen.counter(metrics::ACQUIRE_TIMEOUTS, &[]), 1);
    let invalid = [("kind", "invalid_config")];
    assert_eq!(seen.counter(metrics::ACQUIRE_ERRORS, &invalid), 1);
    assert_eq!(seen.series_of(metrics::ACQUIRE_ERRORS).len(), 1);
    assert_eq!(seen.observed(metrics::ACQUIRE_WAIT, &[]), 3);
    assert_eq!(seen.observed(metrics::HOLD_DURATION, &[]), 2);
    let losses = seen.series_of(metrics::LOSSES);
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(seen.counter(metrics::LOSSES, &[("reason", "vanished")]), 1);
    let renewed = seen.counter(metrics::RENEWALS, &[("outcome", "renewed")]);
    let lost = seen.counter(metrics::RENEWALS, &[("outcome", "lost")]);
    let failed = seen.counter(metrics::RENEWALS, &[("outcome", "failed")]);
    assert!(renewed >= 2, "x and r renewed on plan: {renewed}");
    assert_eq!((lost, failed), (1, 0));
    let lags = seen.observed(metrics::RENEWAL_LAG, &[]);
    assert_eq!(lags as u64, renewed + lost, "one lag per watchdog renewal");
    assert!(seen.observed(metrics::RENEWAL_LATENCY, &[]) >= 1);
}

/// A hold that only its release finds gone (manual renewal: nothing looked before) is one
/// loss; a hold broken by an operator is one loss with reason `broken`; a guard dropped
/// without release ends its hold.
#[tokio::test]
async fn losses_found_at_release_and_drop_release_end_holds() {
    let (mut seen, _local, space) = recording();
    let ttl = Duration::from_secs(10);
    let a = client(&space, options(ttl));

    let manual = a
        .acquire(&name("m"), &AcquireOptions::try_once().manual())
        .await
        .expect("acquire")
        .expect("free");
    assert!(space.steal(&name("m")));
    let outcome = manual.release().await.expect("release");
    assert_eq!(outcome, ReleaseOutcome::AlreadyLost(LostReason::Vanished));
    assert_eq!(
        seen.read()
            .counter(metrics::LOSSES, &[("reason", "vanished")]),
        1
    );

    let broken = a.lock("b").await.expect("acquire");
    let operator = client(&space, options(ttl));
    operator
        .force_release(&name("b"))
        .await
        .expect("break")
        .expect("was held");
    broken.extend().await.expect_err("broken");
    drop(broken);
    let dropped = a.lock("d").await.expect("acquire");
    drop(dropped);
    for _ in 0..100 {
        if seen.read().gauge(metrics::HELD) == 0.0 {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.read();
    assert_eq!(
        seen.gauge(metrics::HELD),
        0.0,
        "the dropped guard's hold ended"
    );
    assert_eq!(seen.counter(metrics::LOSSES, &[("reason", "broken")]), 1);
    assert_eq!(seen.counter(metrics::RENEWALS, &[("outcome", "lost")]), 1);
    assert_eq!(seen.series_of(metrics::LOSSES).len(), 2);
    assert_eq!(seen.observed(metrics::HOLD_DURATION, &[]), 3);
}

/// With `metrics_names=true` the series carry the lock name; without, none does.
#[tokio::test]
async fn lock_names_are_labels_only_when_asked() {
    let (mut seen, _local, space) = recording();
    let mut named = options(Duration::from_secs(10));
    named
        .apply_query_pair("metrics_names", "true")
        .expect("valid");
    let guard = client(&space, named)
        .lock("reports/daily")
        .await
        .expect("lock");
    let plain = client(&space, options(Duration::from_secs(10)));
    assert!(plain
        .try_lock("reports/daily")
        .await
        .expect("try")
        .is_none());
    let seen = seen.read();
    let lock = [("lock", "reports/daily")];
    assert_eq!(seen.counter(metrics::ACQUIRE_GRANTS, &lock), 1);
    assert_eq!(seen.counter(metrics::ACQUIRE_GRANTS, &[]), 0);
    assert_eq!(seen.counter(metrics::ACQUIRE_NOT_ACQUIRED, &[]), 1);
    assert_eq!(seen.counter(metrics::ACQUIRE_NOT_ACQUIRED, &lock), 0);
    assert_eq!(seen.gauges[&seen.key(metrics::HELD, &lock)], 1.0);
    drop(guard);
}

/// The renewal lag counts from the plan, not from the retries: with the client cut off
/// from the space, the planned renewal and its first retry fail (each after the request
/// timeout), and the renewal that gets through after the cut heals is at least two retry
/// pauses (2 x TTL/10) late. Measured against the retry time, every retry was on time.
#[tokio::test]
async fn renewal_lag_grows_while_renewals_fail() {
    let (mut seen, _local, space) = recording();
    let ttl = Duration::from_secs(2);
    let mut cut_off = options(ttl);
    cut_off.request_timeout = Duration::from_millis(100);
    let a = client(&space, cut_off);
    let guard = a.lock("jobs/lag").await.expect("lock");
    a.backend().partition(true);
    let failed = [("outcome", "failed")];
    for _ in 0..300 {
        if seen.read().counter(metrics::RENEWALS, &failed) >= 2 {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    a.backend().partition(false);
    assert!(seen.counter(metrics::RENEWALS, &failed) >= 2, "two failed");
    let renewed = [("outcome", "renewed")];
    for _ in 0..300 {
        if seen.read().counter(metrics::RENEWALS, &renewed) >= 1 {
            break;
        }
        sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        seen.counter(metrics::RENEWALS, &renewed),
        1,
        "renewed after the cut"
    );
    assert_eq!(guard.state(), lock_core::LockState::Held);
    let lags = seen.observations(metrics::RENEWAL_LAG, &[]);
    eprintln!("renewal lags (s): {lags:?}");
    let latest = lags.last().copied().unwrap_or_default();
    let retry_pause = (ttl / 10).as_secs_f64();
    assert!(latest >= 2.0 * retry_pause, "lags {lags:?}");
    assert!(latest < ttl.as_secs_f64() * 2.0 / 3.0, "lags {lags:?}");
    guard.release().await.expect("release");
}

/// A recorder that counts the registrations of [`metrics::ACQUIRE_ATTEMPTS`] by lock name.
#[derive(Debug, Default)]
struct Registrations(Mutex<HashMap<String, usize>>);

impl Registrations {
    fn of(&self, lock: &str) -> usize {
        let counts = self.0.lock().expect("not poisoned");
        counts.get(lock).copied().unwrap_or(0)
    }
}

impl Recorder for Registrations {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let lock = key.labels().find(|label| label.key() == metrics::LOCK);
        if let (metrics::ACQUIRE_ATTEMPTS, Some(lock)) = (key.name(), lock) {
            let mut counts = self.0.lock().expect("not poisoned");
            *counts.entry(lock.value().to_owned()).or_default() += 1;
        }
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// With names as labels, the acquires of one name share its series while a hold of it
/// lasts (the recorder is asked for them once); another name has its own, and an acquire
/// after the name's last hold ended asks again.
#[tokio::test]
async fn acquires_of_one_name_share_its_series() {
    let recorder: &'static Registrations = Box::leak(Box::default());
    let _local = ::metrics::set_default_local_recorder(recorder);
    let space = MemorySpace::named(&format!("metrics-{}", uuid::Uuid::new_v4().simple()));
    let mut named = options(Duration::from_secs(10));
    named.metrics_names = true;
    let a = client(&space, named);
    let guard = a.lock("reports/daily").await.expect("lock");
    assert!(a.try_lock("reports/daily").await.expect("try").is_none());
    let briefly = AcquireOptions::timeout(Duration::from_millis(20));
    let err = a.acquire(&name("reports/daily"), &briefly).await;
    assert_eq!(err.expect_err("held").kind(), ErrorKind::Timeout);
    let other = a.lock("reports/weekly").await.expect("lock");
    assert_eq!(recorder.of("reports/daily"), 1);
    assert_eq!(recorder.of("reports/weekly"), 1);
    guard.release().await.expect("release");
    let again = a.lock("reports/daily").await.expect("lock");
    assert_eq!(recorder.of("reports/daily"), 2);
    again.release().await.expect("release");
    other.release().await.expect("release");
}

/// A dual lock's loss names its side; its series are the dual backend's.
#[tokio::test]
async fn a_dual_loss_names_its_side() {
    let (mut seen, _local, _) = recording();
    seen.backend = "dual";
    let fresh = || format!("metrics-{}", uuid::Uuid::new_v4().simple());
    let (old_name, new_name) = (fresh(), fresh());
    let old = MemorySpace::named(&old_name);
    let url = format!("dual:memory://{old_name}?ttl=300ms|memory://{new_name}?ttl=300ms");
    let dual = lock_core::connect(&url).await.expect("dual client");
    let guard = dual.lock("jobs/dual").await.expect("lock");
    assert_eq!(seen.read().gauge(metrics::HELD), 1.0);
    assert!(old.steal(&name("jobs/dual")));
    let reason = timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the loss is seen");
    assert_eq!(reason, LostReason::on_side(Side::Old, LostReason::Vanished));
    let seen = seen.read();
    let on_old = [("reason", "vanished"), ("side", "old")];
    assert_eq!(seen.counter(metrics::LOSSES, &on_old), 1);
    assert_eq!(seen.series_of(metrics::LOSSES).len(), 1);
    assert_eq!(seen.gauge(metrics::HELD), 0.0);
    drop(guard);
}

#[test]
fn loss_labels_are_stable_and_name_the_side_apart() {
    let on_old = LostReason::on_side(Side::Old, LostReason::SessionExpired);
    assert_eq!(on_old.label(), "session_expired");
    assert_eq!(on_old.side(), Some(Side::Old));
    assert_eq!(LostReason::HoldCapReached.label(), "hold_cap_reached");
    assert_eq!(LostReason::Taken.side(), None);
    assert_eq!(ErrorKind::InvalidConfig.label(), "invalid_config");
}

/// docs/metrics.md's table lists exactly [`METRICS`], in order, with each one's kind and
/// labels.
#[test]
fn the_documented_table_is_the_list_in_code() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let text = std::fs::read_to_string(&path).expect("docs/metrics.md");
    let documented: Vec<(String, String, String)> = text
        .lines()
        .filter(|line| line.starts_with("| `distlock_"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquote = |cell: &str| cell.replace('`', "");
            (unquote(cells[1]), unquote(cells[2]), unquote(cells[3]))
        })
        .collect();
    let declared: Vec<(String, String, String)> = METRICS
        .iter()
        .map(|m| {
            let labels = m.labels.join(", ");
            (m.name.to_owned(), m.kind.label().to_owned(), labels)
        })
        .collect();
    assert_eq!(documented, declared, "docs/metrics.md");
}

/// A leadership counts in the leaderships gauge while held and once in the terms won, and
/// the leader term gauge shows its term; a mutex hold counts in neither.
#[tokio::test]
async fn leaderships_count_terms_and_end() {
    let (mut seen, _local, space) = recording();
    let ttl = Duration::from_millis(300);
    let a: Arc<dyn DistributedLock> = client(&space, options(ttl));
    let election = lock_core::Election::new(Arc::clone(&a), "jobs/leader").expect("election");
    let mutex = a.lock("jobs/plain").await.expect("a mutex");
    let first = election
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    seen.read();
    assert_eq!(seen.gauge(metrics::LEADERSHIPS), 1.0);
    assert_eq!(seen.counter(metrics::TERMS_WON, &[]), 1);
    #[allow(clippy::cast_precision_loss)]
    let term = first.term().get() as f64;
    assert_eq!(seen.gauge(metrics::LEADER_TERM), term);
    assert_eq!(
        seen.gauge(metrics::HELD),
        2.0,
        "the mutex and the leadership"
    );
    first.resign().await.expect("resign");
    let second = election
        .campaign_with("a", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads again");
    drop(second);
    mutex.release().await.expect("release");
    sleep(Duration::from_millis(50)).await;
    seen.read();
    assert_eq!(
        seen.gauge(metrics::LEADERSHIPS),
        0.0,
        "every leadership ended"
    );
    assert_eq!(seen.counter(metrics::TERMS_WON, &[]), 2);
    assert_eq!(seen.gauge(metrics::HELD), 0.0);
}

/// Permits, reads and writes count in the by-kind gauges while held (and waiting), a
/// downgrade moves a hold from `write` to `read`, and a mutex counts in none.
#[tokio::test]
async fn holds_and_waiters_count_by_kind() {
    let (mut seen, _local, space) = recording();
    let ttl = Duration::from_millis(500);
    let a: Arc<dyn DistributedLock> = client(&space, options(ttl));
    let b: Arc<dyn DistributedLock> = client(&space, options(ttl));
    let by = |kind| [("kind", kind)];
    let semaphore = lock_core::Semaphore::new(Arc::clone(&a), "jobs/pool", 1).expect("semaphore");
    let rwlock = lock_core::RwLock::new(Arc::clone(&a), "jobs/table").expect("rwlock");
    let _mutex = a.lock("jobs/plain").await.expect("a mutex");
    let permit = semaphore
        .acquire_with(&AcquireOptions::try_once())
        .await
        .expect("acquire");
    let writing = rwlock
        .write_with(&AcquireOptions::try_once())
        .await
        .expect("write")
        .expect("free");
    let on_b = lock_core::Semaphore::new(Arc::clone(&b), "jobs/pool", 1).expect("semaphore");
    let waiting = tokio::spawn(async move { on_b.acquire_with(&AcquireOptions::forever()).await });
    sleep(Duration::from_millis(50)).await;
    seen.read();
    assert_eq!(seen.gauge_of(metrics::HOLDS_BY_KIND, &by("permit")), 1.0);
    assert_eq!(seen.gauge_of(metrics::HOLDS_BY_KIND, &by("write")), 1.0);
    assert_eq!(seen.gauge_of(metrics::WAITERS_BY_KIND, &by("permit")), 1.0);
    assert_eq!(
        seen.gauge(metrics::HELD),
        3.0,
        "the mutex, the permit, the write"
    );
    let reading = writing.downgrade().await.expect("downgrade");
    seen.read();
    assert_eq!(seen.gauge_of(metrics::HOLDS_BY_KIND, &by("write")), 0.0);
    assert_eq!(seen.gauge_of(metrics::HOLDS_BY_KIND, &by("read")), 1.0);
    drop(permit);
    let granted = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter is served")
        .expect("task")
        .expect("acquire");
    drop(granted);
    reading.release().await.expect("release");
    sleep(Duration::from_millis(50)).await;
    seen.read();
    for kind in ["permit", "read", "write"] {
        assert_eq!(
            seen.gauge_of(metrics::HOLDS_BY_KIND, &by(kind)),
            0.0,
            "{kind}"
        );
        assert_eq!(
            seen.gauge_of(metrics::WAITERS_BY_KIND, &by(kind)),
            0.0,
            "{kind}"
        );
    }
    assert_eq!(seen.gauge(metrics::HELD), 1.0, "the mutex");
}
