//! Configuration of a Redis lock client: the serde struct and its checks; the deployment
//! it names is in `config/deployment.rs`, reading it from a URL in `config/url.rs`.

mod deployment;
mod url;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::{Capabilities, Error, FencingSource, LockOptions, Result};
use serde::{Deserialize, Serialize};

pub(crate) use deployment::twice_listed;
pub use deployment::{RedisDeployment, RedisNode, SentinelAuth};

/// Default key prefix of lock keys.
pub const DEFAULT_PREFIX: &str = "distlock:";

/// Default Redis port.
pub const DEFAULT_PORT: u16 = 6379;

/// Default Sentinel port.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The longest a grant waits for its replicas when [`RedisConfig::wait_timeout`] is not
/// set (see [`RedisConfig::replica_wait_timeout`]).
const LONGEST_DEFAULT_WAIT: Duration = Duration::from_secs(1);

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

    /// The first lease of a hold a release hands to a queued waiter of `ttl`:
    /// [`QueueTimes::grant`], at most the TTL.
    pub(crate) fn grant_for(&self, ttl: Duration) -> Duration {
        self.grant.min(ttl)
    }
}

/// Everything a Redis lock client needs. Build it from a URL with
/// [`RedisConfig::from_url`] or deserialize it; every field has a default.
///
/// URL forms (query keys in brackets on each field), each read into one
/// [`RedisDeployment`]:
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
/// `Debug` never shows the passwords.
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// The servers and how they decide (the URL's scheme, hosts and path). Default: one
    /// server at `127.0.0.1:6379`, database 0.
    pub deployment: RedisDeployment,
    /// TLS (`rediss://`, `rediss+sentinel://`, `rediss+cluster://`, or \[`tls=true`\] on
    /// `redlock://`). Default `false`.
    pub tls: bool,
    /// PEM file of the CA certificates that sign the servers' certificates \[`ca_file`, or
    /// `tls_ca`\] (serde also reads `tls_ca`). Default: the system's trust store.
    #[serde(alias = "tls_ca")]
    pub ca_file: Option<PathBuf>,
    /// ACL user name on the data servers. Default: none (the `default` user).
    pub username: Option<String>,
    /// Password (`AUTH`) on the data servers. Default: none. Never printed.
    pub password: Option<String>,
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
    /// A grant is returned only once this many replicas acknowledged it (`WAIT n
    /// wait_timeout` after the acquire) \[`wait_replicas`\]; with fewer the grant is given
    /// back and the acquire fails with `Unavailable`. One server, Sentinel or Redis Cluster
    /// (the slot's primary); RedLock's servers have no replicas of the lock. Default
    /// (`None`): on Sentinel and Redis Cluster one replica wherever the primary has one
    /// (`ROLE` lists its replicas; a primary without any grants without waiting), on one
    /// server none. `Some(0)` (`wait_replicas=0`) opts out.
    pub wait_replicas: Option<u32>,
    /// How long a grant waits for [`RedisConfig::wait_replicas`] \[`wait_timeout`\]; at
    /// most `request_timeout`. Default (`None`): the shortest of 1 s, half the
    /// `request_timeout` and half the TTL ([`RedisConfig::replica_wait_timeout`]). WAIT
    /// returns as soon as the replicas acknowledge, so the deadline costs time only when
    /// one is slow: then the grant waits instead of failing.
    #[serde(with = "lock_core::raw::durations::duration_text::option")]
    pub wait_timeout: Option<Duration>,
    /// Client-wide lock options (TTL, renewal, timeouts) (serde also reads `lock`). Query
    /// keys `ttl`, `renewal`, `max_hold`, `request_timeout`, `recheck`.
    #[serde(alias = "lock")]
    pub options: LockOptions,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig::new(RedisDeployment::default())
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("deployment", &self.deployment)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("queue", &self.queue)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("options", &self.options)
            .finish()
    }
}

impl RedisConfig {
    /// A configuration of `deployment`, every other field at its default.
    pub fn new(deployment: RedisDeployment) -> Self {
        RedisConfig {
            deployment,
            tls: false,
            ca_file: None,
            username: None,
            password: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            queue: true,
            wait_replicas: None,
            wait_timeout: None,
            options: LockOptions::default(),
        }
    }

    /// A single-server configuration for `host:port`.
    pub fn single(host: impl Into<String>, port: u16) -> Self {
        RedisConfig::new(RedisDeployment::Single {
            node: RedisNode::new(host, port),
            db: 0,
        })
    }

    /// A RedLock configuration over `nodes`.
    pub fn redlock(nodes: Vec<RedisNode>) -> Self {
        RedisConfig::new(RedisDeployment::RedLock {
            nodes,
            node_timeout: None,
            db: 0,
        })
    }

    /// A Redis Cluster configuration that learns the cluster from the `seeds`.
    pub fn cluster(seeds: Vec<RedisNode>) -> Self {
        RedisConfig::new(RedisDeployment::Cluster { seeds })
    }

    /// A Sentinel configuration: the primary the Sentinels at `sentinels` name for
    /// `master`.
    pub fn sentinel(sentinels: Vec<RedisNode>, master: impl Into<String>) -> Self {
        RedisConfig::new(RedisDeployment::Sentinel {
            sentinels,
            master: master.into(),
            auth: SentinelAuth::default(),
            db: 0,
        })
    }

    /// Checks what the lock options do not cover (those are [`LockOptions::validate`]'s):
    /// the values that can be checked without a server.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<()> {
        self.deployment.validate()?;
        if self.wait_replicas.is_some_and(|n| n > 0) && self.deployment.is_redlock() {
            return Err(Error::config(
                "wait_replicas needs one server or Sentinel; RedLock's servers have no replicas \
                 of the lock",
            ));
        }
        if self
            .wait_timeout
            .is_some_and(|wait| wait.is_zero() || wait > self.options.request_timeout)
        {
            return Err(Error::config(
                "wait_timeout must be greater than zero and at most request_timeout",
            ));
        }
        if self.prefix.contains(['{', '}']) {
            return Err(Error::config(
                "the key prefix must not contain `{` or `}` (they would change the keys' hash slot)",
            ));
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
        self.deployment.quorum()
    }

    /// What a grant waits for ([`RedisConfig::wait_replicas`]), if anything.
    pub(crate) fn replica_wait(&self) -> Option<ReplicaWait> {
        let (replicas, if_replicated) = match (self.wait_replicas, &self.deployment) {
            (Some(replicas), _) => (replicas, false),
            (None, RedisDeployment::Sentinel { .. } | RedisDeployment::Cluster { .. }) => (1, true),
            (None, _) => (0, false),
        };
        (replicas > 0).then_some(ReplicaWait {
            replicas,
            if_replicated,
            timeout: self.replica_wait_timeout(),
        })
    }

    /// How long a grant waits for its replicas: [`RedisConfig::wait_timeout`] when set,
    /// else the shortest of 1 s, half the `request_timeout` (the grant and its WAIT fit
    /// one request's deadline) and half the TTL (a grant keeps most of its lease).
    pub fn replica_wait_timeout(&self) -> Duration {
        self.wait_timeout.unwrap_or_else(|| {
            LONGEST_DEFAULT_WAIT
                .min(self.options.request_timeout / 2)
                .min(self.options.ttl / 2)
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
            .semaphore_many(self.grants_shared())
            .semaphore_resize(self.grants_shared())
            .rwlock(self.grants_shared())
            .upgradeable(self.grants_shared());
        if self.deployment.is_redlock() {
            base.min_ttl(MIN_TTL_REDLOCK)
                .fencing(FencingSource::QuorumCounter)
        } else {
            base.min_ttl(MIN_TTL_SINGLE).fencing(FencingSource::Counter)
        }
    }

    /// Whether a client grants the shared kinds (permits, readers, writers): on the
    /// waiter queue, where one server decides (one server, Sentinel, Redis Cluster); not on
    /// RedLock (see the README: a semaphore there needs more than a majority) nor without
    /// the queue.
    pub(crate) fn grants_shared(&self) -> bool {
        self.queue && !self.deployment.is_redlock()
    }

    /// The backend's name in errors and metrics: `redlock` or `redis`.
    pub(crate) fn backend(&self) -> &'static str {
        if self.deployment.is_redlock() {
            "redlock"
        } else {
            "redis"
        }
    }

    /// The times of the waiter queue under these options.
    pub(crate) fn queue_times(&self) -> QueueTimes {
        QueueTimes::new(self.options.recheck, self.options.request_timeout)
    }

    /// The per-node acquire deadline for a hold of `ttl` (RedLock).
    pub(crate) fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.deployment
            .node_timeout()
            .unwrap_or_else(|| (ttl / 10).max(Duration::from_millis(50)))
            .min(self.options.request_timeout)
    }

    /// The endpoint for messages: scheme and servers, never credentials.
    pub(crate) fn endpoint(&self) -> String {
        let deployment = &self.deployment;
        let hosts: Vec<String> = deployment.nodes().iter().map(ToString::to_string).collect();
        let mut text = format!("{}://{}", deployment.scheme(self.tls), hosts.join(","));
        if let RedisDeployment::Sentinel { master, .. } = deployment {
            text.push('/');
            text.push_str(master);
        }
        if deployment.db() != 0 {
            text.push_str(&format!("/{}", deployment.db()));
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
    fn the_default_replica_wait_follows_the_request_deadline_and_the_ttl() {
        let wait = |query: &str| {
            parse(&format!("redis+sentinel://s/m?{query}"))
                .unwrap()
                .replica_wait_timeout()
        };
        // Defaults: request_timeout 5 s, TTL 30 s: the 1 s ceiling.
        assert_eq!(wait("queue=on"), Duration::from_secs(1));
        assert_eq!(wait("request_timeout=300ms"), Duration::from_millis(150));
        assert_eq!(wait("ttl=500ms"), Duration::from_millis(250));
        assert_eq!(wait("wait_timeout=2s"), Duration::from_secs(2));
        let valid = |query: &str| {
            parse(&format!("redis+sentinel://s/m?{query}"))
                .and_then(|config| config.validate())
                .map_err(|err| err.to_string())
        };
        let explicit = valid("wait_timeout=2s&request_timeout=1s");
        assert!(explicit.unwrap_err().contains("wait_timeout"));
        // A short request deadline does not conflict with the default.
        assert_eq!(valid("request_timeout=200ms"), Ok(()));
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
        let single = r#"{"topology":"single","node":{"host":"h"}}"#;
        let partial: RedisConfig =
            serde_json::from_str(&format!(r#"{{"deployment":{single},"prefix":"p:"}}"#)).unwrap();
        assert_eq!(partial.deployment.nodes()[0].port, DEFAULT_PORT);
        assert_eq!(partial.options, LockOptions::default());
        let renamed: RedisConfig =
            serde_json::from_str(&format!(r#"{{"deployment":{single},"tls_ca":"/ca.pem"}}"#))
                .unwrap();
        assert_eq!(renamed.deployment, partial.deployment);
        assert_eq!(renamed.ca_file, Some(PathBuf::from("/ca.pem")));
    }

    /// The README shows one deployment of each kind in JSON: each reads into its variant
    /// and passes the checks; a field of another variant, or the flags of old, does not.
    #[test]
    fn readme_deployments_deserialize() {
        let readme = include_str!("../README.md");
        let shown: Vec<RedisConfig> = readme
            .split("```json\n")
            .skip(1)
            .filter_map(|block| block.split("```").next())
            .map(|json| serde_json::from_str(json).expect(json))
            .collect();
        let kinds: Vec<&str> = shown
            .iter()
            .map(|c| {
                c.validate().expect("valid");
                c.deployment.scheme(false)
            })
            .collect();
        assert_eq!(
            kinds,
            ["redis", "redis+sentinel", "redis+cluster", "redlock"]
        );
        for refused in [
            r#"{"deployment":{"topology":"cluster","seeds":[{"host":"a"}],"db":1}}"#,
            r#"{"deployment":{"topology":"single","node_timeout":"1s"}}"#,
            r#"{"deployment":{"topology":"twemproxy"}}"#,
            r#"{"endpoints":[{"host":"a"}],"redlock":true}"#,
        ] {
            assert!(
                serde_json::from_str::<RedisConfig>(refused).is_err(),
                "{refused}"
            );
        }
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
