//! The leader service under faults: services on the target's clients share one
//! election, each writing fenced sections of the resource while it leads and resigning
//! after half a TTL (not while a fault lasts, so that the victim's term ends by its
//! loss), so leadership turns; the victim's service starts first, and a fault strikes
//! the moment it leads (its link cut for 2 x TTL, which from the servers' side is also a process
//! paused that long; or every server crashed and restarted). The fence judges every
//! section; the victim's service must lead again after the fault (a requeue after the
//! loss), every service must stop on shutdown, and nothing may be left on the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{DistributedLock, Election, FencingToken, LeaderEvent, LeaderService, LockName};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use super::workload::{crash_members, first_start_above, options, report, SECTION};
use super::{ChaosTarget, Plan, ScenarioReport, Scene};
use conformance::fence::FencedResource;
use conformance::rules::unique_name;

/// The shortest a term's work lasts before the service resigns (else half the TTL).
const SHORTEST_TERM: Duration = Duration::from_millis(200);
/// How long the scenario waits for the victim's service to lead, before and after the
/// fault, and for a service to stop.
const PATIENCE: Duration = Duration::from_secs(30);

/// The fault of a service scenario.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The victim's link is cut for 2 x TTL.
    Silence,
    /// Every server is killed and restarted with its data after a quarter TTL.
    ServerCrash,
}

/// The victim's service is cut off for 2 x TTL while it leads: its work is cancelled
/// before another service leads, one of them takes over, and it leads again later.
pub async fn leader_service_partitioned(scene: Scene<'_>) -> ScenarioReport {
    service_scenario(scene, Fault::Silence).await
}

/// The victim's service stops answering for 2 x TTL while it leads (as a SIGSTOPped
/// process would: to the servers, silence), with the same promises.
pub async fn leader_service_paused(scene: Scene<'_>) -> ScenarioReport {
    service_scenario(scene, Fault::Silence).await
}

/// Every server is killed and restarted while the victim's service leads: the services
/// go on campaigning through the outage and lead again afterwards.
pub async fn leader_service_server_restart(scene: Scene<'_>) -> ScenarioReport {
    service_scenario(scene, Fault::ServerCrash).await
}

/// One running service: its task and what it reported.
struct Running {
    run: JoinHandle<lock_core::Result<lock_core::ServiceSummary>>,
    /// Elected events: when they came, and the term.
    elected: Arc<Mutex<Vec<(Instant, FencingToken)>>>,
    /// When its Campaigning events came.
    campaigned: Arc<Mutex<Vec<(Instant, FencingToken)>>>,
}

async fn service_scenario(scene: Scene<'_>, fault: Fault) -> ScenarioReport {
    let Scene {
        scenario,
        target,
        plan,
    } = scene;
    let name = unique_name(scenario);
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let note = |text: String| notes.lock().expect("notes").push(text);
    let (victim, link) = target.linked_client(options(&plan)).await;
    let mut clients = vec![victim];
    for _ in 0..plan.contenders.max(1) {
        clients.push(target.client(options(&plan)).await);
    }
    let (stop, stopped) = watch::channel(false);
    let faulting = Arc::new(AtomicBool::new(false));
    let mut stalled = Vec::new();
    let starting = Starting {
        name: &name,
        resource: &resource,
        plan,
        stopped: &stopped,
        faulting: &faulting,
    };
    // The victim's service leads first; the others queue behind it, and the fault strikes.
    let mut services = vec![starting.start(&clients[0], 0)];
    if led_since(&services[0], None, PATIENCE).await.is_none() {
        stalled.push(format!(
            "the victim's service did not lead within {PATIENCE:?}"
        ));
    }
    for (index, client) in clients.iter().enumerate().skip(1) {
        services.push(starting.start(client, index));
    }
    faulting.store(true, Ordering::SeqCst);
    let fault_at = Instant::now();
    let victim_term = services[0]
        .elected
        .lock()
        .expect("elected")
        .last()
        .map(|(_, term)| *term);
    match fault {
        Fault::Silence => {
            link.cut();
            sleep(plan.ttl * 2).await;
            link.heal();
        }
        Fault::ServerCrash => {
            let servers = target.servers();
            let all: Vec<usize> = (0..servers.len()).collect();
            crash_members(&servers, &all, false, plan.ttl / 4, &note).await;
        }
    }
    faulting.store(false, Ordering::SeqCst);
    let healed_at = Instant::now();
    // Requeue: the victim's service campaigns again once its term is lost, and where the
    // election is fair (in campaign order) leads again after the fault; an unfair one
    // (RedLock, Redis without its queue) may keep handing the term to the others. A term
    // lost while the link is still cut (a TTL below the cut's length) is followed by a
    // campaign that starts during the fault and goes on waiting after it: a requeue is a
    // campaign since the fault struck, not since it ended.
    let patience = PATIENCE + plan.ttl * 4;
    if clients[0].capabilities().fair {
        if led_since(&services[0], Some(healed_at), patience)
            .await
            .is_none()
        {
            stalled.push(format!(
                "the victim's service did not lead again within {patience:?} of the fault's end"
            ));
        }
    } else if since(&services[0].campaigned, Some(fault_at), patience)
        .await
        .is_none()
    {
        stalled.push(format!(
            "the victim's service did not campaign again within {patience:?} of the fault's end"
        ));
    } else if led_since(&services[0], Some(healed_at), patience)
        .await
        .is_none()
    {
        note(format!(
            "unfair election: the victim's service campaigned again but did not lead within \
             {patience:?} of the fault's end"
        ));
    }
    sleep(plan.contend.min(plan.ttl * 2)).await;
    let _ = stop.send(true);
    for (index, service) in services.into_iter().enumerate() {
        match timeout(PATIENCE, service.run).await {
            Ok(Ok(Ok(summary))) => note(format!(
                "service {index}: {} terms, {} lost",
                summary.terms, summary.lost
            )),
            Ok(Ok(Err(err))) => stalled.push(format!("service {index} ended with {err}")),
            Ok(Err(err)) => stalled.push(format!("service {index} panicked: {err}")),
            Err(_) => stalled.push(format!("service {index} did not stop within {PATIENCE:?}")),
        }
    }
    // Another term's first accepted section after the fault.
    let takeover = first_start_above(&resource, fault_at, victim_term);
    let recovery = recover_election(target, &name, plan, &mut stalled).await;
    let notes = notes.lock().expect("notes").clone();
    let mut out = report(scenario, target, &resource, recovery, notes);
    out.takeover = takeover.map(|at| at.saturating_duration_since(fault_at));
    out.stalled_waiters = stalled;
    out
}

/// What every service of a scenario shares.
struct Starting<'a> {
    name: &'a LockName,
    resource: &'a FencedResource,
    plan: Plan,
    stopped: &'a watch::Receiver<bool>,
    /// A fault is under way: a leader does not resign meanwhile.
    faulting: &'a Arc<AtomicBool>,
}

impl Starting<'_> {
    /// Starts the service of `client` (the `index`-th): each term writes sections of the
    /// resource fenced with the term for half the TTL (at least [`SHORTEST_TERM`]) and
    /// while a fault lasts, then resigns.
    fn start(&self, client: &Arc<dyn DistributedLock>, index: usize) -> Running {
        let election = Election::new(Arc::clone(client), self.name.as_str()).expect("an election");
        let plan = self.plan;
        let service = LeaderService::new(election, format!("service-{index}"))
            .with_backoff(Duration::from_millis(20), plan.ttl)
            .expect("valid pauses");
        let elected = Arc::new(Mutex::new(Vec::new()));
        let campaigned = Arc::new(Mutex::new(Vec::new()));
        let mut events = service.events();
        {
            let (elected, campaigned) = (Arc::clone(&elected), Arc::clone(&campaigned));
            tokio::spawn(async move {
                while let Some(event) = events.next().await {
                    let (list, term) = match event {
                        LeaderEvent::Elected { term } => (&elected, term),
                        LeaderEvent::Campaigning => (&campaigned, FencingToken(0)),
                        _ => continue,
                    };
                    list.lock().expect("events").push((Instant::now(), term));
                }
            });
        }
        let (resource, faulting) = (self.resource.clone(), Arc::clone(self.faulting));
        let mut stopped = self.stopped.clone();
        let run = tokio::spawn(async move {
            service
                .run(
                    |context| {
                        let (resource, faulting) = (resource.clone(), Arc::clone(&faulting));
                        async move {
                            let resign_at = Instant::now() + (plan.ttl / 2).max(SHORTEST_TERM);
                            while Instant::now() < resign_at || faulting.load(Ordering::SeqCst) {
                                // A stale term is turned away by the fence, which counts it.
                                let _ = resource
                                    .increment(context.fencing_token, sleep(SECTION))
                                    .await;
                            }
                        }
                    },
                    async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    },
                )
                .await
        });
        Running {
            run,
            elected,
            campaigned,
        }
    }
}

/// When `service` was first elected (after `after`, if given), waiting up to `limit`.
async fn led_since(service: &Running, after: Option<Instant>, limit: Duration) -> Option<Instant> {
    since(&service.elected, after, limit).await
}

/// When the first of `events` came (after `after`, if given), waiting up to `limit`.
async fn since(
    events: &Mutex<Vec<(Instant, FencingToken)>>,
    after: Option<Instant>,
    limit: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        let first = events
            .lock()
            .expect("events")
            .iter()
            .map(|(at, _)| *at)
            .find(|at| after.is_none_or(|after| *at > after));
        if first.is_some() {
            return first;
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// After the services stopped: nothing of theirs is left on the server, and a fresh
/// candidate leads within TTL plus a bound. How long that took.
async fn recover_election(
    target: &dyn ChaosTarget,
    name: &LockName,
    plan: Plan,
    stalled: &mut Vec<String>,
) -> Option<Duration> {
    let deadline = Instant::now() + plan.ttl * 3 + Duration::from_secs(10);
    let names = std::slice::from_ref(name);
    loop {
        let left = target.leftovers(names).await;
        if left.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            stalled.push(format!("the stopped services left {left:?}"));
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    let client = target.client(options(&plan)).await;
    let election = Election::new(client, name.as_str()).expect("an election");
    let started = Instant::now();
    let limit = plan.ttl * 3 + Duration::from_secs(10);
    match election.campaign_timeout("recovery", limit).await {
        Ok(leadership) => {
            let took = started.elapsed();
            let _ = leadership.resign().await;
            Some(took)
        }
        Err(err) => {
            stalled.push(format!("a fresh candidate did not lead: {err}"));
            None
        }
    }
}
