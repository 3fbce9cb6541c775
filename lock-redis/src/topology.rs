//! Where a client's requests go: the [`Topology`] its configuration asks for, chosen once
//! at open, and [`Servers`], what the protocol pieces run their scripts through.
//!
//! The protocol pieces (`hold.rs`, `queue.rs`, `attempt.rs`, `redlock.rs`, `operator.rs`)
//! ask only where a key goes ([`Servers::routes`]), how many servers must agree
//! ([`Topology::quorum`]) and which one orders the waiters ([`Topology::arbiter`]); they
//! never look at the configuration's deployment.

use std::sync::Arc;

use futures::future::join_all;
use lock_core::{ErrorKind, Result};
use tokio::time::Instant;

use crate::config::{QueueTimes, RedisConfig, RedisDeployment, RedisNode};
use crate::connection::{redis_client, slot_of, Node, Route, Sentinels, Shards, Target};
use crate::error;
use crate::layout::{self, KeyLayout};
use crate::scripts::Scripts;

/// The servers of one client, one variant per URL scheme family.
pub(crate) enum Topology {
    /// One server (`redis://`, `rediss://`).
    Single(Node),
    /// The primary that Sentinels name, followed across failovers (`redis+sentinel://`).
    Sentinel(Node),
    /// Redis Cluster: each key on the primary serving its hash slot (`redis+cluster://`).
    Cluster(Arc<Shards>),
    /// RedLock over independent servers, a majority deciding (`redlock://`).
    RedLock {
        nodes: Vec<Node>,
        /// The first server in sorted `host:port` order: the one whose queue orders the
        /// waiters while no server's identity is known (see [`Topology::arbiter`]).
        first_listed: usize,
    },
}

impl Topology {
    /// The topology `config` asks for, trusting `ca` (PEM) for TLS. Opens no connection.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) when the client library refuses the configuration.
    pub(crate) fn new(
        backend: &'static str,
        config: &RedisConfig,
        ca: Option<&[u8]>,
    ) -> Result<Self> {
        let timeout = config.options.request_timeout;
        let server = |node: &RedisNode| {
            let client = redis_client(config, node, ca).map_err(|err| {
                error::from_client(backend, format_args!("configure on {node}"), err)
            })?;
            Ok(Node::new(
                backend,
                node.to_string(),
                Target::Server(Box::new(client)),
                timeout,
            ))
        };
        Ok(match &config.deployment {
            RedisDeployment::Single { node, .. } => Topology::Single(server(node)?),
            RedisDeployment::Sentinel {
                sentinels,
                master,
                auth,
                ..
            } => {
                let sentinels = Sentinels::new(backend, config, sentinels, master, auth, ca)
                    .map_err(|err| {
                        error::from_client(
                            backend,
                            format_args!("configure {}", config.endpoint()),
                            err,
                        )
                    })?;
                let label = sentinels.label();
                Topology::Sentinel(Node::new(
                    backend,
                    label,
                    Target::Primary(Arc::new(sentinels)),
                    timeout,
                ))
            }
            RedisDeployment::Cluster { seeds } => {
                Topology::Cluster(Arc::new(Shards::new(backend, config, seeds, ca)?))
            }
            RedisDeployment::RedLock { nodes, .. } => Topology::RedLock {
                nodes: nodes
                    .iter()
                    .map(|node| server(node).map(Node::identified))
                    .collect::<Result<_>>()?,
                first_listed: first_listed(nodes),
            },
        })
    }

    /// Checks at open that the servers answer: the one server (behind Sentinels: the
    /// primary they name), a majority of RedLock's, or on Redis Cluster a seed that
    /// answers `CLUSTER SLOTS` with a formed cluster.
    ///
    /// # Errors
    /// The server's error; [`Error::Unavailable`](lock_core::Error::Unavailable) when fewer than a majority of RedLock
    /// servers answer.
    pub(crate) async fn check(&self, backend: &'static str, deadline: Instant) -> Result<()> {
        let nodes = match self {
            Topology::Cluster(shards) => return shards.reload(0, deadline).await,
            Topology::Single(node) | Topology::Sentinel(node) => return node.ping(deadline).await,
            Topology::RedLock { nodes, .. } => nodes,
        };
        let pings = join_all(nodes.iter().map(|n| n.ping(deadline))).await;
        let mut answered = 0;
        let mut first_error = None;
        for ping in pings {
            match ping {
                Ok(()) => answered += 1,
                Err(err) if err.kind() == ErrorKind::InvalidConfig => return Err(err),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        let quorum = self.quorum();
        if answered >= quorum {
            return Ok(());
        }
        Err(match (nodes.len(), first_error) {
            (1, Some(err)) => err,
            (n, err) => error::no_majority(
                backend,
                format!("only {answered} of {n} servers answered; RedLock needs {quorum}"),
                err,
            ),
        })
    }

    /// The servers each request goes to (none on Redis Cluster, whose primaries
    /// [`Shards`] knows).
    pub(crate) fn nodes(&self) -> &[Node] {
        match self {
            Topology::Single(node) | Topology::Sentinel(node) => std::slice::from_ref(node),
            Topology::RedLock { nodes, .. } => nodes,
            Topology::Cluster(_) => &[],
        }
    }

    /// Redis Cluster's slot map and primaries.
    pub(crate) fn shards(&self) -> Option<&Arc<Shards>> {
        match self {
            Topology::Cluster(shards) => Some(shards),
            _ => None,
        }
    }

    /// RedLock: a majority of independent servers decides.
    pub(crate) fn is_redlock(&self) -> bool {
        matches!(self, Topology::RedLock { .. })
    }

    /// How many servers must agree: a majority on RedLock, else the one that owns the key.
    pub(crate) fn quorum(&self) -> usize {
        match self {
            Topology::RedLock { nodes, .. } => nodes.len() / 2 + 1,
            _ => 1,
        }
    }

    /// The index (in [`Servers::routes`]) of the server whose queue orders the waiters.
    ///
    /// On RedLock every client must pick the same server however it addresses them (a
    /// proxy, another host name, a mapped port: else each queues on its own server and
    /// no queue orders them all): the server with the lowest `run_id` among those whose
    /// identity this client read ([`Node::identity`]), else the first in sorted
    /// `host:port` order. Clients can disagree for a moment after a server restarted
    /// (its `run_id` is new) until each has reconnected to it: that costs fairness for
    /// that moment, never safety (a majority grants).
    pub(crate) fn arbiter(&self) -> usize {
        match self {
            Topology::RedLock {
                nodes,
                first_listed,
            } => nodes
                .iter()
                .enumerate()
                .filter_map(|(i, node)| node.identity().map(|id| (id, i)))
                .min()
                .map_or(*first_listed, |(_, i)| i),
            _ => 0,
        }
    }

    /// Where the requests for lock key `key` go: every server (RedLock), the one server,
    /// or on Redis Cluster the primary serving the key's hash slot.
    pub(crate) fn routes(&self, key: &str) -> Vec<Route<'_>> {
        match self {
            Topology::Cluster(shards) => vec![Route::Slot(shards, slot_of(key.as_bytes()))],
            _ => self.nodes().iter().map(Route::Node).collect(),
        }
    }
}

/// The index of the first of `endpoints` in sorted order (`host:port`, ignoring case).
fn first_listed(endpoints: &[RedisNode]) -> usize {
    (0..endpoints.len())
        .min_by_key(|&i| endpoints[i].to_string().to_ascii_lowercase())
        .unwrap_or(0)
}

/// A client's servers and what its scripts need to address them: the topology, the
/// scripts in its flavour, the key layout and the client's wake-up channel.
pub(crate) struct Servers {
    /// `redis` or `redlock`, for errors and metrics.
    pub(crate) backend: &'static str,
    pub(crate) topology: Topology,
    pub(crate) config: RedisConfig,
    pub(crate) keys: KeyLayout,
    pub(crate) scripts: Scripts,
    pub(crate) queue_times: QueueTimes,
    /// This client's id in waiter ids and its wake-up channel's name.
    pub(crate) client_id: String,
    /// What precedes a client id in a wake-up channel's name.
    pub(crate) channel_prefix: String,
}

impl Servers {
    /// The servers of `topology`, configured by `config`.
    pub(crate) fn new(backend: &'static str, topology: Topology, config: RedisConfig) -> Self {
        let keys = KeyLayout::new(config.prefix.clone());
        let channel_prefix = keys.client_channel_prefix();
        Servers {
            backend,
            scripts: Scripts::new(backend, topology.shards().is_some()),
            topology,
            keys,
            queue_times: config.queue_times(),
            client_id: uuid::Uuid::new_v4().simple().to_string(),
            channel_prefix,
            config,
        }
    }

    /// Now plus the request timeout.
    pub(crate) fn request_deadline(&self) -> Instant {
        Instant::now() + self.config.options.request_timeout
    }

    /// See [`Topology::routes`].
    pub(crate) fn routes(&self, key: &str) -> Vec<Route<'_>> {
        self.topology.routes(key)
    }

    /// See [`Topology::quorum`].
    pub(crate) fn quorum(&self) -> usize {
        self.topology.quorum()
    }

    /// What precedes a client id in the wake-up channel of a queued waiter of lock key
    /// `key`: the client's own channel, or on Redis Cluster its channel for this name, in
    /// the name's hash slot (a sharded channel lives on one shard).
    pub(crate) fn channel_prefix_for(&self, key: &str) -> String {
        match self.topology {
            Topology::Cluster(_) => self.keys.side_key(key, layout::CLIENT),
            _ => self.channel_prefix.clone(),
        }
    }
}
