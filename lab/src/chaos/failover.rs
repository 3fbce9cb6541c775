//! Scenarios of replicated deployments, where watchers promote a replica when a primary
//! is lost and replication is asynchronous: the primary killed while a victim holds the
//! lock, the primary cut off from its replicas before a grant and then killed, and a
//! split brain in which the old primary keeps serving the victim while a replica is
//! promoted for everyone else; and on a sharded cluster, the slot of a held and contended
//! lock moved to another primary.
//!
//! The victim holds the lock with a TTL above the failover time
//! ([`OUTLIVES_FAILOVER`]): a hold the promoted replica lacks is then still vouched for
//! by its guard when the replica starts granting, which is the double grant these
//! scenarios look for. Like the other victims it writes once, late and blind (as a paused
//! process would), and the fence decides.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, LockGuard, LockName, LockState};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};

use super::workload::{
    contend_until, first_other_start, options_with, recover, signed_ms, watch_lost, LostAt,
};
use super::{ChaosTarget, Plan, ScenarioReport, Scene};
use conformance::fence::{FencedResource, SectionHandle};
use conformance::rules::unique_name;

/// The victim's TTL: above the time the harness's Sentinels take to promote a replica
/// (down-after 1 s, then an election: about 2.5 s), so that the victim's guard outlives
/// the failover.
const OUTLIVES_FAILOVER: Duration = Duration::from_secs(5);
/// Bound on a promotion.
const PROMOTION_LIMIT: Duration = Duration::from_secs(30);
/// How long the split brain lasts once both primaries can grant.
const OVERLAP: Duration = Duration::from_secs(1);
/// How long contenders go on once the victim is done.
const AFTERWARDS: Duration = Duration::from_secs(1);
/// How long after its due time a renewal has surely been answered by the new primary.
const RENEWAL_SLACK: Duration = Duration::from_millis(500);
/// How much later than its TTL allows a guard may turn Lost (a renewal round trip, a
/// reconnection through the watchers, a busy scheduler).
const LOST_SLACK: Duration = Duration::from_secs(3);
/// How long the Sentinels leave a returning old primary a primary before they demote it
/// (four hello periods of 2 s: they wait for newer configurations first).
const DEMOTION: Duration = Duration::from_secs(8);

type Notes = Arc<Mutex<Vec<String>>>;

fn note(notes: &Notes, text: String) {
    notes.lock().expect("notes").push(text);
}

/// A victim in its critical section: read done, write pending, its loss watched.
struct Victim {
    guard: LockGuard,
    section: SectionHandle,
    seen: u64,
    lost_at: LostAt,
    lost_task: JoinHandle<()>,
}

impl Victim {
    /// One attempt at the free lock (a refusal is not retried); `Err` says why it failed.
    async fn acquire(
        client: &dyn DistributedLock,
        name: &LockName,
        resource: &FencedResource,
    ) -> Result<Self, String> {
        let guard = match client.try_lock(name.as_str()).await {
            Ok(Some(guard)) => guard,
            Ok(None) => return Err("the free lock was held".into()),
            Err(err) => return Err(err.to_string()),
        };
        let section = resource
            .begin(guard.fencing_token())
            .expect("the victim's token is the highest");
        let seen = section.read();
        let (lost_at, lost_task) = watch_lost(&guard);
        Ok(Self {
            guard,
            section,
            seen,
            lost_at,
            lost_task,
        })
    }

    /// Waits until the guard is Lost, for at most `limit`; `None` if it is not by then.
    async fn lost_within(&self, limit: Duration) -> Option<Instant> {
        let give_up = Instant::now() + limit;
        loop {
            if let Some((at, _)) = *self.lost_at.lock().expect("lost") {
                return Some(at);
            }
            if Instant::now() >= give_up {
                return None;
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes without looking, ends the section and releases: whether the write was
    /// accepted, and when (if ever) the guard stopped vouching.
    async fn finish(self, report: &mut ScenarioReport) -> Option<Instant> {
        report.victim_write_accepted = Some(self.section.write(self.seen + 1).is_ok());
        self.section.end();
        let lost = *self.lost_at.lock().expect("lost");
        report.victim_lost = match self.guard.state() {
            LockState::Lost(reason) => Some(reason),
            _ => None,
        };
        let _ = self.guard.release().await;
        self.lost_task.abort();
        lost.map(|(at, _)| at)
    }
}

/// Healthy contenders that follow the watchers, until [`Contention::finish`].
struct Contention {
    until: watch::Sender<Instant>,
    task: JoinHandle<()>,
}

impl Contention {
    async fn start(
        target: &dyn ChaosTarget,
        ttl: Duration,
        plan: Plan,
        name: &LockName,
        resource: &FencedResource,
        notes: &Notes,
    ) -> Self {
        let mut clients = Vec::new();
        for _ in 0..plan.contenders {
            clients.push(target.client(options_with(ttl, &plan)).await);
        }
        let (until, deadline) = watch::channel(Instant::now() + PROMOTION_LIMIT * 2);
        let task = tokio::spawn(contend_until(
            clients,
            name.clone(),
            resource.clone(),
            deadline,
            Arc::clone(notes),
        ));
        Self { until, task }
    }

    async fn finish(self, notes: &Notes) {
        self.until.send_replace(Instant::now() + AFTERWARDS);
        if let Err(err) = self.task.await {
            note(notes, format!("contention panicked: {err}"));
        }
    }
}

/// The fault's bookkeeping, shared by the scenarios: kill `primary`, wait for the
/// promotion, restart the old primary (it rejoins as a replica).
async fn kill_and_promote(
    target: &dyn ChaosTarget,
    name: &LockName,
    primary: usize,
    notes: &Notes,
) -> (Instant, Option<Duration>) {
    let servers = target.servers();
    let killed_at = Instant::now();
    if let Err(err) = servers[primary].kill9().await {
        note(notes, format!("kill {}: {err}", servers[primary].label()));
    }
    let promotion = promote(target, name, primary, killed_at, notes).await;
    if let Err(err) = servers[primary].restart().await {
        note(
            notes,
            format!("restart {}: {err}", servers[primary].label()),
        );
    }
    (killed_at, promotion)
}

/// Waits for a replica to take over from `primary`; the time since `fault_at`.
async fn promote(
    target: &dyn ChaosTarget,
    name: &LockName,
    primary: usize,
    fault_at: Instant,
    notes: &Notes,
) -> Option<Duration> {
    match target.promoted(name, primary, PROMOTION_LIMIT).await {
        Some(promoted) => {
            let took = fault_at.elapsed();
            note(
                notes,
                format!("server {promoted} promoted in place of server {primary} after {took:?}"),
            );
            Some(took)
        }
        None => {
            note(notes, format!("no promotion within {PROMOTION_LIMIT:?}"));
            None
        }
    }
}

/// What a failover scenario keeps: its lock, the resource, the notes, the victim's TTL.
struct Run<'a> {
    scenario: &'static str,
    target: &'a dyn ChaosTarget,
    plan: Plan,
    ttl: Duration,
    name: LockName,
    resource: FencedResource,
    notes: Notes,
}

impl<'a> Run<'a> {
    fn new(scene: Scene<'a>) -> Self {
        let Scene {
            scenario,
            target,
            plan,
        } = scene;
        Self {
            scenario,
            target,
            plan,
            ttl: plan.ttl.max(OUTLIVES_FAILOVER),
            name: unique_name(scenario),
            resource: FencedResource::new(),
            notes: Notes::default(),
        }
    }

    async fn victim(&self, client: &dyn DistributedLock) -> Result<Victim, String> {
        Victim::acquire(client, &self.name, &self.resource).await
    }

    /// A victim of a plain client holding the lock, and contenders waiting for it.
    async fn held_and_contended(&self) -> (Victim, Contention) {
        let client = self.target.client(options_with(self.ttl, &self.plan)).await;
        let victim = self
            .victim(&*client)
            .await
            .expect("the victim acquires a free lock");
        (victim, self.contention().await)
    }

    async fn contention(&self) -> Contention {
        let (target, ttl, plan) = (self.target, self.ttl, self.plan);
        let contention =
            Contention::start(target, ttl, plan, &self.name, &self.resource, &self.notes).await;
        sleep(Duration::from_millis(300)).await;
        contention
    }

    fn report(&self, promotion: Option<Duration>) -> ScenarioReport {
        let resource = FencedResource::new();
        let mut report =
            super::workload::report(self.scenario, self.target, &resource, None, Vec::new());
        report.promotion = promotion;
        report
    }

    /// The victim's state once a renewal after the `fault` has surely been answered.
    async fn after_a_renewal(&self, victim: &Victim, fault: &str) -> LockState {
        sleep(self.ttl / 3 + RENEWAL_SLACK).await;
        let state = victim.guard.state();
        note(
            &self.notes,
            format!("the victim's hold after the {fault}: {state:?}"),
        );
        state
    }

    /// The victim must turn Lost within `limit` of `known_at` (when it could first learn
    /// its hold was gone): records how long it took, or that it did not.
    async fn lost_by(
        &self,
        victim: &Victim,
        known_at: Instant,
        limit: Duration,
        report: &mut ScenarioReport,
    ) {
        let wait = (known_at + limit).saturating_duration_since(Instant::now());
        match victim.lost_within(wait).await {
            Some(at) => report.lost_after = Some(at.saturating_duration_since(known_at)),
            None => report.lost_late.push(format!(
                "the victim was still {:?} {:?} after it could know its hold was gone",
                victim.guard.state(),
                known_at.elapsed()
            )),
        }
    }

    /// Ends the victim (if any) and the contention, checks recovery, and fills `report`.
    async fn end(
        self,
        victim: Option<Victim>,
        contention: Contention,
        fault_at: Instant,
        mut report: ScenarioReport,
    ) -> ScenarioReport {
        let lost_at = match victim {
            Some(victim) => victim.finish(&mut report).await,
            None => None,
        };
        contention.finish(&self.notes).await;
        let other = first_other_start(&self.resource, fault_at);
        report.lost_signal_lead_ms = lost_at
            .zip(other)
            .map(|(lost, other)| signed_ms(other, lost));
        report.takeover = other.map(|at| at - fault_at);
        report.recovery = recover(self.target, &self.name, self.plan).await;
        report.fence = self.resource.check();
        report.notes = self.notes.lock().expect("notes").clone();
        report
    }
}

/// The primary is killed (SIGKILL) while the victim holds the lock and contenders wait:
/// the watchers promote a replica and every client follows. A hold whose key reached the
/// replica survives (its renewal finds it on the new primary); one whose key did not is
/// granted again and its guard turns Lost at its next renewal. The old primary restarts
/// and rejoins as a replica.
pub async fn primary_killed_while_holding(scene: Scene<'_>) -> Option<ScenarioReport> {
    let run = Run::new(scene);
    let primary = run.target.primary(&run.name).await?;
    let (victim, contention) = run.held_and_contended().await;
    let (fault_at, promotion) = kill_and_promote(run.target, &run.name, primary, &run.notes).await;
    let mut report = run.report(promotion);
    // The victim's next renewal reaches the new primary: Held if its key is there, Lost
    // (the key is gone or another's) otherwise.
    let known_at = fault_at + promotion.unwrap_or(PROMOTION_LIMIT);
    if run.after_a_renewal(&victim, "failover").await != LockState::Held {
        run.lost_by(&victim, known_at, run.ttl + LOST_SLACK, &mut report)
            .await;
    }
    Some(run.end(Some(victim), contention, fault_at, report).await)
}

/// The primary is cut off from its replicas (their replication links blackholed; the
/// watchers and the clients still reach it); the victim acquires during the cut, so its
/// grant lives on the primary alone (unless the deployment waits for replicas, which
/// then refuses it); then the primary is killed and a replica promoted.
pub async fn primary_partitioned_from_replicas(scene: Scene<'_>) -> Option<ScenarioReport> {
    let run = Run::new(scene);
    let primary = run.target.primary(&run.name).await?;
    let link = run.target.replication_link(primary)?;
    let client = run.target.client(options_with(run.ttl, &run.plan)).await;
    link.cut();
    let victim = run
        .victim(&*client)
        .await
        .inspect_err(|err| {
            note(
                &run.notes,
                format!("the victim's grant during the cut: {err}"),
            )
        })
        .ok();
    let contention = run.contention().await;
    sleep(Duration::from_millis(200)).await;
    let granted = run.resource.sections().len();
    note(
        &run.notes,
        format!("{granted} sections began during the cut"),
    );
    let (fault_at, promotion) = kill_and_promote(run.target, &run.name, primary, &run.notes).await;
    link.heal();
    let mut report = run.report(promotion);
    if let Some(victim) = &victim {
        // The promoted replica never had the victim's key: its next renewal finds it gone.
        let known_at = fault_at + promotion.unwrap_or(PROMOTION_LIMIT);
        run.lost_by(victim, known_at, run.ttl / 3 + LOST_SLACK, &mut report)
            .await;
    }
    Some(run.end(victim, contention, fault_at, report).await)
}

/// Split brain: the primary is cut off from the watchers, its replicas and the clients
/// that find it through the watchers, but the victim still reaches it. The watchers
/// promote a replica, contenders follow and are granted the name there, while the old
/// primary goes on renewing the victim's hold. After the partition heals the watchers
/// demote the old primary and the victim's guard must turn Lost.
pub async fn sentinel_split_brain(scene: Scene<'_>) -> Option<ScenarioReport> {
    let run = Run::new(scene);
    let primary = run.target.primary(&run.name).await?;
    let isolation = run.target.isolation_link(primary)?;
    let (client, _own_path) = run
        .target
        .linked_client(options_with(run.ttl, &run.plan))
        .await;
    let victim = run
        .victim(&*client)
        .await
        .expect("the victim acquires a free lock");
    let contention = run.contention().await;
    let fault_at = Instant::now();
    isolation.cut();
    let promotion = promote(run.target, &run.name, primary, fault_at, &run.notes).await;
    let mut report = run.report(promotion);
    // Both primaries grant: the contenders on the new one once the victim's key expired
    // there (its renewals stopped reaching the replica at the cut), while the old one
    // keeps renewing the victim's hold.
    let both = fault_at + promotion.unwrap_or(PROMOTION_LIMIT).max(run.ttl) + OVERLAP;
    sleep_until(both).await;
    let state = victim.guard.state();
    note(
        &run.notes,
        format!("the victim's guard during the split brain: {state:?}"),
    );
    isolation.heal();
    let healed_at = Instant::now();
    run.lost_by(
        &victim,
        healed_at,
        DEMOTION + run.ttl + LOST_SLACK,
        &mut report,
    )
    .await;
    Some(run.end(Some(victim), contention, fault_at, report).await)
}

/// The hash slot of the victim's lock moves to another primary while the victim holds it
/// and contenders wait: marked migrating, its keys moved (the lock key, its fencing
/// counter and queue share the slot), then handed over, a third of the TTL apart, so
/// that renewals and attempts meet each step (`ASK`, then `MOVED`). A move is not a
/// failover: nothing is lost, the victim stays Held throughout, and the next holder is
/// granted only after its release.
pub async fn slot_migration_while_held(scene: Scene<'_>) -> Option<ScenarioReport> {
    let run = Run::new(scene);
    let (victim, contention) = run.held_and_contended().await;
    let fault_at = Instant::now();
    match run.target.migrate(&run.name, run.ttl / 3).await? {
        Ok(moved) => note(&run.notes, moved),
        Err(err) => note(&run.notes, format!("the move failed: {err}")),
    }
    // A renewal after the hand-over goes where MOVED sends it.
    let mut report = run.report(None);
    let state = run.after_a_renewal(&victim, "move").await;
    if state != LockState::Held {
        report.lost_late.push(format!(
            "a slot move is no failover, yet the victim's hold is {state:?}"
        ));
    }
    Some(run.end(Some(victim), contention, fault_at, report).await)
}
