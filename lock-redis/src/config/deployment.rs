//! Which Redis servers a client uses and how they decide: [`RedisDeployment`], one variant
//! per URL scheme family, with the checks of its values.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use lock_core::{Error, Result};
use serde::{Deserialize, Serialize};

use super::DEFAULT_PORT;

/// One Redis server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisNode {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port. Default 6379.
    #[serde(default = "default_port")]
    pub port: u16,
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

impl RedisNode {
    /// A node at `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        RedisNode {
            host: host.into(),
            port,
        }
    }

    /// `127.0.0.1:6379`, the server of the default configuration.
    pub(crate) fn local() -> Self {
        RedisNode::new("127.0.0.1", DEFAULT_PORT)
    }

    /// The same host name (ignoring case) and port.
    fn same_name(&self, other: &RedisNode) -> bool {
        self.port == other.port && self.host.eq_ignore_ascii_case(&other.host)
    }
}

impl fmt::Display for RedisNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The credentials of the Sentinels (the data servers' are the configuration's
/// `username` and `password`). `Debug` never shows the password.
#[non_exhaustive]
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SentinelAuth {
    /// ACL user name on the Sentinels \[`sentinel_username`\]. Default: none.
    pub username: Option<String>,
    /// Password of the Sentinels \[`sentinel_password`\]. Default: none. Never printed.
    pub password: Option<String>,
}

impl fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Which Redis servers a client uses and how they decide, named by the URL scheme. Serde
/// reads it as a map whose `topology` names the variant (`single`, `sentinel`, `cluster`
/// or `redlock`) beside the variant's fields; see the crate's README for one of each.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "topology", rename_all = "lowercase", deny_unknown_fields)]
pub enum RedisDeployment {
    /// One server (`redis://`, `rediss://`).
    Single {
        /// The server. Default `127.0.0.1:6379`.
        #[serde(default = "RedisNode::local")]
        node: RedisNode,
        /// Database number (the URL path `/N`). Default 0.
        #[serde(default)]
        db: i64,
    },
    /// The primary that Sentinels name for `master`, followed across failovers
    /// (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel {
        /// The Sentinels (port 26379 by default in a URL).
        sentinels: Vec<RedisNode>,
        /// The name the Sentinels monitor the primary under (the first part of the URL
        /// path).
        master: String,
        /// The Sentinels' credentials. Default: none.
        #[serde(default)]
        auth: SentinelAuth,
        /// Database number on the data servers (the URL path's `/N` after the master
        /// name). Default 0.
        #[serde(default)]
        db: i64,
    },
    /// Redis Cluster (`redis+cluster://`, `rediss+cluster://`): each lock on the primary
    /// that owns its key's hash slot; database 0 only.
    Cluster {
        /// Any nodes of the cluster, from which the slot map is learnt (one that answers
        /// is enough).
        seeds: Vec<RedisNode>,
    },
    /// RedLock over independent servers (`redlock://`), a majority deciding.
    RedLock {
        /// The servers (5 is the usual number).
        nodes: Vec<RedisNode>,
        /// How long one server may take to answer an acquire attempt or a renewal before
        /// it counts as failed \[`node_timeout`\]. Default: TTL / 10, at least 50 ms and
        /// at most the request timeout. A slow server costs an acquire this much only
        /// when no majority answered sooner: the outcome is taken as soon as a majority
        /// granted.
        #[serde(default, with = "lock_core::raw::durations::duration_text::option")]
        node_timeout: Option<Duration>,
        /// Database number on every server (the URL path `/N`). Default 0.
        #[serde(default)]
        db: i64,
    },
}

impl Default for RedisDeployment {
    fn default() -> Self {
        RedisDeployment::Single {
            node: RedisNode::local(),
            db: 0,
        }
    }
}

impl RedisDeployment {
    /// The servers listed: the one server, the Sentinels, the seed nodes or RedLock's.
    pub fn nodes(&self) -> &[RedisNode] {
        match self {
            RedisDeployment::Single { node, .. } => std::slice::from_ref(node),
            RedisDeployment::Sentinel { sentinels, .. } => sentinels,
            RedisDeployment::Cluster { seeds } => seeds,
            RedisDeployment::RedLock { nodes, .. } => nodes,
        }
    }

    /// The database number (always 0 on Redis Cluster).
    pub fn db(&self) -> i64 {
        match self {
            RedisDeployment::Single { db, .. }
            | RedisDeployment::Sentinel { db, .. }
            | RedisDeployment::RedLock { db, .. } => *db,
            RedisDeployment::Cluster { .. } => 0,
        }
    }

    /// RedLock: a majority of independent servers decides.
    pub(crate) fn is_redlock(&self) -> bool {
        matches!(self, RedisDeployment::RedLock { .. })
    }

    /// How many servers must agree: a majority on RedLock, else the one server (behind
    /// Sentinels: the primary; on Redis Cluster: the primary of the key's slot).
    pub(crate) fn quorum(&self) -> usize {
        match self {
            RedisDeployment::RedLock { nodes, .. } => nodes.len() / 2 + 1,
            _ => 1,
        }
    }

    /// RedLock's `node_timeout`, if given.
    pub(crate) fn node_timeout(&self) -> Option<Duration> {
        match self {
            RedisDeployment::RedLock { node_timeout, .. } => *node_timeout,
            _ => None,
        }
    }

    /// The URL scheme of this deployment (`tls`: over TLS; RedLock has one scheme).
    pub(crate) fn scheme(&self, tls: bool) -> &'static str {
        match (self, tls) {
            (RedisDeployment::RedLock { .. }, _) => "redlock",
            (RedisDeployment::Cluster { .. }, true) => "rediss+cluster",
            (RedisDeployment::Cluster { .. }, false) => "redis+cluster",
            (RedisDeployment::Sentinel { .. }, true) => "rediss+sentinel",
            (RedisDeployment::Sentinel { .. }, false) => "redis+sentinel",
            (RedisDeployment::Single { .. }, true) => "rediss",
            (RedisDeployment::Single { .. }, false) => "redis",
        }
    }

    /// Checks the values: lists not empty, hosts and ports given, no server listed
    /// twice, a master name that is one word, a database number not negative, a
    /// `node_timeout` in range.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub(crate) fn validate(&self) -> Result<()> {
        let nodes = self.nodes();
        if nodes.is_empty() {
            return Err(Error::config(
                "a Redis configuration needs at least one node",
            ));
        }
        if nodes.iter().any(|n| n.host.is_empty() || n.port == 0) {
            return Err(Error::config("every node needs a host and a non-zero port"));
        }
        for (i, node) in nodes.iter().enumerate() {
            if let Some(twice) = nodes[..i].iter().find(|n| n.same_name(node)) {
                return Err(match self {
                    RedisDeployment::Sentinel { .. } => {
                        Error::config(format!("redis+sentinel:// lists the Sentinel {node} twice"))
                    }
                    RedisDeployment::Cluster { .. } => {
                        Error::config(format!("redis+cluster:// lists the seed node {node} twice"))
                    }
                    _ => twice_listed(twice, node, None),
                });
            }
        }
        if let RedisDeployment::Sentinel { master, .. } = self {
            if master.is_empty() || master.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(Error::config(format!(
                    "the Sentinel master name must be a non-empty word, not {master:?}"
                )));
            }
        }
        if self.db() < 0 {
            return Err(Error::config("the database number must not be negative"));
        }
        if let Some(timeout) = self.node_timeout() {
            check_node_timeout(timeout)?;
        }
        Ok(())
    }
}

/// Checks a `node_timeout`: greater than zero and at most one year.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `node_timeout`.
pub(super) fn check_node_timeout(timeout: Duration) -> Result<()> {
    if timeout.is_zero() || timeout > lock_core::raw::durations::MAX_DURATION {
        return Err(Error::config(
            "node_timeout must be greater than zero and at most one year",
        ));
    }
    Ok(())
}

/// RedLock servers `a` and `b` are one server (at `addr`, when known from their resolved
/// addresses).
pub(crate) fn twice_listed(a: &RedisNode, b: &RedisNode, addr: Option<SocketAddr>) -> Error {
    let how = match addr {
        Some(addr) => format!(" ({a} and {b} both resolve to {addr})"),
        None => String::new(),
    };
    Error::config(format!(
        "redlock:// lists the same server twice{how}: one server would count as several \
         votes of the majority"
    ))
}
