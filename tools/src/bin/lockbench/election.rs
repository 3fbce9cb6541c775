//! The leader-election workloads, on every backend whose clients grant election
//! candidates (`Capabilities::election`): an uncontended campaign, the failover after a
//! killed leader, how long a new leader takes to reach every observer, and two leader
//! services taking turns.

use std::sync::Arc;
use std::time::Duration;

use distlock::memory::{MemoryBackend, MemoryLock, MemorySpace};
use distlock::{
    AcquireOptions, DistributedLock, Election, LeaderEvent, LeaderService, Leadership, LockOptions,
};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, timeout_at, Instant};

use crate::error::BoxError;
use crate::stats::{Latencies, Summary};
use crate::targets::Target;
use crate::workloads::{
    bench_name, connect, takeover_query, HolderProcess, Plan, Takeover, MAX_ITERATIONS, QUEUE_UP,
    WAIT_LIMIT,
};

/// The uncontended campaign of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CampaignRun {
    /// Campaign sent → leading.
    pub(crate) campaign: Option<Summary>,
    /// Campaign + resign, the election's counterpart of a lock's acquire + release.
    pub(crate) cycle: Option<Summary>,
    pub(crate) cycles: u64,
    pub(crate) cycles_per_sec: f64,
}

/// Uncontended campaign: one client campaigns (a try, as the uncontended lock cycle
/// tries) and resigns in a loop on one election, for `plan.duration` after `plan.warmup`.
pub(crate) async fn campaign(target: &Target, plan: Plan) -> Result<CampaignRun, BoxError> {
    let client = connect(target, "").await?;
    let election = Election::new(client, &bench_name("campaign"))?;
    let options = AcquireOptions::try_once();
    let warm_until = Instant::now() + plan.warmup;
    let end = warm_until + plan.duration;
    let (mut campaign, mut cycle) = (Latencies::new(), Latencies::new());
    let mut cycles = 0;
    while Instant::now() < end && cycles < MAX_ITERATIONS {
        let started = Instant::now();
        let leadership = timeout(WAIT_LIMIT, election.campaign_with(CANDIDATES[0], &options))
            .await??
            .ok_or("an uncontended election had another leader")?;
        let leading = Instant::now();
        timeout(WAIT_LIMIT, leadership.resign()).await??;
        if started >= warm_until {
            campaign.record(leading - started);
            cycle.record(started.elapsed());
            cycles += 1;
        }
    }
    Ok(CampaignRun {
        campaign: campaign.summary(),
        cycle: cycle.summary(),
        cycles,
        cycles_per_sec: cycles as f64 / plan.duration.as_secs_f64(),
    })
}

/// The values the candidates of these workloads proclaim.
const CANDIDATES: [&str; 2] = ["lockbench-a", "lockbench-b"];

/// The TTL of the failover workload, as issue 25 asks (at least the target's takeover TTL).
const FAILOVER_TTL: Duration = Duration::from_secs(2);

/// Failover: a leader is killed (its process, with SIGKILL; an in-process client, cut off
/// from its space) while a second candidate waits; from the kill until that candidate
/// leads, per round, against the TTL.
pub(crate) async fn failover(target: &Target, rounds: usize) -> Result<Takeover, BoxError> {
    let ttl = target.takeover_ttl.max(FAILOVER_TTL);
    let query = takeover_query(ttl);
    let candidate_client = connect(target, &query).await?;
    let mut takeover_ms = Vec::new();
    for _ in 0..rounds {
        let name = bench_name("failover");
        let leader = KillableLeader::start(target, &query, &name, ttl).await?;
        let candidate = {
            let election = Election::new(Arc::clone(&candidate_client), &name)?;
            tokio::spawn(async move {
                let options = AcquireOptions::timeout(ttl * 4 + WAIT_LIMIT);
                let leadership = election
                    .campaign_with(CANDIDATES[1], &options)
                    .await?
                    .ok_or("the waiting candidate did not lead")?;
                let led = Instant::now();
                timeout(WAIT_LIMIT, leadership.resign()).await??;
                Ok::<_, BoxError>(led)
            })
        };
        sleep(QUEUE_UP).await;
        let killed = leader.kill().await?;
        let led = candidate.await??;
        takeover_ms.push(led.saturating_duration_since(killed).as_secs_f64() * 1000.0);
    }
    Ok(Takeover {
        ttl_ms: ttl.as_secs_f64() * 1000.0,
        takeover_ms,
    })
}

/// The leader of a failover round, on a client that can be killed.
enum KillableLeader {
    /// A `lockbench hold --campaign` process.
    Process(HolderProcess),
    /// An in-process client that leads, and is cut off from its space to crash it.
    InProcess(Arc<MemoryLock>, Leadership),
}

impl KillableLeader {
    /// A leader of election `name`, with clients of `ttl` (`query` on the target's URL).
    async fn start(
        target: &Target,
        query: &str,
        name: &str,
        ttl: Duration,
    ) -> Result<Self, BoxError> {
        if target.cross_process {
            let url = target.url_with(query);
            let process = HolderProcess::spawn(&url, name, Some(CANDIDATES[0])).await?;
            return Ok(KillableLeader::Process(process));
        }
        let space = target
            .memory_space()
            .ok_or("an in-process backend that lockbench cannot cut off")?;
        let mut options = LockOptions::default();
        options.ttl = ttl;
        let client = Arc::new(MemoryBackend::client(MemorySpace::named(space), options)?);
        let election = Election::new(Arc::clone(&client) as Arc<dyn DistributedLock>, name)?;
        let leadership = timeout(
            WAIT_LIMIT,
            election.campaign_with(CANDIDATES[0], &AcquireOptions::timeout(WAIT_LIMIT)),
        )
        .await??
        .ok_or("the first candidate did not lead")?;
        Ok(KillableLeader::InProcess(client, leadership))
    }

    /// Kills the leader; returns when it was killed.
    async fn kill(self) -> Result<Instant, BoxError> {
        match self {
            KillableLeader::Process(process) => process.kill().await,
            KillableLeader::InProcess(client, leadership) => {
                client.backend().crash();
                let killed = Instant::now();
                // Its resign hangs with the client; the hold ends by TTL.
                drop(leadership);
                Ok(killed)
            }
        }
    }
}

/// Observer notification of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NotifyRun {
    pub(crate) observers: usize,
    /// Hand-overs measured: resigns after the warm-up whose new term every observer
    /// reported within [`NOTIFY_LIMIT`].
    pub(crate) rounds: u64,
    /// The new leader's campaign returned → the last observer reported its term (0 when
    /// every observer reported it before the campaign returned).
    pub(crate) from_grant: Option<Summary>,
    /// Resign sent → the last observer reported the new term.
    pub(crate) from_resign: Option<Summary>,
    /// Hand-overs after the warm-up whose new term some observer had not reported within
    /// [`NOTIFY_LIMIT`]: a push that went missing (observers re-read only every
    /// [`OBSERVER_RECHECK`]).
    pub(crate) missed: u64,
}

/// The observers' re-read interval: long, so that a missing push shows as a miss rather
/// than as a poll.
const OBSERVER_RECHECK: &str = "60s";
/// Bound on the wait for every observer to report a new term.
const NOTIFY_LIMIT: Duration = Duration::from_secs(2);

/// Observer notification: `observers` observers, each on a client of its own, follow one
/// election while two candidates hand leadership back and forth (the leader resigns once
/// the other candidate is queued and every observer reported it), for `plan.duration`
/// after `plan.warmup`; per hand-over, the time until the last observer reported the new
/// term.
pub(crate) async fn notify(
    target: &Target,
    observers: usize,
    plan: Plan,
) -> Result<NotifyRun, BoxError> {
    let name = bench_name("observe");
    let clients = [connect(target, "").await?, connect(target, "").await?];
    let elections = [
        Election::new(Arc::clone(&clients[0]), &name)?,
        Election::new(Arc::clone(&clients[1]), &name)?,
    ];
    let options = AcquireOptions::timeout(WAIT_LIMIT);
    let mut leader = timeout(
        WAIT_LIMIT,
        elections[0].campaign_with(CANDIDATES[0], &options),
    )
    .await??
    .ok_or("the first candidate did not lead")?;
    let mut leading = 0;
    let query = format!("recheck={OBSERVER_RECHECK}");
    let mut followers = Vec::with_capacity(observers);
    for _ in 0..observers {
        let election = Election::new(connect(target, &query).await?, &name)?;
        followers.push(Follower::start(&election));
    }
    if all_reported(&mut followers, leader.term().0, Instant::now() + WAIT_LIMIT)
        .await?
        .is_none()
    {
        return Err("the observers did not report the first leader".into());
    }
    let warm_until = Instant::now() + plan.warmup;
    let end = warm_until + plan.duration;
    let (mut from_grant, mut from_resign) = (Latencies::new(), Latencies::new());
    let (mut rounds, mut missed) = (0, 0);
    while Instant::now() < end && rounds < MAX_ITERATIONS {
        let next = 1 - leading;
        let candidate = {
            let (election, options) = (elections[next].clone(), options.clone());
            tokio::spawn(async move {
                let leadership = election
                    .campaign_with(CANDIDATES[next], &options)
                    .await?
                    .ok_or("the waiting candidate did not lead")?;
                Ok::<_, BoxError>((leadership, Instant::now()))
            })
        };
        queued(clients[leading].as_ref(), &elections[leading]).await?;
        let resign_sent = Instant::now();
        timeout(WAIT_LIMIT, leader.resign()).await??;
        let (new_leader, granted) = candidate.await??;
        let term = new_leader.term().0;
        let seen = all_reported(&mut followers, term, granted + NOTIFY_LIMIT).await?;
        if resign_sent >= warm_until {
            match seen {
                Some(last) => {
                    from_grant.record(last.saturating_duration_since(granted));
                    from_resign.record(last.saturating_duration_since(resign_sent));
                    rounds += 1;
                }
                None => missed += 1,
            }
        }
        (leader, leading) = (new_leader, next);
    }
    timeout(WAIT_LIMIT, leader.resign()).await??;
    for follower in followers {
        follower.stop().await?;
    }
    Ok(NotifyRun {
        observers,
        rounds,
        from_grant: from_grant.summary(),
        from_resign: from_resign.summary(),
        missed,
    })
}

/// An observer of the notification workload, in a task of its own.
struct Follower {
    /// The highest term it reported, and when it first did.
    reported: watch::Receiver<Option<(u64, Instant)>>,
    task: JoinHandle<Result<(), BoxError>>,
}

impl Follower {
    /// Starts following `election`; the task ends when the [`Follower`] is dropped or
    /// stopped.
    fn start(election: &Election) -> Self {
        let (tx, reported) = watch::channel(None);
        let mut observer = election.observe();
        let task = tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    () = tx.closed() => return Ok(()),
                    change = observer.next() => change?,
                };
                let now = Instant::now();
                if let Some(leader) = change {
                    tx.send_if_modified(|last| {
                        let newer = last.is_none_or(|(term, _)| leader.term.0 > term);
                        if newer {
                            *last = Some((leader.term.0, now));
                        }
                        newer
                    });
                }
            }
        });
        Follower { reported, task }
    }

    /// Stops following, with the error that ended the observer, if one did.
    async fn stop(self) -> Result<(), BoxError> {
        let Follower { reported, task } = self;
        drop(reported);
        timeout(WAIT_LIMIT, task).await???;
        Ok(())
    }
}

/// When the last of `followers` reported `term` (or a later one), if all did by `deadline`.
/// An observer that ended is an error (its own).
async fn all_reported(
    followers: &mut [Follower],
    term: u64,
    deadline: Instant,
) -> Result<Option<Instant>, BoxError> {
    let mut last = None;
    for follower in followers.iter_mut() {
        let waited = timeout_at(
            deadline,
            follower
                .reported
                .wait_for(|seen| seen.is_some_and(|(seen, _)| seen >= term)),
        )
        .await
        .map(|seen| seen.map(|seen| *seen));
        let at = match waited {
            Err(_) => return Ok(None),
            Ok(Ok(seen)) => seen.map(|(_, at)| at),
            Ok(Err(_)) => {
                let failure = match timeout(WAIT_LIMIT, &mut follower.task).await {
                    Ok(Ok(Err(err))) => err.to_string(),
                    _ => "ended".into(),
                };
                return Err(format!("an observer failed: {failure}").into());
            }
        };
        last = last.max(at);
    }
    Ok(last)
}

/// Waits until the server shows a candidate queued behind the leader of `election`, at
/// most [`QUEUE_UP`] (backends whose waiters leave no trace on the server show none).
async fn queued(client: &dyn DistributedLock, election: &Election) -> Result<(), BoxError> {
    let give_up = Instant::now() + QUEUE_UP;
    while Instant::now() < give_up {
        let occupancy = timeout(WAIT_LIMIT, client.inspect(election.name())).await??;
        if !occupancy.waiters.is_empty() {
            return Ok(());
        }
        sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// How long a term's work lasts in the leader service workload: longer than the longest
/// pause before a campaign, so that the other service is queued when it ends.
const SERVICE_TERM: Duration = Duration::from_millis(25);

/// Two leader services taking turns, in one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServiceRun {
    /// Hand-overs measured after the warm-up: one service's resign followed by the
    /// other's election.
    pub(crate) turns: u64,
    /// The end of one service's term's work → the other service leads (its `Elected`
    /// event): the resign, the hand-off to the queued campaign and the event.
    pub(crate) handover: Option<Summary>,
    pub(crate) turns_per_sec: f64,
}

/// Leader service turns: two `LeaderService`s on clients of their own share one election;
/// each term's work lasts [`SERVICE_TERM`], then returns (a resign), and the service
/// campaigns again after a jittered pause below 1 ms (back to that after every term longer
/// than the longest pause, 20 ms), so the other service is queued when a term ends and
/// leadership goes back and forth. For
/// `plan.duration` after `plan.warmup`, per hand-over, the time from the end of one
/// service's work (as the work itself notes it) to the other's `Elected`.
pub(crate) async fn service_turns(target: &Target, plan: Plan) -> Result<ServiceRun, BoxError> {
    let name = bench_name("service");
    let (stop, stopped) = watch::channel(false);
    let (tell, mut heard) = mpsc::unbounded_channel::<(usize, LeaderEvent, Instant)>();
    let work_ended: Arc<std::sync::Mutex<Option<(usize, Instant)>>> = Arc::default();
    let mut runs = Vec::new();
    for (index, value) in CANDIDATES.iter().enumerate() {
        let election = Election::new(connect(target, "").await?, &name)?;
        let service = LeaderService::new(election, *value)
            .with_backoff(Duration::from_millis(1), Duration::from_millis(20))?;
        let mut events = service.events();
        let tell = tell.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if tell.send((index, event, Instant::now())).is_err() {
                    return;
                }
            }
        });
        let mut stopped = stopped.clone();
        let work_ended = Arc::clone(&work_ended);
        runs.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            let work = |_| {
                let work_ended = Arc::clone(&work_ended);
                async move {
                    sleep(SERVICE_TERM).await;
                    *work_ended.lock().expect("work ended") = Some((index, Instant::now()));
                }
            };
            service.run(work, shutdown).await
        }));
    }
    drop(tell);
    let warm_until = Instant::now() + plan.warmup;
    let end = warm_until + plan.duration;
    let mut handover = Latencies::new();
    let mut turns = 0;
    while Instant::now() < end && turns < MAX_ITERATIONS {
        let Ok(Some((index, event, at))) = timeout_at(end, heard.recv()).await else {
            break;
        };
        if let LeaderEvent::Elected { .. } = event {
            let ended = work_ended.lock().expect("work ended").take();
            if let Some((from, ended)) = ended {
                if from != index && ended >= warm_until {
                    handover.record(at.saturating_duration_since(ended));
                    turns += 1;
                }
            }
        }
    }
    let _ = stop.send(true);
    for run in runs {
        timeout(WAIT_LIMIT, run).await???;
    }
    Ok(ServiceRun {
        turns,
        handover: handover.summary(),
        turns_per_sec: turns as f64 / plan.duration.as_secs_f64(),
    })
}
