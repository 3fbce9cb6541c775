//! What the scenarios break: how a backend is deployed ([`Topology`]), a client's
//! network path ([`Link`]), the servers' fault controls ([`ServerControl`]), and the
//! deployment hooks a backend provides ([`ChaosTarget`]).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::memory::MemoryLock;
use lock_core::{DistributedLock, LockOptions};

use crate::factory::Factory;
use crate::harness::{EtcdServer, HarnessError, RedisServer, ZkServer};
use crate::proxy::{FaultProxy, ProxyMode};

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
