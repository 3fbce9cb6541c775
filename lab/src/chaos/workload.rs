//! What every scenario shares: client options, healthy contenders, crashes of server
//! members, the recovery check, and the plain report of a run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, LockGuard, LockName, LockOptions,
    LostReason,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use super::{ChaosTarget, Plan, ScenarioReport, ServerControl};
use conformance::fence::FencedResource;

/// How long a healthy holder works inside its critical section: long enough for another
/// holder's section to begin meanwhile, were the lock to grant twice.
pub(super) const SECTION: Duration = Duration::from_millis(5);

/// The options of a scenario's clients of TTL `ttl` and the plan's recheck.
pub(super) fn options_with(ttl: Duration, plan: &Plan) -> LockOptions {
    let mut options = conformance::with_ttl(ttl);
    options.request_timeout = (ttl / 2).max(Duration::from_millis(200));
    options.recheck = plan.recheck;
    options
}

/// The options of a scenario's clients: the plan's TTL and recheck.
pub(super) fn options(plan: &Plan) -> LockOptions {
    options_with(plan.ttl, plan)
}

/// Healthy contenders: acquire, hold a section of the resource
/// ([`FencedResource::hold_section`]: no write once the lock is lost), release. Runs
/// until `until`.
pub(super) async fn contend(
    clients: Vec<Arc<dyn DistributedLock>>,
    name: LockName,
    resource: FencedResource,
    until: Instant,
    notes: Arc<Mutex<Vec<String>>>,
) {
    let (_fixed, until) = watch::channel(until);
    contend_until(clients, name, resource, until, notes).await;
}

/// [`contend`] until the deadline `until` holds when a contender looks (a scenario may
/// move it once it knows how long its fault took).
pub(super) async fn contend_until(
    clients: Vec<Arc<dyn DistributedLock>>,
    name: LockName,
    resource: FencedResource,
    until: watch::Receiver<Instant>,
    notes: Arc<Mutex<Vec<String>>>,
) {
    let tasks = clients.into_iter().map(|client| {
        let (name, resource, notes) = (name.clone(), resource.clone(), Arc::clone(&notes));
        let until = until.clone();
        tokio::spawn(async move {
            loop {
                let left = until.borrow().saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let acquired = client
                    .acquire(
                        &name,
                        &AcquireOptions::timeout(left.max(Duration::from_millis(1))),
                    )
                    .await;
                let guard = match acquired {
                    Ok(Some(guard)) => guard,
                    Ok(None) => continue,
                    Err(err) => {
                        if !err.is_retryable() {
                            notes
                                .lock()
                                .expect("notes")
                                .push(format!("contender: {err}"));
                        }
                        sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = resource.hold_section(&guard, sleep(SECTION)).await;
                let _ = guard.release().await;
            }
        })
    });
    for task in join_all(tasks).await {
        if let Err(err) = task {
            notes
                .lock()
                .expect("notes")
                .push(format!("contender panicked: {err}"));
        }
    }
}

/// When a victim's guard stopped vouching, and why; set by [`watch_lost`].
pub(super) type LostAt = Arc<Mutex<Option<(Instant, LostReason)>>>;

/// Watches `guard` until it is lost: the instant it stopped vouching for the lock (its
/// validity deadline, if the signal came later from a busy scheduler) and the reason.
/// Abort the task once the victim is done.
pub(super) fn watch_lost(guard: &LockGuard) -> (LostAt, JoinHandle<()>) {
    let lost_at: LostAt = Arc::default();
    let mut watch = guard.watch();
    let task = {
        let lost_at = Arc::clone(&lost_at);
        tokio::spawn(async move {
            let reason = watch.lost().await;
            let at = Instant::now().min(watch.valid_until());
            *lost_at.lock().expect("lost") = Some((at, reason));
        })
    };
    (lost_at, task)
}

pub(super) async fn crash_members(
    servers: &[&dyn ServerControl],
    which: &[usize],
    wipe: bool,
    down: Duration,
    note: &(dyn Fn(String) + Sync),
) {
    for &i in which {
        if let Err(err) = servers[i].kill9().await {
            note(format!("kill {}: {err}", servers[i].label()));
        }
    }
    sleep(down).await;
    let restarts = which.iter().map(|&i| async move {
        let restarted = if wipe {
            servers[i].restart_wiped().await
        } else {
            servers[i].restart().await
        };
        (i, restarted)
    });
    for (i, restarted) in join_all(restarts).await {
        if let Err(err) = restarted {
            note(format!("restart {}: {err}", servers[i].label()));
        }
    }
}

pub(super) fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1000.0
    } else {
        -((earlier - later).as_secs_f64() * 1000.0)
    }
}

/// Start of the first accepted section that began after `after` (another holder's).
pub(super) fn first_other_start(resource: &FencedResource, after: Instant) -> Option<Instant> {
    first_start_above(resource, after, None)
}

/// Start of the first accepted section that began after `after` with a token above
/// `token` (any token without one): another holder's, where the one holding at `after`
/// may go on opening sections.
pub(super) fn first_start_above(
    resource: &FencedResource,
    after: Instant,
    token: Option<lock_core::FencingToken>,
) -> Option<Instant> {
    resource
        .sections()
        .into_iter()
        .filter(|s| s.start > after && s.written.is_some())
        .filter(|s| token.is_none_or(|token| s.token > token.get()))
        .map(|s| s.start)
        .min()
}

/// After the faults healed, a fresh client must get the lock within TTL plus a bound.
pub(super) async fn recover(
    target: &dyn ChaosTarget,
    name: &LockName,
    plan: Plan,
) -> Option<Duration> {
    let limit = plan.ttl * 3 + Duration::from_secs(10);
    let client = target.client(options(&plan)).await;
    let started = Instant::now();
    match timeout(limit, client.lock_timeout(name.as_str(), limit)).await {
        Ok(Ok(guard)) => {
            let took = started.elapsed();
            let _ = guard.release().await;
            Some(took)
        }
        _ => None,
    }
}

pub(super) fn report(
    scenario: &'static str,
    target: &dyn ChaosTarget,
    resource: &FencedResource,
    recovery: Option<Duration>,
    notes: Vec<String>,
) -> ScenarioReport {
    ScenarioReport {
        scenario,
        target: target.label(),
        fence: resource.check(),
        victim_write_accepted: None,
        victim_lost: None,
        lost_signal_lead_ms: None,
        takeover: None,
        recovery,
        stalled_waiters: Vec::new(),
        promotion: None,
        lost_after: None,
        lost_late: Vec::new(),
        notes,
    }
}
