//! A group of servers of one kind ([`Cluster`]): independent Redis nodes, a ZooKeeper
//! ensemble or an etcd cluster; start-up together, restart of all, leader lookups. And
//! [`Deployment`]: one server or a cluster, what a backend's tests run on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::server::{Member, Server, ServerControl, ServerKind};
use super::{
    create_dir, first_error, free_ports, temp_dir, wait_for_leader, with_port_retries,
    HarnessError, DEFAULT_READY_TIMEOUT,
};
use crate::proxy::FaultProxy;

/// A group of servers of kind `K` on loopback, in one temp dir: independent nodes
/// (Redis, for RedLock) or a consensus cluster (a ZooKeeper ensemble, an etcd cluster;
/// 3 members by default). Killed on drop.
#[derive(Debug)]
pub struct Cluster<K: ServerKind> {
    members: Vec<Server<K>>,
    /// Peer-link proxies (ZooKeeper with `peer_links`), else empty.
    pub(crate) links: Vec<Arc<Vec<FaultProxy>>>,
    pub(crate) label: String,
    _dir: TempDir,
}

impl<K: ServerKind> Cluster<K> {
    /// Starts a cluster with default options; returns once every member is ready (and,
    /// for a consensus cluster, once they agree on one leader).
    ///
    /// # Errors
    /// As [`Server::start`], or [`HarnessError::Cluster`] if no leader is elected in time.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(K::Options::default()).await
    }

    /// Starts a cluster with `options` (which give the number of members).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: K::Options) -> Result<Self, HarnessError> {
        let program = K::find()?;
        let n = K::members(&options).max(1);
        with_port_retries(K::CLUSTER, || Self::try_start(&program, &options, n)).await
    }

    async fn try_start(
        program: &K::Program,
        options: &K::Options,
        n: usize,
    ) -> Result<Self, HarnessError> {
        let dir = temp_dir(&K::CLUSTER.replace(' ', "-"))?;
        let ports: Vec<Vec<u16>> = free_ports(K::PORTS * n)?
            .chunks_exact(K::PORTS)
            .map(<[u16]>::to_vec)
            .collect();
        let links = K::peer_links(options, &ports).await?;
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let member_dir = dir.path().join(format!("m{}", i + 1));
            create_dir(K::CLUSTER, &member_dir)?;
            let member = Member {
                index: Some(i),
                ports: &ports,
                links: &links,
            };
            members.push(Server::prepare(program, options, &member_dir, member)?);
        }
        let hosts: Vec<String> = members.iter().map(|m| m.addr().to_string()).collect();
        let cluster = Self {
            members,
            links,
            label: format!("{} {}", K::CLUSTER, hosts.join(",")),
            _dir: dir,
        };
        first_error(futures::future::join_all(cluster.members.iter().map(K::initialize)).await)?;
        let _slots = K::start_slots(n).await?;
        let started = Instant::now();
        let mut offsets = Vec::with_capacity(n);
        for m in &cluster.members {
            offsets.push(m.node.spawn()?);
        }
        let waits = cluster
            .members
            .iter()
            .zip(offsets)
            .map(|(m, offset)| m.node.wait_ready(offset));
        first_error(futures::future::join_all(waits).await)?;
        if K::ELECTS_LEADER {
            let remaining = K::ready_timeout(options).saturating_sub(started.elapsed());
            cluster
                .wait_for_leader(remaining.max(Duration::from_secs(5)))
                .await?;
        }
        Ok(cluster)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the cluster has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i` (0-based).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn member(&self, i: usize) -> &Server<K> {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[Server<K>] {
        &self.members
    }

    /// `SCHEME://127.0.0.1:P1,127.0.0.1:P2,...` (every member, also stopped ones;
    /// `redlock://` for Redis nodes).
    pub fn url(&self) -> String {
        format!("{}://{}", K::CLUSTER_SCHEME, self.hosts().join(","))
    }

    /// `127.0.0.1:PORT` of every member.
    pub fn hosts(&self) -> Vec<String> {
        self.members.iter().map(|m| m.addr().to_string()).collect()
    }

    /// The URL of every member on its own.
    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(Server::url).collect()
    }

    /// Kills every member that runs and starts all of them again concurrently, on the
    /// same ports and data dirs (one consensus member alone cannot serve without a
    /// quorum); returns once every member is ready and, for a consensus cluster, there
    /// is one leader.
    ///
    /// # Errors
    /// If a member does not come back or no leader is elected in time.
    pub async fn restart_all(&self) -> Result<(), HarnessError> {
        let started = Instant::now();
        let timeout = self
            .members
            .iter()
            .map(|m| m.node.ready_timeout())
            .max()
            .unwrap_or(DEFAULT_READY_TIMEOUT);
        {
            let _slots = K::start_slots(self.members.len()).await?;
            futures::future::try_join_all(self.members.iter().map(|m| m.node.restart(|| Ok(()))))
                .await?;
        }
        if !K::ELECTS_LEADER {
            return Ok(());
        }
        let remaining = timeout.saturating_sub(started.elapsed());
        self.wait_for_leader(remaining.max(Duration::from_secs(5)))
            .await
            .map(|_| ())
    }

    /// The current leader's index, asking every running member: a majority of all
    /// members must answer, and they must agree on one leader among them.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] when that is not the case right now, and always for
    /// independent nodes.
    pub async fn leader(&self) -> Result<usize, HarnessError> {
        K::leader(&self.members, &self.label).await
    }

    /// Polls [`leader`](Self::leader) until it succeeds, for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if no leader shows up in time.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, HarnessError> {
        wait_for_leader(&self.label, None, timeout, || self.leader()).await
    }

    /// Polls until a leader other than member `old` is elected, for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if none shows up in time.
    pub async fn wait_for_new_leader(
        &self,
        old: usize,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        wait_for_leader(&self.label, Some(old), timeout, || self.leader()).await
    }
}

impl<K: ServerKind> Drop for Cluster<K> {
    fn drop(&mut self) {
        // Kill all first; each member's own drop then only reaps.
        for m in &self.members {
            m.node.kill_now();
        }
    }
}

/// What a backend's tests run on: one server alone, or a cluster, of one kind.
#[derive(Debug)]
pub enum Deployment<K: ServerKind> {
    /// One server.
    Single(Box<Server<K>>),
    /// Several (independent nodes or a consensus cluster).
    Cluster(Cluster<K>),
}

impl<K: ServerKind> Deployment<K> {
    /// Every server, in a stable order.
    pub fn members(&self) -> Vec<&Server<K>> {
        match self {
            Deployment::Single(server) => vec![&**server],
            Deployment::Cluster(cluster) => cluster.members().iter().collect(),
        }
    }

    /// Server `i`.
    ///
    /// # Panics
    /// If there is no such server.
    pub fn member(&self, i: usize) -> &Server<K> {
        self.members()[i]
    }

    /// The client address of every server.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members().iter().map(|m| m.addr()).collect()
    }

    /// `127.0.0.1:PORT` of every server.
    pub fn hosts(&self) -> Vec<String> {
        self.members()
            .iter()
            .map(|m| m.addr().to_string())
            .collect()
    }

    /// The URL of the server, or of the cluster.
    pub fn url(&self) -> String {
        match self {
            Deployment::Single(server) => server.url(),
            Deployment::Cluster(cluster) => cluster.url(),
        }
    }

    /// Fault controls of every server, as a chaos target hands them out.
    pub fn controls(&self) -> Vec<&dyn ServerControl> {
        self.members()
            .into_iter()
            .map(|m| m as &dyn ServerControl)
            .collect()
    }

    /// The cluster's current leader; `None` alone, for independent nodes, or when
    /// there is none right now.
    pub async fn leader(&self) -> Option<usize> {
        match self {
            Deployment::Single(_) => None,
            Deployment::Cluster(cluster) => cluster.leader().await.ok(),
        }
    }
}
