//! What the scenarios break: how a backend is deployed ([`Topology`]), a client's
//! network path ([`Link`]), and the deployment hooks a backend provides ([`ChaosTarget`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::memory::MemoryLock;
use lock_core::{DistributedLock, LockName, LockOptions};

use conformance::factory::{Crash, Factory};
use harness::proxy::{FaultProxy, ProxyMode};
pub use harness::ServerControl;

/// Which sides of a dual deployment a hook or a fault touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sides {
    /// The old backend only.
    Old,
    /// The new backend only.
    New,
    /// Both backends.
    Both,
}

impl Sides {
    pub(crate) fn has_old(self) -> bool {
        matches!(self, Sides::Old | Sides::Both)
    }

    pub(crate) fn has_new(self) -> bool {
        matches!(self, Sides::New | Sides::Both)
    }
}

/// How a backend is deployed; selects the scenarios that apply.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        /// The leader learns of a client's activity at a follower only when the follower
        /// reports it (ZooKeeper, every half tick): a follower cut off right after a
        /// renewal leaves the leader with an older one, so the session may end a little
        /// before the holder's lease (a residue clients cannot close).
        reported_activity: bool,
    },
    /// Primaries with asynchronous replicas, failed over by watchers that promote a
    /// replica when a primary is unreachable (Redis behind Sentinel: one shard; Redis
    /// Cluster: several, each a primary with its replicas, the cluster bus as watcher).
    Replicated {
        /// Shards, each a primary with its replicas (1 behind Sentinel).
        shards: usize,
        /// Replicas of each primary.
        replicas: usize,
        /// Replicas that must acknowledge a grant before it is returned
        /// (`wait_replicas`); 0: grants are returned unacknowledged.
        acked: u32,
    },
    /// Independent nodes with client-side quorum (RedLock).
    Independent {
        /// Number of nodes.
        nodes: usize,
    },
    /// A dual deployment (`dual:<old>|<new>`): two single deployments, the faults on
    /// one side or both (the faulted side's links, servers and keys; the other side is
    /// left alone).
    Dual {
        /// The old side's deployment.
        old: Box<Topology>,
        /// The new side's deployment.
        new: Box<Topology>,
        /// The sides the faults hit.
        faults: Sides,
    },
}

/// The network path of one client, where faults are injected.
#[derive(Clone)]
pub enum Link {
    /// An in-process client, cut off and healed by its backend.
    Memory(Arc<MemoryLock>),
    /// A client whose connections pass through fault proxies (one per server).
    Proxies(Arc<Vec<FaultProxy>>),
    /// A client whose link the deployment itself cuts and heals, where no proxy can stand
    /// in its path: e.g. by locking its user out of every server, which closes its
    /// connections and refuses new ones (a [`ProxyMode::Reset`] rather than silence), and
    /// cannot delay or drop a reply.
    Switched(Arc<dyn Switch>),
    /// Several links faulted as one.
    All(Vec<Link>),
}

/// Cuts and heals a [`Link::Switched`]. Called on the runtime: must not block (apply the
/// change in a task of its own, in order).
pub trait Switch: Send + Sync {
    /// Cuts the link (`true`) or heals it (`false`).
    fn set(&self, cut: bool);
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Memory(_) => f.write_str("Link::Memory"),
            Link::Proxies(p) => write!(f, "Link::Proxies({})", p.len()),
            Link::Switched(_) => f.write_str("Link::Switched"),
            Link::All(links) => f.debug_tuple("Link::All").field(links).finish(),
        }
    }
}

impl Link {
    /// A fault proxy in front of each of `servers`: the link, and the addresses a
    /// client connects to instead of the servers'.
    ///
    /// # Panics
    /// If a proxy cannot start (test support).
    pub async fn proxied(servers: &[SocketAddr]) -> (Link, Vec<SocketAddr>) {
        let mut proxies = Vec::with_capacity(servers.len());
        for &server in servers {
            proxies.push(FaultProxy::start(server).await.expect("fault proxy starts"));
        }
        let addrs = proxies.iter().map(FaultProxy::addr).collect();
        (Link::Proxies(Arc::new(proxies)), addrs)
    }

    /// Cuts the client off (network partition; no reply, no close).
    pub fn cut(&self) {
        match self {
            Link::Memory(client) => client.backend().partition(true),
            Link::Proxies(proxies) => proxies
                .iter()
                .for_each(|p| p.set_mode(ProxyMode::Blackhole)),
            Link::Switched(switch) => switch.set(true),
            Link::All(links) => links.iter().for_each(Link::cut),
        }
    }

    /// Restores normal traffic.
    pub fn heal(&self) {
        match self {
            Link::Memory(client) => client.backend().partition(false),
            Link::Proxies(proxies) => proxies.iter().for_each(|p| p.set_mode(ProxyMode::Pass)),
            Link::Switched(switch) => switch.set(false),
            Link::All(links) => links.iter().for_each(Link::heal),
        }
    }

    /// Sets a proxy mode on every proxy; `false` for in-process links, which have none, and
    /// for switched links unless the mode is [`ProxyMode::Reset`] (their cut).
    pub fn set_mode(&self, mode: ProxyMode) -> bool {
        match self {
            Link::Memory(_) => false,
            Link::Switched(switch) => {
                let reset = mode == ProxyMode::Reset;
                if reset {
                    switch.set(true);
                }
                reset
            }
            Link::Proxies(proxies) => {
                proxies.iter().for_each(|p| p.set_mode(mode));
                true
            }
            Link::All(links) => links.iter().all(|l| l.set_mode(mode)),
        }
    }
}

/// A crash of a linked client is a cut that never heals.
#[async_trait]
impl Crash for Link {
    async fn crash(&self) {
        self.cut();
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

    /// The primitive its clients take where scenarios lock (`None`: the lock itself).
    fn primitive(&self) -> Option<super::Primitive> {
        None
    }

    /// Why a step ahead of the servers' wall clock ends holds early, where a deployment
    /// its topology calls safe times leases by that clock (PostgreSQL's `now()`);
    /// `None` where the topology says it all (Redis's expiry by its wall clock is in
    /// `expect`, ZooKeeper and etcd time sessions and leases monotonically).
    fn wall_clock_leases(&self) -> Option<&'static str> {
        None
    }

    /// Index of the current leader in [`ChaosTarget::servers`], for consensus clusters.
    async fn leader(&self) -> Option<usize> {
        None
    }

    /// Index in [`ChaosTarget::servers`] of the primary that takes the writes of `name`
    /// now, in replicated deployments (its shard's primary in a cluster).
    async fn primary(&self, _name: &LockName) -> Option<usize> {
        None
    }

    /// Waits up to `limit` until a server other than `old` is promoted to take the writes
    /// of `name` from `old` (a failover), and returns its index.
    async fn promoted(&self, _name: &LockName, _old: usize, _limit: Duration) -> Option<usize> {
        None
    }

    /// Moves the hash slot of `name` to another primary step by step, `pause` apart: the
    /// slot marked migrating (clients asked to follow `ASK` for keys already moved), its
    /// keys moved, then the slot handed over (`MOVED`). What was moved where, or what
    /// failed; `None` where the deployment has no slots to move.
    async fn migrate(&self, _name: &LockName, _pause: Duration) -> Option<Result<String, String>> {
        None
    }

    /// The links of primary `primary` to its replicas: cut, the primary keeps serving its
    /// clients and its watchers see it, but nothing it writes reaches a replica.
    fn replication_link(&self, _primary: usize) -> Option<Link> {
        None
    }

    /// Every path to primary `primary` except the links of clients made by
    /// [`ChaosTarget::linked_client`] before the cut: cut, the watchers and replicas lose
    /// it (and promote a replica) and clients that find the primary through the watchers
    /// follow the promotion, while those linked clients still reach the old primary (a
    /// split brain).
    fn isolation_link(&self, _primary: usize) -> Option<Link> {
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
