//! Configuration of a Redis lock client: the serde struct, its checks and the topology it
//! asks for ([`Mode`]); reading it from a URL is in `config/url.rs`.

mod url;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::{Capabilities, Error, FencingSource, LockOptions, Result};
use serde::{Deserialize, Serialize};

/// Default key prefix of lock keys.
pub const DEFAULT_PREFIX: &str = "distlock:";

/// Default Redis port.
pub const DEFAULT_PORT: u16 = 6379;

/// Default Sentinel port.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Default of [`RedisConfig::wait_timeout`].
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// Shortest TTL accepted on one server.
const MIN_TTL_SINGLE: Duration = Duration::from_millis(10);
/// Shortest TTL accepted by RedLock (it must cover several round trips and the drift).
const MIN_TTL_REDLOCK: Duration = Duration::from_millis(100);

/// Shortest first lease of a hold a release hands over ([`QueueTimes::grant`]).
const MIN_GRANT: Duration = Duration::from_secs(1);

/// Shortest hand-off window of a woken head of the queue.
const MIN_WINDOW: Duration = Duration::from_millis(20);

/// What a grant waits for before it is returned ([`RedisConfig::replica_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    /// Replicas that must acknowledge the grant, within `timeout`.
    pub(crate) replicas: u32,
    /// A primary without replicas grants without waiting (the default's rule).
    pub(crate) if_replicated: bool,
    pub(crate) timeout: Duration,
}

/// Which topology a configuration asks for: one per variant of
/// [`Topology`](crate::topology::Topology), named by the URL scheme (or the serde flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One server (`redis://`, `rediss://`).
    Single,
    /// The primary that Sentinels name (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel,
    /// Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
    Cluster,
    /// RedLock over independent servers (`redlock://`).
    RedLock,
}

/// The times of the waiter queue, from the client's options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueTimes {
    /// How long an entry stays without its waiter showing up: two rechecks and a
    /// request timeout (a live waiter shows up every recheck).
    pub(crate) stay: Duration,
    /// How long a woken head has to take the lock: a quarter of the recheck interval,
    /// at least 20 ms and at most the request timeout.
    pub(crate) window: Duration,
    /// The first lease of a hold that a release hands to the head of the queue (see
    /// `release_q.lua`), at most the lock's TTL: two rechecks, at least a second (room for
    /// the first renewal's round trip on a busy machine, whatever the recheck). The head
    /// renews it to the TTL; one that died holds the lock at most this long. It runs from
    /// the head's last queued attempt, at most a recheck before the grant.
    pub(crate) grant: Duration,
}

impl QueueTimes {
    pub(crate) fn new(recheck: Duration, request_timeout: Duration) -> Self {
        QueueTimes {
            stay: recheck.saturating_mul(2).saturating_add(request_timeout),
            window: (recheck / 4).max(MIN_WINDOW).min(request_timeout),
            grant: recheck.saturating_mul(2).max(MIN_GRANT),
        }
    }
}

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
}

impl RedisNode {
    /// The same host name (ignoring case) and port.
    fn same_name(&self, other: &RedisNode) -> bool {
        self.port == other.port && self.host.eq_ignore_ascii_case(&other.host)
    }
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

impl fmt::Display for RedisNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Everything a Redis lock client needs. Build it from a URL with
/// [`RedisConfig::from_url`] or deserialize it; every field has a default.
///
/// URL forms (query keys in brackets on each field):
/// - `redis://[user[:password]@]host[:port][/db][?query]`: one server.
/// - `rediss://…`: the same over TLS.
/// - `redlock://[user[:password]@]h1:p1,h2:p2,…[/db][?query]`: RedLock over independent
///   servers (5 is the usual number), all with the same credentials and database.
/// - `redis+sentinel://[user[:password]@]s1:p1,s2:p2,…/<master name>[/db][?query]`: the
///   primary that the Sentinels at `s1`, `s2`… (port 26379 by default) name for `<master
///   name>`, followed across failovers; the credentials are the data servers'
///   (\[`sentinel_username`\], \[`sentinel_password`\] for the Sentinels).
///   `rediss+sentinel://…`: the same over TLS, to the Sentinels and the data servers.
/// - `redis+cluster://[user[:password]@]h1:p1,h2:p2,…[?query]`: Redis Cluster, learnt from
///   the seed nodes `h1`, `h2`… (any nodes of the cluster; one that answers is enough).
///   Each lock lives on the primary that owns its key's hash slot; database 0 only, no
///   `node_timeout`. `rediss+cluster://…`: the same over TLS.
///
/// `Debug` never shows the password.
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// The servers (serde also reads `nodes`). Exactly one unless
    /// [`RedisConfig::redlock`]. Default `127.0.0.1:6379`.
    #[serde(alias = "nodes")]
    pub endpoints: Vec<RedisNode>,
    /// RedLock across [`RedisConfig::endpoints`] (the `redlock://` scheme). Default `false`.
    pub redlock: bool,
    /// TLS (`rediss://`, or \[`tls=true`\] on `redlock://`). Default `false`.
    pub tls: bool,
    /// PEM file of the CA certificates that sign the servers' certificates \[`ca_file`, or
    /// `tls_ca`\] (serde also reads `tls_ca`). Default: the system's trust store.
    #[serde(alias = "tls_ca")]
    pub ca_file: Option<PathBuf>,
    /// ACL user name. Default: none (the `default` user).
    pub username: Option<String>,
    /// Password (`AUTH`). Default: none. Never printed.
    pub password: Option<String>,
    /// Database number (the URL path `/N`). Default 0.
    pub db: i64,
    /// Prefix of every key this client writes \[`prefix`\]. Default `distlock:`; empty
    /// for the plain layout of other Redis lock libraries (the lock key is then the
    /// escaped lock name). Must not contain `{` or `}`.
    pub prefix: String,
    /// Waiters queue in arrival order and each release wakes only the head of the queue
    /// \[`queue`, `on` or `off`\]. Default `true`. With `false`, waiters do not queue:
    /// every release is published to all waiters of the name and the fastest takes it
    /// (no order, and work per hand-off that grows with the number of waiters). Choose
    /// `false` only while clients of a version without the queue still take the same
    /// names: they neither queue nor wake queued waiters (who then notice a release at
    /// their next recheck), and queued clients do not wake them.
    pub queue: bool,
    /// RedLock: how long one node may take to answer an acquire attempt or a renewal
    /// before it counts as failed \[`node_timeout`\]. Default: TTL / 10, at least 50 ms
    /// and at most the request timeout. A slow server costs an acquire this much only when
    /// no majority answered sooner: the outcome is taken as soon as a majority granted.
    #[serde(with = "lock_core::raw::durations::duration_text::option")]
    pub node_timeout: Option<Duration>,
    /// Redis Cluster (the `redis+cluster://` and `rediss+cluster://` schemes): the
    /// [`RedisConfig::endpoints`] are seed nodes from which the slot map is learnt; every
    /// request goes to the primary that owns its lock key's hash slot. Default `false`.
    pub cluster: bool,
    /// Sentinel: the name the Sentinels monitor the primary under (the URL path of
    /// `redis+sentinel://`). When set, [`RedisConfig::endpoints`] are the Sentinels and
    /// the client follows the primary they name. Default: none (no Sentinel).
    pub sentinel_master: Option<String>,
    /// Sentinel: ACL user name on the Sentinels \[`sentinel_username`\]. Default: none.
    pub sentinel_username: Option<String>,
    /// Sentinel: password of the Sentinels \[`sentinel_password`\]. Default: none. Never
    /// printed.
    pub sentinel_password: Option<String>,
    /// A grant is returned only once this many replicas acknowledged it (`WAIT n
    /// wait_timeout` after the acquire) \[`wait_replicas`\]; with fewer the grant is given
    /// back and the acquire fails with `Unavailable`. One server, Sentinel or Redis Cluster
    /// (the slot's primary). Default (`None`): on Sentinel and Redis Cluster one replica
    /// wherever the primary has one (`ROLE` lists its replicas; a primary without any
    /// grants without waiting), on one server none. `Some(0)` (`wait_replicas=0`) opts out.
    pub wait_replicas: Option<u32>,
    /// How long a grant waits for [`RedisConfig::wait_replicas`] \[`wait_timeout`\].
    /// Default 100 ms; at most `request_timeout`.
    #[serde(with = "lock_core::raw::durations::duration_text")]
    pub wait_timeout: Duration,
    /// Client-wide lock options (TTL, renewal, timeouts) (serde also reads `lock`). Query
    /// keys `ttl`, `renewal`, `max_hold`, `request_timeout`, `recheck`.
    #[serde(alias = "lock")]
    pub options: LockOptions,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            endpoints: vec![RedisNode::new("127.0.0.1", DEFAULT_PORT)],
            redlock: false,
            cluster: false,
            tls: false,
            ca_file: None,
            username: None,
            password: None,
            db: 0,
            prefix: DEFAULT_PREFIX.to_owned(),
            queue: true,
            node_timeout: None,
            sentinel_master: None,
            sentinel_username: None,
            sentinel_password: None,
            wait_replicas: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            options: LockOptions::default(),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("endpoints", &self.endpoints)
            .field("redlock", &self.redlock)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("prefix", &self.prefix)
            .field("queue", &self.queue)
            .field("node_timeout", &self.node_timeout)
            .field("cluster", &self.cluster)
            .field("sentinel_master", &self.sentinel_master)
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("options", &self.options)
            .finish()
    }
}

impl RedisConfig {
    /// A single-server configuration for `host:port`.
    pub fn single(host: impl Into<String>, port: u16) -> Self {
        RedisConfig {
            endpoints: vec![RedisNode::new(host, port)],
            ..RedisConfig::default()
        }
    }

    /// A RedLock configuration over `endpoints`.
    pub fn redlock(endpoints: Vec<RedisNode>) -> Self {
        RedisConfig {
            endpoints,
            redlock: true,
            ..RedisConfig::default()
        }
    }

    /// A Redis Cluster configuration that learns the cluster from the `seeds`.
    pub fn cluster(seeds: Vec<RedisNode>) -> Self {
        RedisConfig {
            endpoints: seeds,
            cluster: true,
            ..RedisConfig::default()
        }
    }

    /// A Sentinel configuration: the primary the Sentinels at `sentinels` name for
    /// `master`.
    pub fn sentinel(sentinels: Vec<RedisNode>, master: impl Into<String>) -> Self {
        RedisConfig {
            endpoints: sentinels,
            sentinel_master: Some(master.into()),
            ..RedisConfig::default()
        }
    }

    /// Checks what the lock options do not cover (those are [`LockOptions::validate`]'s):
    /// the parts that can be checked without a server.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::config(
                "a Redis configuration needs at least one node",
            ));
        }
        if let Some(master) = &self.sentinel_master {
            if self.redlock {
                return Err(Error::config(
                    "Sentinel and RedLock exclude each other: one names a primary, the other \
                     independent servers",
                ));
            }
            if master.is_empty() || master.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(Error::config(format!(
                    "the Sentinel master name must be a non-empty word, not {master:?}"
                )));
            }
        } else if self.sentinel_username.is_some() || self.sentinel_password.is_some() {
            return Err(Error::config(
                "sentinel_username and sentinel_password need Sentinel (redis+sentinel://)",
            ));
        }
        if self.cluster {
            if self.redlock || self.sentinel_master.is_some() {
                return Err(Error::config(
                    "Redis Cluster excludes RedLock and Sentinel: a cluster finds its primaries \
                     itself",
                ));
            }
            if self.db != 0 {
                return Err(Error::config(
                    "Redis Cluster has only database 0; drop the database path",
                ));
            }
            if self.node_timeout.is_some() {
                return Err(Error::config(
                    "node_timeout is a RedLock option; Redis Cluster calls are bounded by \
                     request_timeout",
                ));
            }
        }
        if self.wait_replicas.is_some_and(|n| n > 0) && self.redlock {
            return Err(Error::config(
                "wait_replicas needs one server or Sentinel; RedLock's servers have no replicas \
                 of the lock",
            ));
        }
        if self.wait_timeout.is_zero() || self.wait_timeout > self.options.request_timeout {
            return Err(Error::config(
                "wait_timeout must be greater than zero and at most request_timeout",
            ));
        }
        if !self.redlock
            && !self.cluster
            && self.sentinel_master.is_none()
            && self.endpoints.len() > 1
        {
            return Err(Error::config(
                "several nodes need `redlock: true` (RedLock); one Redis client talks to one server",
            ));
        }
        if self
            .endpoints
            .iter()
            .any(|n| n.host.is_empty() || n.port == 0)
        {
            return Err(Error::config("every node needs a host and a non-zero port"));
        }
        for (i, node) in self.endpoints.iter().enumerate() {
            if let Some(twice) = self.endpoints[..i].iter().find(|n| n.same_name(node)) {
                if self.sentinel_master.is_some() {
                    return Err(Error::config(format!(
                        "redis+sentinel:// lists the Sentinel {node} twice"
                    )));
                }
                if self.cluster {
                    return Err(Error::config(format!(
                        "redis+cluster:// lists the seed node {node} twice"
                    )));
                }
                return Err(twice_listed(twice, node, None));
            }
        }
        if self.prefix.contains(['{', '}']) {
            return Err(Error::config(
                "the key prefix must not contain `{` or `}` (they would change the keys' hash slot)",
            ));
        }
        if self.db < 0 {
            return Err(Error::config("the database number must not be negative"));
        }
        if let Some(timeout) = self.node_timeout {
            if timeout.is_zero() || timeout > lock_core::raw::durations::MAX_DURATION {
                return Err(Error::config(
                    "node_timeout must be greater than zero and at most one year",
                ));
            }
        }
        if self.ca_file.is_some() && !self.tls {
            return Err(Error::config(
                "ca_file or tls_ca needs TLS (rediss://, rediss+sentinel://, or tls=true on \
                 redlock://)",
            ));
        }
        Ok(())
    }

    /// How many servers must agree: a majority on RedLock, else the one server (behind
    /// Sentinels: the primary).
    pub fn quorum(&self) -> usize {
        match self.mode() {
            Mode::RedLock => self.endpoints.len() / 2 + 1,
            Mode::Single | Mode::Sentinel | Mode::Cluster => 1,
        }
    }

    /// The topology this configuration asks for (RedLock, Cluster and Sentinel exclude
    /// each other, see [`RedisConfig::validate`]).
    pub(crate) fn mode(&self) -> Mode {
        if self.redlock {
            Mode::RedLock
        } else if self.cluster {
            Mode::Cluster
        } else if self.sentinel_master.is_some() {
            Mode::Sentinel
        } else {
            Mode::Single
        }
    }

    /// What a grant waits for ([`RedisConfig::wait_replicas`]), if anything.
    pub(crate) fn replica_wait(&self) -> Option<ReplicaWait> {
        let (replicas, if_replicated) = match (self.wait_replicas, self.mode()) {
            (Some(replicas), _) => (replicas, false),
            (None, Mode::Sentinel | Mode::Cluster) => (1, true),
            (None, Mode::Single | Mode::RedLock) => (0, false),
        };
        (replicas > 0).then_some(ReplicaWait {
            replicas,
            if_replicated,
            timeout: self.wait_timeout,
        })
    }

    /// What a client of this configuration offers; known without a server.
    pub fn capabilities(&self) -> Capabilities {
        let base = Capabilities::new(self.backend())
            .fair(self.queue)
            .push_wakeup(true)
            .durable(false)
            .fence_at_least(true)
            .election(true)
            .semaphore(self.grants_shared())
            .rwlock(self.grants_shared());
        match self.mode() {
            Mode::RedLock => base
                .min_ttl(MIN_TTL_REDLOCK)
                .fencing(FencingSource::QuorumCounter),
            Mode::Single | Mode::Sentinel | Mode::Cluster => {
                base.min_ttl(MIN_TTL_SINGLE).fencing(FencingSource::Counter)
            }
        }
    }

    /// Whether a client grants the shared kinds (permits, readers, writers): on the
    /// waiter queue, where one server decides (one server, Sentinel, Redis Cluster); not on
    /// RedLock (see the README: a semaphore there needs more than a majority) nor without
    /// the queue.
    pub(crate) fn grants_shared(&self) -> bool {
        self.queue && self.mode() != Mode::RedLock
    }

    /// The backend's name in errors and metrics: `redlock` or `redis`.
    pub(crate) fn backend(&self) -> &'static str {
        match self.mode() {
            Mode::RedLock => "redlock",
            Mode::Single | Mode::Sentinel | Mode::Cluster => "redis",
        }
    }

    /// The times of the waiter queue under these options.
    pub(crate) fn queue_times(&self) -> QueueTimes {
        QueueTimes::new(self.options.recheck, self.options.request_timeout)
    }

    /// The per-node acquire deadline for a hold of `ttl` (RedLock).
    pub(crate) fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 10).max(Duration::from_millis(50)))
            .min(self.options.request_timeout)
    }

    /// The endpoint for messages: scheme and servers, never credentials.
    pub(crate) fn endpoint(&self) -> String {
        let scheme = match (self.mode(), self.tls) {
            (Mode::RedLock, _) => "redlock",
            (Mode::Cluster, true) => "rediss+cluster",
            (Mode::Cluster, false) => "redis+cluster",
            (Mode::Sentinel, true) => "rediss+sentinel",
            (Mode::Sentinel, false) => "redis+sentinel",
            (Mode::Single, true) => "rediss",
            (Mode::Single, false) => "redis",
        };
        let hosts: Vec<String> = self.endpoints.iter().map(ToString::to_string).collect();
        let mut text = format!("{scheme}://{}", hosts.join(","));
        if let Some(master) = &self.sentinel_master {
            text.push('/');
            text.push_str(master);
        }
        if self.db != 0 {
            text.push_str(&format!("/{}", self.db));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::raw::url::LockUrl;

    fn parse(text: &str) -> Result<RedisConfig> {
        RedisConfig::from_url(&LockUrl::parse(text)?)
    }

    #[test]
    fn debug_hides_the_password_and_serde_round_trips() {
        let c = parse("redis://user:s3cret@h:1?node_timeout=30ms").unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("***"),
            "{shown}"
        );
        let json = serde_json::to_string(&c).unwrap();
        let back: RedisConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        let partial: RedisConfig =
            serde_json::from_str(r#"{"nodes":[{"host":"h"}],"prefix":"p:"}"#).unwrap();
        assert_eq!(partial.endpoints[0].port, DEFAULT_PORT);
        assert_eq!(partial.options, LockOptions::default());
        let renamed: RedisConfig =
            serde_json::from_str(r#"{"endpoints":[{"host":"h"}],"ca_file":"/ca.pem"}"#).unwrap();
        assert_eq!(renamed.endpoints, partial.endpoints);
        assert_eq!(renamed.ca_file, Some(PathBuf::from("/ca.pem")));
    }

    #[test]
    fn queue_times_follow_the_options() {
        let times = QueueTimes::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(times.stay, Duration::from_secs(7));
        assert_eq!(times.window, Duration::from_millis(250));
        assert_eq!(times.grant, Duration::from_secs(2));
        let fast = QueueTimes::new(Duration::from_millis(40), Duration::from_millis(15));
        assert_eq!(fast.window, Duration::from_millis(15));
        assert_eq!(fast.grant, MIN_GRANT);
        let slow = QueueTimes::new(Duration::from_millis(40), Duration::from_secs(5));
        assert_eq!(slow.window, MIN_WINDOW);
    }

    #[test]
    fn node_timeout_defaults_to_a_tenth_of_the_ttl() {
        let c = RedisConfig::default();
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_millis(100)),
            Duration::from_millis(50)
        );
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(3600)),
            c.options.request_timeout
        );
    }
}
