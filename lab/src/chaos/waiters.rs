//! Scenarios around waiters: the hand-off when the release reply is lost, a waiter whose
//! connections reset (briefly, or for longer than its queue entry lives), and a waiter
//! that crashes at the head of the queue.
//!
//! Each waiter queues only once the server shows the one before it waiting, and works a
//! section of the resource as soon as it is granted, so a grant that comes too early
//! overlaps the holder's section. A waiter that gets no grant within [`GRANT_LIMIT`] is
//! reported stalled, which fails the run (a hang, as in a queue that waits forever for a
//! dead head or forgets a waiter it evicted).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, LockGuard, LockName};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::workload::{options, recover, report, SECTION};
use super::{ChaosTarget, Plan, ScenarioReport, Scene};
use conformance::factory::Crash;
use conformance::fence::{FencedResource, SectionHandle};
use conformance::rules::unique_name;
use harness::proxy::ProxyMode;

/// How long a waiter's acquire may take in all: longer than any scenario's steps before
/// the grant it expects (a stall is judged by [`GRANT_LIMIT`] from that step on, never by
/// the acquire's own deadline, which the scenario's earlier waits use up).
const WAIT_LIMIT: Duration = Duration::from_secs(180);
/// How long a scenario waits for one waiter's grant before it reports the waiter stalled:
/// generous, far above every backend's bound (no timed assertion).
const GRANT_LIMIT: Duration = Duration::from_secs(30);
/// Time for a wait the server shows to settle (a subscription may show before the
/// request that queues).
const SETTLE: Duration = Duration::from_millis(200);

/// What a waiter scenario keeps as it runs: its lock, the resource the holders write, and
/// what it found on the way.
struct Waiting {
    scenario: &'static str,
    name: LockName,
    resource: FencedResource,
    notes: Vec<String>,
    stalled: Vec<String>,
}

impl Waiting {
    fn new(scenario: &'static str) -> Self {
        Waiting {
            scenario,
            name: unique_name(scenario),
            resource: FencedResource::new(),
            notes: Vec::new(),
            stalled: Vec::new(),
        }
    }

    /// `holder` takes the lock and opens a section of the resource with its token: the
    /// guard, the section and the value the section read.
    async fn hold(&self, holder: &dyn DistributedLock) -> (LockGuard, SectionHandle, u64) {
        let guard = holder
            .lock_timeout(self.name.as_str(), Duration::from_secs(10))
            .await
            .expect("holder acquires");
        let section = self
            .resource
            .begin(guard.fencing_token())
            .expect("the first token is never stale");
        let seen = section.read();
        (guard, section, seen)
    }

    /// Spawns `client`'s wait for `name` ([`Waiter`]) and returns once the server shows it
    /// waiting (the target's leftovers for `name` change), so that the next waiter queues
    /// behind it. A wait the server did not show within 2 x TTL fails the run: the
    /// scenario cannot order its waiters, and its waits eat into theirs.
    async fn queue_up<F>(
        &mut self,
        target: &dyn ChaosTarget,
        client: Arc<dyn DistributedLock>,
        hold: F,
        plan: Plan,
    ) -> Waiter
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let before = target.leftovers(std::slice::from_ref(&self.name)).await;
        let waiter = Waiter::spawn(client, &self.name, &self.resource, hold);
        let bound = plan.ttl * 2;
        if !shows_change(target, &self.name, &before, bound).await {
            self.stalled.push(format!(
                "a waiter was not seen waiting on the server within {} ms",
                ms(bound)
            ));
        }
        sleep(SETTLE).await;
        waiter
    }

    /// The report, once the lock recovered: the takeover runs from the holder's release
    /// at `released_at` to the grant that followed it.
    async fn report(
        self,
        target: &dyn ChaosTarget,
        plan: Plan,
        released_at: Instant,
        granted: Option<Instant>,
    ) -> ScenarioReport {
        let recovery = recover(target, &self.name, plan).await;
        let mut out = report(self.scenario, target, &self.resource, recovery, self.notes);
        out.takeover = granted.map(|at| at.saturating_duration_since(released_at));
        out.stalled_waiters = self.stalled;
        out
    }
}

/// The reply to the victim's release is lost: the release is ambiguous to the victim, yet
/// a waiter gets the lock and nothing the victim does afterwards touches it.
pub async fn release_reply_lost(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let mut run = Waiting::new(scene.scenario);
    let (victim, link) = target.linked_client(options(&plan)).await;
    let client = target.client(options(&plan)).await;
    let guard = victim
        .lock_timeout(run.name.as_str(), Duration::from_secs(10))
        .await
        .expect("victim acquires");
    let _ = run.resource.hold_section(&guard, sleep(SECTION)).await;
    let hold = sleep(plan.ttl / 2);
    let mut waiter = run.queue_up(target, client, hold, plan).await;
    link.set_mode(ProxyMode::DropNextReply);
    let released_at = Instant::now();
    run.notes
        .push(format!("victim's release: {:?}", guard.release().await));
    link.heal();
    let granted = waiter.granted("the waiter", &mut run.stalled).await;
    if waiter.finish().await.is_some_and(|held| !held.through) {
        run.notes
            .push("the waiter's hold did not survive the victim's release".into());
    }
    run.report(target, plan, released_at, granted).await
}

/// A waiter's connections are reset just before the holder releases (a missed pub/sub
/// message or watch event): the waiter must still get the lock, within its re-check bound.
pub async fn waiter_connection_reset(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let mut run = Waiting::new(scene.scenario);
    let holder = target.client(options(&plan)).await;
    let (client, link) = target.linked_client(options(&plan)).await;
    let (guard, section, seen) = run.hold(holder.as_ref()).await;
    let hold = sleep(SECTION);
    let mut waiter = run.queue_up(target, client, hold, plan).await;
    link.set_mode(ProxyMode::Reset);
    sleep(SECTION).await;
    section.finish(seen + 1, &guard);
    let released_at = Instant::now();
    let _ = guard.release().await;
    sleep(Duration::from_millis(50)).await;
    link.heal();
    let granted = waiter.granted("the waiter", &mut run.stalled).await;
    waiter.finish().await;
    run.report(target, plan, released_at, granted).await
}

/// Waiter A's connections stay reset (every connect refused) for longer than a waiter's
/// queue entry lives without contact — a Redis queue entry (2 x recheck + request
/// timeout), a ZooKeeper session or an etcd lease (the TTL) — while B waits behind it and
/// the holder releases. B must get the lock while A is still unreachable (A's link heals
/// only after B's grant); A, whose entry may be gone meanwhile, must queue again and get
/// the lock after B (not hang). Takeover: the holder's release → B's grant.
pub async fn waiter_long_connection_reset(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let mut run = Waiting::new(scene.scenario);
    let options = options(&plan);
    let outage = options.recheck * 2 + options.request_timeout + plan.ttl;
    let holder = target.client(options.clone()).await;
    let (first, link) = target.linked_client(options.clone()).await;
    let second = target.client(options.clone()).await;
    let (guard, section, seen) = run.hold(holder.as_ref()).await;
    let mut first = run.queue_up(target, first, sleep(SECTION), plan).await;
    let (let_go, hold) = oneshot::channel::<()>();
    let hold = async move {
        let _ = hold.await;
    };
    let mut second = run.queue_up(target, second, hold, plan).await;
    link.set_mode(ProxyMode::Reset);
    let reset_at = Instant::now();
    sleep(SECTION).await;
    section.finish(seen + 1, &guard);
    let released_at = Instant::now();
    let _ = guard.release().await;
    let granted = second
        .granted("waiter B, behind the unreachable A", &mut run.stalled)
        .await;
    sleep_until(reset_at + outage).await;
    let before = target.leftovers(std::slice::from_ref(&run.name)).await;
    link.heal();
    // Let A come back and queue again behind B before B lets go.
    shows_change(
        target,
        &run.name,
        &before,
        options.recheck + options.request_timeout,
    )
    .await;
    sleep(SETTLE).await;
    let _ = let_go.send(());
    let let_go_at = second.finish().await.map(|held| held.released);
    let back = first
        .granted("waiter A, back after the reset", &mut run.stalled)
        .await;
    if let (Some(back), Some(let_go_at)) = (back, let_go_at) {
        run.notes.push(format!(
            "waiter A, unreachable for {} ms, got the lock {} ms after B let go",
            ms(outage),
            ms(back.saturating_duration_since(let_go_at))
        ));
    }
    first.finish().await;
    run.report(target, plan, released_at, granted).await
}

/// A holder has the lock; waiter A queues, then B behind it; A's client crashes (its link
/// is cut for good, nothing it sends arrives, no cleanup), then the holder releases. B
/// must get the lock: the backend clears the dead head within its own bound (a queue's
/// hand-off window, A's session timeout or lease TTL, a re-check). Takeover: the holder's
/// release → B's grant.
pub async fn crashed_head_waiter(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let mut run = Waiting::new(scene.scenario);
    let holder = target.client(options(&plan)).await;
    let (head, link) = target.linked_client(options(&plan)).await;
    let behind = target.client(options(&plan)).await;
    // The holder's section spans the queueing: a waiter granted meanwhile overlaps it.
    let (guard, section, seen) = run.hold(holder.as_ref()).await;
    let crashed = run.queue_up(target, head, sleep(SECTION), plan).await;
    let mut next = run.queue_up(target, behind, sleep(SECTION), plan).await;
    link.crash().await;
    sleep(SECTION).await;
    section.finish(seen + 1, &guard);
    let released_at = Instant::now();
    let _ = guard.release().await;
    let granted = next
        .granted("waiter B, behind the crashed A", &mut run.stalled)
        .await;
    next.finish().await;
    let out = run.report(target, plan, released_at, granted).await;
    // The crashed client never comes back; its acquire is dropped only now.
    drop(crashed);
    out
}

/// What a waiter's task did after its grant.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The waiter still held the lock at the end of its section.
    through: bool,
    /// When it began its release.
    released: Instant,
}

/// A waiter acquiring in a task of its own: on its grant it works a section of the
/// resource until its `hold` future ends (or the lock is lost), then releases. Dropping
/// it drops the acquire (a cancellation).
struct Waiter {
    /// The instant of the grant, sent as soon as there is one.
    grant: oneshot::Receiver<Instant>,
    /// The acquire, section and release.
    task: Option<JoinHandle<lock_core::Result<Held>>>,
}

impl Waiter {
    fn spawn<F>(
        client: Arc<dyn DistributedLock>,
        name: &LockName,
        resource: &FencedResource,
        hold: F,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tell, grant) = oneshot::channel();
        let (name, resource) = (name.clone(), resource.clone());
        let task = tokio::spawn(async move {
            let guard = client.lock_timeout(name.as_str(), WAIT_LIMIT).await?;
            let _ = tell.send(Instant::now());
            let _ = resource.hold_section(&guard, hold).await;
            let through = guard.is_held();
            let released = Instant::now();
            let _ = guard.release().await;
            Ok(Held { through, released })
        });
        Waiter {
            grant,
            task: Some(task),
        }
    }

    /// The instant of the grant, waited for up to [`GRANT_LIMIT`]; a waiter without one
    /// is described in `stalled` (as `what`).
    async fn granted(&mut self, what: &str, stalled: &mut Vec<String>) -> Option<Instant> {
        match timeout(GRANT_LIMIT, &mut self.grant).await {
            Ok(Ok(at)) => return Some(at),
            Ok(Err(_)) => {
                // The task ended without a grant: say why.
                let ended = match self.task.take() {
                    Some(task) => format!("{:?}", task.await),
                    None => "ended".to_owned(),
                };
                stalled.push(format!("{what} never got the lock: {ended}"));
            }
            Err(_) => stalled.push(format!(
                "{what} did not get the lock within {GRANT_LIMIT:?}"
            )),
        }
        None
    }

    /// Waits (up to [`GRANT_LIMIT`]) for the end of the waiter's section and release.
    async fn finish(&mut self) -> Option<Held> {
        let task = self.task.as_mut()?;
        let ended = timeout(GRANT_LIMIT, task).await;
        if ended.is_ok() {
            // Ended: nothing left to abort on drop.
            self.task = None;
        }
        ended.ok()?.ok()?.ok()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Polls the target's leftovers for `name` until they differ from `before`, for up to
/// `bound`; whether they did.
async fn shows_change(
    target: &dyn ChaosTarget,
    name: &LockName,
    before: &[String],
    bound: Duration,
) -> bool {
    let give_up = Instant::now() + bound;
    loop {
        if target.leftovers(std::slice::from_ref(name)).await != before {
            return true;
        }
        if Instant::now() >= give_up {
            return false;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

fn ms(duration: Duration) -> u128 {
    duration.as_millis()
}
