//! Safety under faults: scenarios that break servers, networks and holders while
//! contenders fight over a lock guarding a [`FencedResource`], then check what the
//! resource saw.
//!
//! Each scenario has a *victim* (a holder whose client, link or server the fault hits)
//! and healthy *contenders* that keep acquiring, writing and releasing. A victim that
//! loses its lock is also told so (its lost signal); a victim that cannot look (a paused
//! process) writes anyway, and the fence must turn it away. [`ScenarioReport`] holds what
//! the checker found; [`expectation`] says what each backend topology promises, so a
//! test asserts exactly the documented guarantee — no more, no less.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use lock_core::memory::MemoryLock;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, LockName, LockOptions, LockState,
    LostReason,
};
use tokio::time::{sleep, timeout, Instant};

use crate::factory::Factory;
use crate::fence::{FenceReport, FencedResource};
use crate::harness::{EtcdServer, HarnessError, RedisServer, ZkServer};
use crate::proxy::{FaultProxy, ProxyMode};
use crate::rules::unique_name;

/// How a backend is deployed; selects the scenarios that apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// In-process (`memory://`): no servers, no network.
    InProcess,
    /// One server (single Redis; standalone ZooKeeper; one etcd member).
    Single {
        /// Locks survive a server crash and restart (ZooKeeper, etcd; Redis only with
        /// persistence).
        durable: bool,
    },
    /// A consensus cluster (ZooKeeper ensemble, etcd cluster).
    Quorum {
        /// Cluster size.
        members: usize,
    },
    /// Independent nodes with client-side quorum (RedLock).
    Independent {
        /// Number of nodes.
        nodes: usize,
    },
}

/// The network path of one client, where faults are injected.
#[derive(Clone)]
pub enum Link {
    /// An in-process client, cut off and healed by its backend.
    Memory(Arc<MemoryLock>),
    /// A client whose connections pass through fault proxies (one per server).
    Proxies(Arc<Vec<FaultProxy>>),
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Memory(_) => f.write_str("Link::Memory"),
            Link::Proxies(p) => write!(f, "Link::Proxies({})", p.len()),
        }
    }
}

impl Link {
    /// Cuts the client off (network partition; no reply, no close).
    pub fn cut(&self) {
        match self {
            Link::Memory(client) => client.backend().partition(true),
            Link::Proxies(proxies) => proxies
                .iter()
                .for_each(|p| p.set_mode(ProxyMode::Blackhole)),
        }
    }

    /// Restores normal traffic.
    pub fn heal(&self) {
        match self {
            Link::Memory(client) => client.backend().partition(false),
            Link::Proxies(proxies) => proxies.iter().for_each(|p| p.set_mode(ProxyMode::Pass)),
        }
    }

    /// Sets a proxy mode on every proxy; `false` for in-process links, which have none.
    pub fn set_mode(&self, mode: ProxyMode) -> bool {
        match self {
            Link::Memory(_) => false,
            Link::Proxies(proxies) => {
                proxies.iter().for_each(|p| p.set_mode(mode));
                true
            }
        }
    }
}

/// Fault control of one server process.
#[async_trait]
pub trait ServerControl: Send + Sync {
    /// For messages.
    fn label(&self) -> String;
    /// SIGKILL.
    async fn kill9(&self) -> Result<(), HarnessError>;
    /// Starts it again on the same ports and data.
    async fn restart(&self) -> Result<(), HarnessError>;
    /// Starts it again on the same ports with its data wiped (Redis without persistence
    /// behaves like this on every restart). Default: same as [`ServerControl::restart`].
    async fn restart_wiped(&self) -> Result<(), HarnessError> {
        self.restart().await
    }
    /// SIGSTOP.
    fn pause(&self) -> Result<(), HarnessError>;
    /// SIGCONT.
    fn resume(&self) -> Result<(), HarnessError>;
    /// Keeps a copy of its data (a backup, or what a lagging replica holds) for
    /// [`ServerControl::restart_from_snapshot`]. Default: unsupported (an error).
    async fn save_snapshot(&self) -> Result<(), HarnessError> {
        Err(HarnessError::io(
            &self.label(),
            "save a snapshot",
            std::io::ErrorKind::Unsupported.into(),
        ))
    }
    /// Starts it again from the last snapshot: every write since is lost. Default:
    /// unsupported (an error).
    async fn restart_from_snapshot(&self) -> Result<(), HarnessError> {
        Err(HarnessError::io(
            &self.label(),
            "restart from a snapshot",
            std::io::ErrorKind::Unsupported.into(),
        ))
    }
}

#[async_trait]
impl ServerControl for RedisServer {
    fn label(&self) -> String {
        self.url()
    }
    async fn kill9(&self) -> Result<(), HarnessError> {
        RedisServer::kill9(self).await
    }
    async fn restart(&self) -> Result<(), HarnessError> {
        RedisServer::restart(self).await
    }
    async fn restart_wiped(&self) -> Result<(), HarnessError> {
        RedisServer::restart_wiped(self).await
    }
    fn pause(&self) -> Result<(), HarnessError> {
        RedisServer::pause(self)
    }
    fn resume(&self) -> Result<(), HarnessError> {
        RedisServer::resume(self)
    }
    async fn save_snapshot(&self) -> Result<(), HarnessError> {
        RedisServer::save_snapshot(self).await
    }
    async fn restart_from_snapshot(&self) -> Result<(), HarnessError> {
        RedisServer::restart_from_snapshot(self).await
    }
}

#[async_trait]
impl ServerControl for ZkServer {
    fn label(&self) -> String {
        self.url()
    }
    async fn kill9(&self) -> Result<(), HarnessError> {
        ZkServer::kill9(self).await
    }
    async fn restart(&self) -> Result<(), HarnessError> {
        ZkServer::restart(self).await
    }
    fn pause(&self) -> Result<(), HarnessError> {
        ZkServer::pause(self)
    }
    fn resume(&self) -> Result<(), HarnessError> {
        ZkServer::resume(self)
    }
}

#[async_trait]
impl ServerControl for EtcdServer {
    fn label(&self) -> String {
        self.url()
    }
    async fn kill9(&self) -> Result<(), HarnessError> {
        EtcdServer::kill9(self).await
    }
    async fn restart(&self) -> Result<(), HarnessError> {
        EtcdServer::restart(self).await
    }
    fn pause(&self) -> Result<(), HarnessError> {
        EtcdServer::pause(self)
    }
    fn resume(&self) -> Result<(), HarnessError> {
        EtcdServer::resume(self)
    }
}

/// A backend deployment the scenarios can break.
#[async_trait]
pub trait ChaosTarget: Factory {
    /// How it is deployed.
    fn topology(&self) -> Topology;

    /// A new client whose traffic can be faulted.
    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link);

    /// The servers, in a stable order (empty in-process).
    fn servers(&self) -> Vec<&dyn ServerControl>;

    /// Index of the current leader in [`ChaosTarget::servers`], for consensus clusters.
    async fn leader(&self) -> Option<usize> {
        None
    }

    /// A new client that reaches one follower only, and as its link that follower's
    /// links to its peers: cut, they cut the follower off from the quorum while the
    /// client still reaches it. `None` where the deployment cannot do that.
    async fn follower_link(
        &self,
        _options: LockOptions,
    ) -> Option<(Arc<dyn DistributedLock>, Link)> {
        None
    }
}

/// What a topology promises in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No overlapping accepted sections, no lost update, bounded takeover.
    Safe,
    /// Mutual exclusion may be lost for the documented reason; the fence must still
    /// turn the stale writer away, so the resource stays consistent.
    FencedOnly(&'static str),
    /// The scenario needs something this topology does not have.
    NotApplicable(&'static str),
}

/// The scenarios, by name.
pub const SCENARIOS: &[&str] = &[
    "holder_partitioned",
    "follower_partition",
    "holder_paused_beyond_ttl",
    "long_network_delay",
    "stuck_server",
    "server_crash_restart",
    "server_restart_without_data",
    "early_key_expiry",
    "acquire_reply_delayed",
    "release_reply_lost",
    "waiter_connection_reset",
    "cancellation_under_faults",
    "member_crash",
    "majority_loss",
    "redlock_restart_immediate",
    "redlock_restart_delayed",
    "stale_counter_restore",
    "nemesis",
];

/// What `topology` promises in `scenario`.
pub fn expectation(scenario: &str, topology: Topology) -> Expect {
    use Topology::*;
    match (scenario, topology) {
        ("member_crash" | "majority_loss", Quorum { .. } | Independent { .. }) => Expect::Safe,
        ("nemesis", Single { durable: false }) => Expect::FencedOnly(
            "the fault mix restarts the server, and Redis without persistence forgets its locks",
        ),
        ("nemesis", Independent { .. }) => Expect::FencedOnly(
            "the fault mix restarts nodes at once without data, outside RedLock's assumptions",
        ),
        ("member_crash" | "majority_loss", _) => Expect::NotApplicable("needs several servers"),
        ("follower_partition", Quorum { .. }) => Expect::Safe,
        ("follower_partition", _) => Expect::NotApplicable("needs a consensus cluster"),
        ("redlock_restart_immediate", Independent { .. }) => Expect::FencedOnly(
            "RedLock assumes a crashed node restarts only after the TTL or with persistence; \
             restarted at once and empty, a majority can forget the holder",
        ),
        ("redlock_restart_delayed", Independent { .. }) => Expect::Safe,
        ("redlock_restart_immediate" | "redlock_restart_delayed", _) => {
            Expect::NotApplicable("RedLock only")
        }
        ("stuck_server" | "server_crash_restart" | "server_restart_without_data", InProcess) => {
            Expect::NotApplicable("no server process")
        }
        (
            "long_network_delay"
            | "acquire_reply_delayed"
            | "release_reply_lost"
            | "waiter_connection_reset",
            InProcess,
        ) => Expect::NotApplicable("no network"),
        ("server_crash_restart", Single { durable: false }) => Expect::FencedOnly(
            "single Redis without persistence forgets its locks (and fencing counters) on restart",
        ),
        ("server_crash_restart", Independent { .. }) => Expect::FencedOnly(
            "every RedLock node (without persistence) restarts at once, within the TTL: outside \
             RedLock's assumptions, a majority forgets the holder",
        ),
        ("server_restart_without_data", Single { durable: false }) => Expect::FencedOnly(
            "a server that restarts with its data wiped forgets every lock it held",
        ),
        ("server_restart_without_data", Single { durable: true } | Quorum { .. }) => {
            Expect::NotApplicable("losing the data of a durable store is outside its guarantees")
        }
        ("server_restart_without_data", Independent { .. }) => {
            Expect::FencedOnly("every RedLock node restarted empty at once forgets the holder")
        }
        ("stale_counter_restore", Single { durable: false } | Independent { .. }) => {
            Expect::FencedOnly(
                "restored from an older snapshot, the servers forget the holder; the fencing \
                 token, never below the server clock, still rises past the holder's",
            )
        }
        ("stale_counter_restore", _) => Expect::NotApplicable(
            "run on Redis only: memory:// keeps nothing on disk, and ZooKeeper and etcd \
             promise nothing once their data goes back",
        ),
        ("early_key_expiry", _) => Expect::FencedOnly(
            "a key removed early (operator, clock jump on the server) frees the lock before its \
             holder can know",
        ),
        _ => Expect::Safe,
    }
}

/// What one scenario run found.
#[derive(Debug, Clone)]
pub struct ScenarioReport {
    /// Scenario name.
    pub scenario: &'static str,
    /// The backend deployment.
    pub target: String,
    /// What the fenced resource saw.
    pub fence: FenceReport,
    /// Whether the victim's write (after the fault) was accepted.
    pub victim_write_accepted: Option<bool>,
    /// Whether the victim was told it lost the lock, and why.
    pub victim_lost: Option<LostReason>,
    /// Victim's guard stopped vouching (lost signal or validity deadline, whichever came
    /// first) → next accepted section of another holder, in ms (positive: the victim knew
    /// before anyone else got in; negative: mutual exclusion was lost at the lock and only
    /// the fence protected the resource).
    pub lost_signal_lead_ms: Option<f64>,
    /// Fault injected → next accepted section of another holder.
    pub takeover: Option<Duration>,
    /// After healing, a fresh client acquired the lock within this long.
    pub recovery: Option<Duration>,
    /// Errors worth a look (not assertions).
    pub notes: Vec<String>,
}

impl fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0),
            )
        };
        write!(
            f,
            "{} on {}: {} sections, {} writes accepted, counter {}, {} stale writes rejected, \
             {} overlaps, victim write accepted {:?}, victim lost {:?}, lost-signal lead {}, \
             takeover {}, longest gap {}, recovery {}",
            self.scenario,
            self.target,
            self.fence.sections,
            self.fence.accepted_writes,
            self.fence.counter,
            self.fence.rejected_writes,
            self.fence.overlaps.len(),
            self.victim_write_accepted,
            self.victim_lost,
            self.lost_signal_lead_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0} ms")),
            ms(self.takeover),
            ms(self.fence.gaps.iter().max().copied()),
            ms(self.recovery),
        )?;
        for note in &self.notes {
            write!(f, "\n  note: {note}")?;
        }
        Ok(())
    }
}

impl ScenarioReport {
    /// Asserts what `expect` promises, with the report in the message.
    pub fn assert_meets(&self, expect: Expect) {
        let context = format!("{self}\n  overlaps: {:?}", self.fence.overlaps);
        assert!(
            self.fence.tokens_backwards.is_empty(),
            "fencing tokens went backwards: {context}"
        );
        assert_eq!(self.fence.lost_updates(), 0, "lost updates: {context}");
        if expect == Expect::Safe {
            assert!(self.fence.is_safe(), "mutual exclusion violated: {context}");
            if let Some(lead) = self.lost_signal_lead_ms {
                assert!(
                    lead > 0.0,
                    "another holder got in before the victim's guard stopped vouching: {context}"
                );
            }
        }
        assert!(
            self.recovery.is_some(),
            "the lock was stuck after the faults healed: {context}"
        );
    }
}

/// Timing of a scenario run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// TTL of every client.
    pub ttl: Duration,
    /// How long healthy contenders keep cycling.
    pub contend: Duration,
    /// Healthy contenders.
    pub contenders: usize,
    /// How long the nemesis injects faults.
    pub nemesis: Duration,
    /// Seed of the nemesis' random fault schedule.
    pub seed: u64,
}

impl Plan {
    /// The short plan used by `make test`: a few seconds per scenario.
    pub fn short(ttl: Duration) -> Self {
        Plan {
            ttl,
            contend: ttl * 4,
            contenders: 2,
            nemesis: ttl * 4,
            seed: 1,
        }
    }

    /// The plan of `make chaos`: the nemesis runs `seconds` with `seed`.
    pub fn long(ttl: Duration, seconds: u64, seed: u64) -> Self {
        Plan {
            nemesis: Duration::from_secs(seconds),
            seed,
            ..Plan::short(ttl)
        }
    }

    /// The short plan, or the long one when `CHAOS_LONG=1` (with `CHAOS_SECONDS`,
    /// default 60, and `CHAOS_SEED`, default 1).
    pub fn from_env(ttl: Duration) -> Self {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        if var("CHAOS_LONG") == Some(1) {
            Plan::long(
                ttl,
                var("CHAOS_SECONDS").unwrap_or(60),
                var("CHAOS_SEED").unwrap_or(1),
            )
        } else {
            Plan::short(ttl)
        }
    }
}

/// How long a healthy holder works inside its critical section: long enough for another
/// holder's section to begin meanwhile, were the lock to grant twice.
const SECTION: Duration = Duration::from_millis(5);

fn options(ttl: Duration) -> LockOptions {
    let mut options = LockOptions::default();
    options.ttl = ttl;
    options.request_timeout = (ttl / 2).max(Duration::from_millis(200));
    options
}

/// Healthy contenders: acquire, hold a section of the resource
/// ([`FencedResource::hold_section`]: no write once the lock is lost), release. Runs
/// until `until`.
async fn contend(
    clients: Vec<Arc<dyn DistributedLock>>,
    name: LockName,
    resource: FencedResource,
    until: Instant,
    notes: Arc<Mutex<Vec<String>>>,
) {
    let tasks = clients.into_iter().map(|client| {
        let (name, resource, notes) = (name.clone(), resource.clone(), Arc::clone(&notes));
        tokio::spawn(async move {
            while Instant::now() < until {
                let left = until.saturating_duration_since(Instant::now());
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

/// The fault of a victim scenario.
enum Fault<'a> {
    /// Cut the victim's link for `duration`.
    Partition(Duration),
    /// The victim is `pinned` (a client and its link) instead of a linked client of the
    /// target; its link is cut for `duration`.
    Pinned {
        pinned: (Arc<dyn DistributedLock>, Link),
        duration: Duration,
    },
    /// Delay the victim's link by `delay` for `duration`.
    Delay { delay: Duration, duration: Duration },
    /// SIGSTOP every server for `duration`.
    StuckServer(Duration),
    /// Kill every server and restart it (wiped or not) after `down`.
    ServerCrash { wipe: bool, down: Duration },
    /// Remove the lock behind the victim's back.
    Steal(&'a dyn ChaosTarget),
    /// Kill `servers` (indices), restart after `down` (wiped or not).
    Members {
        which: Vec<usize>,
        wipe: bool,
        down: Duration,
    },
}

/// A victim holds the lock and sits in a critical section (read done, write pending)
/// while `fault` strikes; healthy contenders keep going; then the victim writes anyway
/// (as a paused process would) and the fence decides.
async fn victim_scenario(
    target: &dyn ChaosTarget,
    scenario: &'static str,
    plan: Plan,
    fault: Fault<'_>,
) -> ScenarioReport {
    let name = unique_name(scenario);
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let (victim, link) = match &fault {
        Fault::Pinned { pinned, .. } => pinned.clone(),
        _ => target.linked_client(options(plan.ttl)).await,
    };
    let guard = victim
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("victim acquires a free lock");
    let section = resource
        .begin(guard.fencing_token())
        .expect("the first token is never stale");
    let seen = section.read();
    let lost_at: Arc<Mutex<Option<(Instant, LostReason)>>> = Arc::default();
    let lost_task = {
        let mut watch = guard.watch();
        let lost_at = Arc::clone(&lost_at);
        tokio::spawn(async move {
            let reason = watch.lost().await;
            // The guard stopped vouching for the lock at its validity deadline, even if
            // the signal was delivered a little later by a busy scheduler.
            let at = Instant::now().min(watch.valid_until());
            *lost_at.lock().expect("lost") = Some((at, reason));
        })
    };
    let mut contenders = Vec::new();
    for _ in 0..plan.contenders {
        contenders.push(target.client(options(plan.ttl)).await);
    }
    let fault_at = Instant::now();
    let until = fault_at + plan.contend;
    let contention = tokio::spawn(contend(
        contenders,
        name.clone(),
        resource.clone(),
        until,
        Arc::clone(&notes),
    ));
    let note = |text: String| notes.lock().expect("notes").push(text);
    match fault {
        Fault::Partition(duration) | Fault::Pinned { duration, .. } => {
            link.cut();
            sleep(duration).await;
            link.heal();
        }
        Fault::Delay { delay, duration } => {
            link.set_mode(ProxyMode::Delay {
                base: delay,
                jitter: delay / 10,
            });
            sleep(duration).await;
            link.heal();
        }
        Fault::StuckServer(duration) => {
            for server in target.servers() {
                if let Err(err) = server.pause() {
                    note(format!("pause {}: {err}", server.label()));
                }
            }
            sleep(duration).await;
            for server in target.servers() {
                if let Err(err) = server.resume() {
                    note(format!("resume {}: {err}", server.label()));
                }
            }
        }
        Fault::ServerCrash { wipe, down } => {
            let servers = target.servers();
            let all: Vec<usize> = (0..servers.len()).collect();
            crash_members(&servers, &all, wipe, down, &note).await;
        }
        Fault::Members { which, wipe, down } => {
            crash_members(&target.servers(), &which, wipe, down, &note).await;
        }
        Fault::Steal(target) => {
            target.steal(&name).await;
            sleep(plan.ttl).await;
        }
    }
    // The victim wakes up a TTL later (whoever could take over has done so by then)
    // and writes without looking, as a paused process would.
    sleep(plan.ttl).await;
    let victim_write_accepted = Some(section.write(seen + 1).is_ok());
    section.end();
    if let Err(err) = contention.await {
        note(format!("contention panicked: {err}"));
    }
    let victim_lost = match guard.state() {
        LockState::Lost(reason) => Some(reason),
        _ => None,
    };
    let _ = guard.release().await;
    lost_task.abort();
    let recovery = recover(target, &name, plan).await;
    let fence = resource.check();
    let takeover = first_other_start(&resource, fault_at);
    let lost_signal_lead_ms = lost_at
        .lock()
        .expect("lost")
        .zip(first_other_start(&resource, fault_at))
        .map(|((lost, _), other)| signed_ms(other, lost));
    let notes = notes.lock().expect("notes").clone();
    ScenarioReport {
        scenario,
        target: target.label(),
        fence,
        victim_write_accepted,
        victim_lost,
        lost_signal_lead_ms,
        takeover: takeover.map(|at| at.saturating_duration_since(fault_at)),
        recovery,
        notes,
    }
}

async fn crash_members(
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

fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1000.0
    } else {
        -((earlier - later).as_secs_f64() * 1000.0)
    }
}

/// Start of the first accepted section that began after `after` (another holder's).
fn first_other_start(resource: &FencedResource, after: Instant) -> Option<Instant> {
    resource
        .sections()
        .into_iter()
        .filter(|s| s.start > after && s.written.is_some())
        .map(|s| s.start)
        .min()
}

/// After the faults healed, a fresh client must get the lock within TTL plus a bound.
async fn recover(target: &dyn ChaosTarget, name: &LockName, plan: Plan) -> Option<Duration> {
    let limit = plan.ttl * 3 + Duration::from_secs(10);
    let client = target.client(options(plan.ttl)).await;
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

/// The victim's link is cut for 2 x TTL: its lease ends, others take over, its late write
/// is refused.
pub async fn holder_partitioned(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    victim_scenario(
        target,
        "holder_partitioned",
        plan,
        Fault::Partition(plan.ttl * 2),
    )
    .await
}

/// The victim reaches one follower only, and that follower is cut off from its peers for
/// 2 x TTL: it answers the victim for a while on its own (ZooKeeper: `syncLimit` ticks)
/// while the others end the victim's session or lease and take over. `None` where the
/// target cannot pin a client to a follower.
pub async fn follower_partition(target: &dyn ChaosTarget, plan: Plan) -> Option<ScenarioReport> {
    let pinned = target.follower_link(options(plan.ttl)).await?;
    let fault = Fault::Pinned {
        pinned,
        duration: plan.ttl * 2,
    };
    Some(victim_scenario(target, "follower_partition", plan, fault).await)
}

/// The victim stops for 2 x TTL mid-section (renewals included, as with SIGSTOP of its
/// process), then writes without looking.
pub async fn holder_paused_beyond_ttl(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    // From the servers' side a stopped process and a cut link look the same: silence.
    victim_scenario(
        target,
        "holder_paused_beyond_ttl",
        plan,
        Fault::Partition(plan.ttl * 2),
    )
    .await
}

/// The victim's traffic is delayed by more than the TTL for 2 x TTL.
pub async fn long_network_delay(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    victim_scenario(
        target,
        "long_network_delay",
        plan,
        Fault::Delay {
            delay: plan.ttl + plan.ttl / 2,
            duration: plan.ttl * 2,
        },
    )
    .await
}

/// Every server is stopped (SIGSTOP) for 2 x TTL, then continued.
pub async fn stuck_server(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    victim_scenario(
        target,
        "stuck_server",
        plan,
        Fault::StuckServer(plan.ttl * 2),
    )
    .await
}

/// Every server is killed (SIGKILL) and restarted with its data.
pub async fn server_crash_restart(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    victim_scenario(
        target,
        "server_crash_restart",
        plan,
        Fault::ServerCrash {
            wipe: false,
            down: plan.ttl / 4,
        },
    )
    .await
}

/// Every server is killed and restarted with its data wiped.
pub async fn server_restart_without_data(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    victim_scenario(
        target,
        "server_restart_without_data",
        plan,
        Fault::ServerCrash {
            wipe: true,
            down: plan.ttl / 4,
        },
    )
    .await
}

/// The lock is removed behind the victim's back (operator, server clock jump).
pub async fn early_key_expiry(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    victim_scenario(target, "early_key_expiry", plan, Fault::Steal(target)).await
}

/// One member (the leader, where there is one) is killed while the lock is held and
/// restarted after 2 x TTL.
pub async fn member_crash(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let which = vec![target.leader().await.unwrap_or(0)];
    victim_scenario(
        target,
        "member_crash",
        plan,
        Fault::Members {
            which,
            wipe: false,
            down: plan.ttl * 2,
        },
    )
    .await
}

/// RedLock: a majority of nodes crash and restart at once, empty.
pub async fn redlock_restart_immediate(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let n = target.servers().len();
    victim_scenario(
        target,
        "redlock_restart_immediate",
        plan,
        Fault::Members {
            which: (0..n / 2 + 1).collect(),
            wipe: true,
            down: Duration::from_millis(50),
        },
    )
    .await
}

/// RedLock: a minority of nodes crash and restart empty only after the TTL (the
/// documented operating rule).
pub async fn redlock_restart_delayed(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let n = target.servers().len();
    victim_scenario(
        target,
        "redlock_restart_delayed",
        plan,
        Fault::Members {
            which: (0..n.saturating_sub(1) / 2).collect(),
            wipe: true,
            down: plan.ttl + plan.ttl / 2,
        },
    )
    .await
}

/// Every server is restored from a snapshot of its data taken before the victim's grant
/// (a backup restore, a failover to a lagging replica): the lock and the fencing counter
/// go back, yet the next holder's token is above every earlier one and the victim's
/// write is refused.
pub async fn stale_counter_restore(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let name = unique_name("stale_counter_restore");
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let note = |text: String| notes.lock().expect("notes").push(text);
    let servers = target.servers();
    let client = target.client(options(plan.ttl)).await;
    let cycle = |until| {
        let clients = vec![Arc::clone(&client)];
        contend(
            clients,
            name.clone(),
            resource.clone(),
            until,
            Arc::clone(&notes),
        )
    };
    cycle(Instant::now() + plan.ttl / 2).await;
    for server in &servers {
        if let Err(err) = server.save_snapshot().await {
            note(format!("snapshot {}: {err}", server.label()));
        }
    }
    cycle(Instant::now() + plan.ttl / 2).await;
    let victim = client
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("victim acquires");
    let section = resource
        .begin(victim.fencing_token())
        .expect("the victim's token is the highest");
    let seen = section.read();
    let highest = resource.sections().iter().map(|s| s.token).max();

    let fault_at = Instant::now();
    for (server, restored) in servers
        .iter()
        .zip(join_all(servers.iter().map(|s| s.restart_from_snapshot())).await)
    {
        if let Err(err) = restored {
            note(format!("restore {}: {err}", server.label()));
        }
    }
    let next = target.client(options(plan.ttl)).await;
    let mut backwards = None;
    match next.lock_timeout(name.as_str(), plan.ttl * 3).await {
        Ok(guard) => {
            let token = guard.fencing_token().get();
            if let Some(highest) = highest.filter(|&highest| token <= highest) {
                note(format!(
                    "the first grant after the restore got token {token}, not above {highest}"
                ));
                backwards = Some((highest, token));
            }
            let _ = resource.increment(guard.fencing_token(), async {}).await;
            let _ = guard.release().await;
        }
        Err(err) => note(format!("no grant after the restore: {err}")),
    }
    let contenders = join_all((0..plan.contenders).map(|_| target.client(options(plan.ttl)))).await;
    contend(
        contenders,
        name.clone(),
        resource.clone(),
        Instant::now() + plan.contend,
        Arc::clone(&notes),
    )
    .await;
    let victim_write_accepted = Some(section.write(seen + 1).is_ok());
    section.end();
    let victim_lost = match victim.state() {
        LockState::Lost(reason) => Some(reason),
        _ => None,
    };
    let _ = victim.release().await;
    let recovery = recover(target, &name, plan).await;
    let notes = notes.lock().expect("notes").clone();
    let mut out = report("stale_counter_restore", target, &resource, recovery, notes);
    out.fence.tokens_backwards.extend(backwards);
    out.victim_write_accepted = victim_write_accepted;
    out.victim_lost = victim_lost;
    out.takeover = first_other_start(&resource, fault_at).map(|at| at - fault_at);
    out
}

fn report(
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
        notes,
    }
}

/// The victim's acquire travels over a link slower than the TTL: whatever it gets must
/// not overlap a healthy holder.
pub async fn acquire_reply_delayed(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let name = unique_name("acquire_reply_delayed");
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let (victim, link) = target.linked_client(options(plan.ttl)).await;
    link.set_mode(ProxyMode::Delay {
        base: plan.ttl + plan.ttl / 2,
        jitter: Duration::ZERO,
    });
    let victim_task = {
        let (name, resource) = (name.clone(), resource.clone());
        tokio::spawn(async move {
            match victim.try_lock(name.as_str()).await {
                Ok(Some(guard)) => {
                    let outcome = if guard.is_held() {
                        let written = resource.hold_section(&guard, sleep(SECTION)).await;
                        format!("victim got the lock; write accepted: {written:?}")
                    } else {
                        "victim got a guard that was already lost".to_owned()
                    };
                    let _ = guard.release().await;
                    outcome
                }
                Ok(None) => "victim found the lock held".to_owned(),
                Err(err) => format!("victim's acquire failed: {err}"),
            }
        })
    };
    let mut contenders = Vec::new();
    for _ in 0..plan.contenders {
        contenders.push(target.client(options(plan.ttl)).await);
    }
    let until = Instant::now() + plan.contend;
    contend(
        contenders,
        name.clone(),
        resource.clone(),
        until,
        Arc::clone(&notes),
    )
    .await;
    link.heal();
    match timeout(plan.ttl * 4 + Duration::from_secs(10), victim_task).await {
        Ok(Ok(outcome)) => notes.lock().expect("notes").push(outcome),
        _ => notes
            .lock()
            .expect("notes")
            .push("victim's acquire never finished".into()),
    }
    let recovery = recover(target, &name, plan).await;
    let notes = notes.lock().expect("notes").clone();
    report("acquire_reply_delayed", target, &resource, recovery, notes)
}

/// The reply to the victim's release is lost: the release is ambiguous to the victim, yet
/// a waiter gets the lock and nothing the victim does afterwards touches it.
pub async fn release_reply_lost(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let name = unique_name("release_reply_lost");
    let resource = FencedResource::new();
    let mut notes = Vec::new();
    let (victim, link) = target.linked_client(options(plan.ttl)).await;
    let waiter = target.client(options(plan.ttl)).await;
    let guard = victim
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("victim acquires");
    let _ = resource.hold_section(&guard, sleep(SECTION)).await;
    let waiting = {
        let (name, waiter) = (name.clone(), Arc::clone(&waiter));
        tokio::spawn(async move {
            waiter
                .lock_timeout(name.as_str(), Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(200)).await;
    link.set_mode(ProxyMode::DropNextReply);
    let released_at = Instant::now();
    notes.push(format!("victim's release: {:?}", guard.release().await));
    link.heal();
    let mut takeover = None;
    match timeout(plan.ttl * 3 + Duration::from_secs(10), waiting).await {
        Ok(Ok(Ok(next))) => {
            takeover = Some(released_at.elapsed());
            let _ = resource.hold_section(&next, sleep(plan.ttl / 2)).await;
            if !next.is_held() {
                notes.push("the waiter's hold did not survive the victim's release".into());
            }
            let _ = next.release().await;
        }
        other => notes.push(format!("waiter never got the lock: {other:?}")),
    }
    let recovery = recover(target, &name, plan).await;
    let mut out = report("release_reply_lost", target, &resource, recovery, notes);
    out.takeover = takeover;
    out
}

/// A waiter's connections are reset just before the holder releases (a missed pub/sub
/// message or watch event): the waiter must still get the lock, within its re-check bound.
pub async fn waiter_connection_reset(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let name = unique_name("waiter_connection_reset");
    let resource = FencedResource::new();
    let mut notes = Vec::new();
    let holder = target.client(options(plan.ttl)).await;
    let (waiter, link) = target.linked_client(options(plan.ttl)).await;
    let guard = holder
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("holder acquires");
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            waiter
                .lock_timeout(name.as_str(), Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    link.set_mode(ProxyMode::Reset);
    let _ = resource.hold_section(&guard, sleep(SECTION)).await;
    let released_at = Instant::now();
    let _ = guard.release().await;
    sleep(Duration::from_millis(50)).await;
    link.heal();
    let mut takeover = None;
    match timeout(Duration::from_secs(30), waiting).await {
        Ok(Ok(Ok(next))) => {
            takeover = Some(released_at.elapsed());
            let _ = resource.hold_section(&next, sleep(SECTION)).await;
            let _ = next.release().await;
        }
        other => notes.push(format!("waiter never got the lock: {other:?}")),
    }
    let recovery = recover(target, &name, plan).await;
    let mut out = report(
        "waiter_connection_reset",
        target,
        &resource,
        recovery,
        notes,
    );
    out.takeover = takeover;
    out
}

/// Acquires with random short timeouts race grants while connections are reset: nothing
/// stays queued or held, and the lock is free right after.
pub async fn cancellation_under_faults(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    use rand::Rng;
    let name = unique_name("cancellation_under_faults");
    let resource = FencedResource::new();
    let mut notes = Vec::new();
    let mut links = Vec::new();
    let mut tasks = Vec::new();
    let until = Instant::now() + plan.contend;
    for _ in 0..3 {
        let (client, link) = target.linked_client(options(plan.ttl)).await;
        links.push(link);
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let cut = Duration::from_millis(rand::rng().random_range(1..80));
                if let Ok(Ok(guard)) = timeout(cut, client.lock(name.as_str())).await {
                    let _ = resource.hold_section(&guard, sleep(SECTION)).await;
                    drop(guard);
                }
            }
        }));
    }
    while Instant::now() < until {
        let pause = Duration::from_millis(rand::rng().random_range(50..250));
        sleep(pause).await;
        let which = rand::rng().random_range(0..links.len());
        links[which].set_mode(ProxyMode::Reset);
        links[which].heal();
    }
    for task in join_all(tasks).await {
        if let Err(err) = task {
            notes.push(format!("contender panicked: {err}"));
        }
    }
    let deadline = Instant::now() + plan.ttl * 2 + Duration::from_secs(10);
    let mut left = target.leftovers(std::slice::from_ref(&name)).await;
    while !left.is_empty() && Instant::now() < deadline {
        sleep(Duration::from_millis(100)).await;
        left = target.leftovers(std::slice::from_ref(&name)).await;
    }
    if !left.is_empty() {
        notes.push(format!("left on the server: {left:?}"));
    }
    let recovery = if left.is_empty() {
        recover(target, &name, plan).await
    } else {
        None
    };
    report(
        "cancellation_under_faults",
        target,
        &resource,
        recovery,
        notes,
    )
}

/// A majority of servers is killed while the lock is held: no one else may acquire
/// meanwhile (an error, never a second grant); after restart the lock works again.
pub async fn majority_loss(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    let name = unique_name("majority_loss");
    let resource = FencedResource::new();
    let mut notes = Vec::new();
    let holder = target.client(options(plan.ttl)).await;
    let other = target.client(options(plan.ttl)).await;
    let guard = holder
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("holder acquires");
    let servers = target.servers();
    let majority: Vec<usize> = (0..servers.len() / 2 + 1).collect();
    // The holder's section spans the fault and the other client's attempt; it claims
    // the lock while the holder's guard vouches, so a second grant meanwhile overlaps it.
    let attempt = async {
        let mut said = Vec::new();
        for &i in &majority {
            if let Err(err) = servers[i].kill9().await {
                said.push(format!("kill {}: {err}", servers[i].label()));
            }
        }
        match other.lock_timeout(name.as_str(), plan.ttl * 2).await {
            Ok(second) => {
                let _ = resource.hold_section(&second, sleep(SECTION)).await;
                said.push("a second client acquired the lock without a majority".into());
                let _ = second.release().await;
            }
            Err(err) => said.push(format!("acquire without a majority: {err}")),
        }
        said
    };
    tokio::pin!(attempt);
    let mut said = None;
    let _ = resource
        .hold_section(&guard, async { said = Some((&mut attempt).await) })
        .await;
    // The holder's guard stopped vouching first: let the attempt finish outside.
    let said = match said {
        Some(said) => said,
        None => attempt.await,
    };
    notes.extend(said);
    notes.push(format!(
        "holder's state without a majority: {:?}",
        guard.state()
    ));
    let restarts = majority.iter().map(|&i| servers[i].restart());
    for (i, restarted) in join_all(restarts).await.into_iter().enumerate() {
        if let Err(err) = restarted {
            notes.push(format!("restart member {i}: {err}"));
        }
    }
    let _ = guard.release().await;
    let recovery = recover(target, &name, plan).await;
    report("majority_loss", target, &resource, recovery, notes)
}

/// Runs `scenario` (a name from [`SCENARIOS`]) on `target`; `None` if it does not apply.
pub async fn run(scenario: &str, target: &dyn ChaosTarget, plan: Plan) -> Option<ScenarioReport> {
    if let Expect::NotApplicable(_) = expectation(scenario, target.topology()) {
        return None;
    }
    Some(match scenario {
        "holder_partitioned" => holder_partitioned(target, plan).await,
        "follower_partition" => return follower_partition(target, plan).await,
        "holder_paused_beyond_ttl" => holder_paused_beyond_ttl(target, plan).await,
        "long_network_delay" => long_network_delay(target, plan).await,
        "stuck_server" => stuck_server(target, plan).await,
        "server_crash_restart" => server_crash_restart(target, plan).await,
        "server_restart_without_data" => server_restart_without_data(target, plan).await,
        "early_key_expiry" => early_key_expiry(target, plan).await,
        "acquire_reply_delayed" => acquire_reply_delayed(target, plan).await,
        "release_reply_lost" => release_reply_lost(target, plan).await,
        "waiter_connection_reset" => waiter_connection_reset(target, plan).await,
        "cancellation_under_faults" => cancellation_under_faults(target, plan).await,
        "member_crash" => member_crash(target, plan).await,
        "majority_loss" => majority_loss(target, plan).await,
        "redlock_restart_immediate" => redlock_restart_immediate(target, plan).await,
        "redlock_restart_delayed" => redlock_restart_delayed(target, plan).await,
        "stale_counter_restore" => stale_counter_restore(target, plan).await,
        "nemesis" => nemesis(target, plan).await,
        _ => return None,
    })
}

/// Runs `scenario` on `target` with [`Plan::from_env`] and asserts the topology's
/// promise. Prints the report (and appends it as a JSON line to
/// `$CHAOS_REPORT_DIR/<scenario>.jsonl` when that is set); says loudly when the scenario
/// does not apply.
pub async fn check(scenario: &str, target: &dyn ChaosTarget) {
    let topology = target.topology();
    let expect = expectation(scenario, topology);
    let plan = Plan::from_env(target.short_ttl());
    let report = run(scenario, target, plan).await;
    record(scenario, target, topology, expect, plan, report.as_ref());
    match report {
        None => eprintln!(
            "[chaos] {scenario} does not apply to {}: {expect:?}",
            target.label()
        ),
        Some(report) => {
            eprintln!("[chaos] {report}");
            report.assert_meets(expect);
        }
    }
}

/// One scenario run as the reliability report stores it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ReportRow {
    /// Scenario name.
    pub scenario: String,
    /// Backend deployment.
    pub target: String,
    /// Topology, as text.
    pub topology: String,
    /// What the topology promises, as text.
    pub expectation: String,
    /// Whether the scenario ran (it may not apply).
    pub ran: bool,
    /// Overlapping accepted sections.
    pub violations: usize,
    /// Stale writes the fence rejected.
    pub stale_rejected: usize,
    /// Lost updates.
    pub lost_updates: u64,
    /// Accepted writes.
    pub writes: u64,
    /// Victim's lost signal → next holder, ms (positive: told first).
    pub lost_signal_lead_ms: Option<f64>,
    /// Fault → next holder, ms.
    pub takeover_ms: Option<f64>,
    /// Longest time between two accepted sections, ms.
    pub longest_gap_ms: Option<f64>,
    /// Time for a fresh client to get the lock after the faults healed, ms.
    pub recovery_ms: Option<f64>,
    /// Nemesis seed.
    pub seed: u64,
    /// Notes.
    pub notes: Vec<String>,
}

fn record(
    scenario: &str,
    target: &dyn ChaosTarget,
    topology: Topology,
    expect: Expect,
    plan: Plan,
    report: Option<&ScenarioReport>,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let row = ReportRow {
        scenario: scenario.to_owned(),
        target: target.label(),
        topology: format!("{topology:?}"),
        expectation: format!("{expect:?}"),
        ran: report.is_some(),
        violations: report.map_or(0, |r| r.fence.overlaps.len()),
        stale_rejected: report.map_or(0, |r| r.fence.rejected_writes + r.fence.rejected_begins),
        lost_updates: report.map_or(0, |r| r.fence.lost_updates()),
        writes: report.map_or(0, |r| r.fence.accepted_writes),
        lost_signal_lead_ms: report.and_then(|r| r.lost_signal_lead_ms),
        takeover_ms: report.and_then(|r| r.takeover).map(ms),
        longest_gap_ms: report
            .and_then(|r| r.fence.gaps.iter().max().copied())
            .map(ms),
        recovery_ms: report.and_then(|r| r.recovery).map(ms),
        seed: plan.seed,
        notes: report.map(|r| r.notes.clone()).unwrap_or_default(),
    };
    record_row(&row);
}

/// Appends `row` to `$CHAOS_REPORT_DIR/<scenario>.jsonl` for the reliability report, when
/// that is set. Fault tests outside [`SCENARIOS`] (e.g. on whole processes) report
/// through this too; the report lists them after the scenarios.
pub fn record_row(row: &ReportRow) {
    let Ok(dir) = std::env::var("CHAOS_REPORT_DIR") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{}.jsonl", row.scenario));
    let line = match serde_json::to_string(row) {
        Ok(line) => line,
        Err(err) => {
            eprintln!("[chaos] cannot encode the report row: {err}");
            return;
        }
    };
    use std::io::Write as _;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{line}"));
    if let Err(err) = written {
        eprintln!("[chaos] cannot write {}: {err}", path.display());
    }
}

/// A seeded random mix of faults for `plan.nemesis` while linked contenders keep
/// cycling: link partitions, delays and resets, server pauses, and crashes with restart
/// (of a minority of members on clusters and RedLock, of the server otherwise).
pub async fn nemesis(target: &dyn ChaosTarget, plan: Plan) -> ScenarioReport {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let name = unique_name("nemesis");
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut links = Vec::new();
    for _ in 0..3 {
        let (client, link) = target.linked_client(options(plan.ttl)).await;
        clients.push(client);
        links.push(link);
    }
    let started = Instant::now();
    let until = started + plan.nemesis;
    let contention = tokio::spawn(contend(
        clients,
        name.clone(),
        resource.clone(),
        until,
        Arc::clone(&notes),
    ));
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let servers = target.servers();
    let topology = target.topology();
    let mut faults: Vec<String> = Vec::new();
    while Instant::now() + plan.ttl < until {
        let pause = plan.ttl.mul_f64(rng.random_range(0.2..1.0));
        sleep(pause).await;
        let hold = plan.ttl.mul_f64(rng.random_range(0.3..1.6));
        let link = &links[rng.random_range(0..links.len())];
        let pick = rng.random_range(0..if servers.is_empty() { 1 } else { 5 });
        match pick {
            0 => {
                faults.push(format!("partition {hold:?}"));
                link.cut();
                sleep(hold).await;
                link.heal();
            }
            1 => {
                faults.push(format!("delay {:?} for {hold:?}", plan.ttl / 2));
                link.set_mode(ProxyMode::Delay {
                    base: plan.ttl / 2,
                    jitter: plan.ttl / 10,
                });
                sleep(hold).await;
                link.heal();
            }
            2 => {
                faults.push("reset".into());
                link.set_mode(ProxyMode::Reset);
                link.heal();
            }
            3 => {
                faults.push(format!("pause servers {hold:?}"));
                servers.iter().for_each(|s| {
                    let _ = s.pause();
                });
                sleep(hold).await;
                servers.iter().for_each(|s| {
                    let _ = s.resume();
                });
            }
            _ => {
                let which: Vec<usize> = match topology {
                    Topology::Quorum { members } | Topology::Independent { nodes: members } => {
                        vec![rng.random_range(0..members)]
                    }
                    _ => (0..servers.len()).collect(),
                };
                faults.push(format!("crash and restart {which:?}"));
                let note = |text: String| notes.lock().expect("notes").push(text);
                let wipe = matches!(topology, Topology::Independent { .. });
                crash_members(&servers, &which, wipe, hold / 4, &note).await;
            }
        }
    }
    if let Err(err) = contention.await {
        notes
            .lock()
            .expect("notes")
            .push(format!("contention panicked: {err}"));
    }
    links.iter().for_each(Link::heal);
    let recovery = recover(target, &name, plan).await;
    let mut notes = notes.lock().expect("notes").clone();
    notes.push(format!(
        "seed {}: {} faults in {:?}: {}",
        plan.seed,
        faults.len(),
        started.elapsed(),
        faults.join(", ")
    ));
    report("nemesis", target, &resource, recovery, notes)
}
