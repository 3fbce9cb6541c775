//! Reading a lock URL (`redis://`, `rediss://`, `redlock://`, `redis+sentinel://`,
//! `redis+cluster://` and their TLS forms) into a [`RedisConfig`].

use std::path::PathBuf;

use lock_core::raw::url::LockUrl;
use lock_core::{Error, Result};

use super::deployment::check_node_timeout;
use super::{
    RedisConfig, RedisDeployment, RedisNode, SentinelAuth, DEFAULT_PORT, DEFAULT_SENTINEL_PORT,
};
use crate::SCHEMES;

/// Query keys this backend reads besides the common ones of [`LockOptions`](lock_core::LockOptions).
const BACKEND_KEYS: &str = "prefix, queue, node_timeout, tls, ca_file (or tls_ca), \
     wait_replicas, wait_timeout, sentinel_username, sentinel_password";

impl RedisConfig {
    /// Parses `redis://`, `rediss://`, `redlock://`, `redis+sentinel://`,
    /// `rediss+sentinel://`, `redis+cluster://` or `rediss+cluster://` URLs (see
    /// [`RedisConfig`]).
    ///
    /// Only parses: a connect checks the values once before it opens the backend, and
    /// [`RedisBackend::config_from_str`](crate::RedisBackend) gives a checked configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, a wrong number of hosts, a path that
    /// is not a database number, an unknown query key or a bad value. Messages never
    /// contain the password.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let scheme = url.scheme.as_str();
        let nodes = |port: u16| -> Vec<RedisNode> {
            url.hosts
                .iter()
                .map(|h| RedisNode::new(h.host.clone(), h.port.unwrap_or(port)))
                .collect()
        };
        let listed = |port: u16, what: &str, example: &str| -> Result<Vec<RedisNode>> {
            let nodes = nodes(port);
            if nodes.is_empty() {
                return Err(Error::config(format!(
                    "{scheme}:// needs a list of {what}: {scheme}://{example}"
                )));
            }
            Ok(nodes)
        };
        let deployment = match scheme {
            "redis" | "rediss" => {
                let mut nodes = nodes(DEFAULT_PORT);
                if nodes.len() > 1 {
                    return Err(Error::config(format!(
                        "{scheme}:// takes one server; use redlock:// for several independent \
                         servers"
                    )));
                }
                RedisDeployment::Single {
                    node: nodes.pop().unwrap_or_else(RedisNode::local),
                    db: db_number(&url.path)?,
                }
            }
            "redlock" => RedisDeployment::RedLock {
                nodes: listed(DEFAULT_PORT, "servers", "h1:p1,h2:p2,h3:p3")?,
                node_timeout: None,
                db: db_number(&url.path)?,
            },
            "redis+sentinel" | "rediss+sentinel" => {
                let example = "s1:26379,s2:26379,s3:26379/<master name>";
                let sentinels = listed(DEFAULT_SENTINEL_PORT, "Sentinels", example)?;
                let (master, db) = sentinel_path(scheme, &url.path)?;
                RedisDeployment::Sentinel {
                    sentinels,
                    master,
                    auth: SentinelAuth::default(),
                    db: db_number(&db)?,
                }
            }
            "redis+cluster" | "rediss+cluster" => {
                let seeds = listed(DEFAULT_PORT, "seed nodes", "h1:p1,h2:p2,h3:p3")?;
                if db_number(&url.path)? != 0 {
                    return Err(Error::config(
                        "Redis Cluster has only database 0; drop the database path",
                    ));
                }
                RedisDeployment::Cluster { seeds }
            }
            other => {
                return Err(Error::config(format!(
                    "the Redis backend serves {}, not `{other}`",
                    SCHEMES.join(", ")
                )))
            }
        };
        let mut config = RedisConfig::new(deployment);
        config.tls = scheme.starts_with("rediss");
        config.username = url.username.clone();
        config.password = url.password.clone();
        for (key, value) in url.apply_common_options(&mut config.options)? {
            match (key.as_str(), &mut config.deployment) {
                ("prefix", _) => config.prefix = value,
                ("queue", _) => config.queue = parse_bool("queue", &value)?,
                ("node_timeout", deployment) => {
                    let timeout =
                        lock_core::raw::durations::parse_duration("node_timeout", &value)?;
                    match deployment {
                        RedisDeployment::RedLock { node_timeout, .. } => {
                            *node_timeout = Some(timeout);
                        }
                        RedisDeployment::Cluster { .. } => {
                            return Err(Error::config(
                                "node_timeout is a RedLock option; Redis Cluster calls are \
                                 bounded by request_timeout",
                            ))
                        }
                        // Taken, and unused, where one server decides.
                        _ => check_node_timeout(timeout)?,
                    }
                }
                ("tls", RedisDeployment::RedLock { .. }) => {
                    config.tls = parse_bool("tls", &value)?;
                }
                ("wait_replicas", _) => {
                    config.wait_replicas = Some(value.parse().map_err(|_| {
                        Error::config(format!(
                            "wait_replicas must be a number of replicas, not {value:?}"
                        ))
                    })?)
                }
                ("wait_timeout", _) => {
                    config.wait_timeout = Some(lock_core::raw::durations::parse_duration(
                        "wait_timeout",
                        &value,
                    )?)
                }
                ("sentinel_username", RedisDeployment::Sentinel { auth, .. }) => {
                    auth.username = Some(value);
                }
                ("sentinel_password", RedisDeployment::Sentinel { auth, .. }) => {
                    auth.password = Some(value);
                }
                ("ca_file" | "tls_ca", _) => config.ca_file = Some(PathBuf::from(value)),
                _ => {
                    return Err(Error::config(format!(
                        "unknown {scheme}:// option `{key}` (known: ttl, renewal, max_hold, \
                         request_timeout, recheck, {BACKEND_KEYS})"
                    )))
                }
            }
        }
        Ok(config)
    }
}

/// The database number in a URL's path: `""` or `/` is 0, else `/N`.
fn db_number(path: &str) -> Result<i64> {
    match path {
        "" | "/" => Ok(0),
        path => path
            .strip_prefix('/')
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                Error::config(format!(
                    "the path of a Redis URL is a database number (/0, /1, …), not {path:?}"
                ))
            }),
    }
}

/// The master name and the database path (`""` or `/N`) of a Sentinel URL's path
/// `/<master name>[/N]`.
fn sentinel_path(scheme: &str, path: &str) -> Result<(String, String)> {
    let mut parts = path.strip_prefix('/').unwrap_or(path).splitn(2, '/');
    let master = parts.next().unwrap_or_default();
    if master.is_empty() {
        return Err(Error::config(format!(
            "{scheme}:// needs the master name as its path: {scheme}://s1,s2,s3/<master name>"
        )));
    }
    let db = parts.next().map(|db| format!("/{db}")).unwrap_or_default();
    Ok((master.to_owned(), db))
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::config(format!(
            "{key} must be on or off (true or false), not {value:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::RedisBackend;
    use lock_core::raw::driver::Connect;
    use lock_core::ErrorKind;

    #[test]
    fn urls_parse_into_configs() {
        let c =
            RedisBackend::config_from_str("redis://u:s3cret@10.0.0.1:7000/3?prefix=app:&ttl=5s")
                .unwrap();
        assert_eq!(
            c.deployment,
            RedisDeployment::Single {
                node: RedisNode::new("10.0.0.1", 7000),
                db: 3
            }
        );
        assert_eq!(
            (c.username.as_deref(), c.password.as_deref()),
            (Some("u"), Some("s3cret"))
        );
        assert_eq!(c.prefix.as_str(), "app:");
        assert_eq!(c.options.ttl, Duration::from_secs(5));
        assert!(!c.tls);

        let c = RedisBackend::config_from_str("rediss://h?tls_ca=/etc/ca.pem").unwrap();
        assert!(c.tls);
        assert_eq!(c.deployment.nodes()[0].port, DEFAULT_PORT);
        assert_eq!(c.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        let c = RedisBackend::config_from_str("rediss://h?ca_file=/etc/ca.pem").unwrap();
        assert_eq!(c.ca_file, Some(PathBuf::from("/etc/ca.pem")));

        let c = RedisBackend::config_from_str(
            "redlock://a:1,b:2,c:3,d:4,e:5?node_timeout=20ms&prefix=",
        )
        .unwrap();
        assert!(matches!(
            c.deployment,
            RedisDeployment::RedLock {
                node_timeout: Some(timeout),
                db: 0,
                ..
            } if timeout == Duration::from_millis(20)
        ));
        assert_eq!((c.deployment.nodes().len(), c.quorum()), (5, 3));
        assert_eq!(c.prefix, "");
        assert_eq!(c.endpoint(), "redlock://a:1,b:2,c:3,d:4,e:5");

        assert_eq!(
            RedisBackend::config_from_str("redis://")
                .unwrap()
                .deployment
                .nodes()[0]
                .host,
            "127.0.0.1"
        );
    }

    #[test]
    fn cluster_urls_name_the_seed_nodes() {
        let c = RedisBackend::config_from_str(
            "redis+cluster://u:s3cret@a:7000,b,c:7002?prefix=p:&wait_replicas=1",
        )
        .unwrap();
        assert!(!c.tls);
        assert_eq!(
            c.deployment,
            RedisDeployment::Cluster {
                seeds: vec![
                    RedisNode::new("a", 7000),
                    RedisNode::new("b", DEFAULT_PORT),
                    RedisNode::new("c", 7002)
                ]
            }
        );
        assert_eq!(
            (c.quorum(), c.wait_replicas, c.prefix.as_str()),
            (1, Some(1), "p:")
        );
        assert_eq!(c.endpoint(), "redis+cluster://a:7000,b:6379,c:7002");
        assert!(!format!("{c:?}").contains("s3cret"));
        let c = RedisBackend::config_from_str("rediss+cluster://a?ca_file=/ca.pem").unwrap();
        assert!(matches!(c.deployment, RedisDeployment::Cluster { .. }) && c.tls);
        assert_eq!(c.endpoint(), "rediss+cluster://a:6379");
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let c = RedisBackend::config_from_str(
            "redis+sentinel://u:s3cret@s1,s2:5000,s3/prod/2?sentinel_password=t0p&wait_replicas=1&wait_timeout=50ms",
        )
        .unwrap();
        let RedisDeployment::Sentinel {
            sentinels,
            master,
            auth,
            db,
        } = &c.deployment
        else {
            panic!("a Sentinel deployment: {c:?}");
        };
        assert_eq!(
            sentinels,
            &[
                RedisNode::new("s1", DEFAULT_SENTINEL_PORT),
                RedisNode::new("s2", 5000),
                RedisNode::new("s3", DEFAULT_SENTINEL_PORT)
            ]
        );
        assert_eq!(master, "prod");
        assert_eq!((*db, c.password.as_deref()), (2, Some("s3cret")));
        assert_eq!(auth.password.as_deref(), Some("t0p"));
        assert_eq!(
            (c.wait_replicas, c.wait_timeout),
            (Some(1), Some(Duration::from_millis(50)))
        );
        assert!(!c.tls);
        assert_eq!(
            c.endpoint(),
            "redis+sentinel://s1:26379,s2:5000,s3:26379/prod/2"
        );
        let shown = format!("{c:?} {}", c.endpoint());
        assert!(
            !shown.contains("s3cret") && !shown.contains("t0p"),
            "{shown}"
        );

        let c = RedisBackend::config_from_str("rediss+sentinel://s1/prod?ca_file=/ca.pem").unwrap();
        assert!(c.tls);
        assert_eq!((c.deployment.db(), c.wait_replicas), (0, None));
        let c = RedisBackend::config_from_str("redis://h?wait_replicas=2").unwrap();
        assert_eq!(c.wait_replicas, Some(2));
    }

    /// Sentinel and Redis Cluster are chosen for failover: by default a grant waits for a
    /// replica's acknowledgement there; `wait_replicas=0` opts out, and one server waits
    /// for none.
    #[test]
    fn sentinel_and_cluster_grants_wait_for_a_replica_by_default() {
        let wait = |url: &str| RedisBackend::config_from_str(url).unwrap().replica_wait();
        for url in ["redis+sentinel://s1/prod", "redis+cluster://a:7000"] {
            let default = wait(url).expect("a grant waits for a replica");
            assert_eq!(
                (default.replicas, default.if_replicated),
                (1, true),
                "{url}"
            );
            assert_eq!(
                wait(&format!("{url}?wait_replicas=0")),
                None,
                "{url}: opted out"
            );
            let given = wait(&format!("{url}?wait_replicas=2")).expect("waits");
            assert_eq!((given.replicas, given.if_replicated), (2, false), "{url}");
        }
        assert_eq!(wait("redis://h"), None, "one server");
        assert_eq!(wait("redlock://a:1,b:2,c:3"), None, "RedLock");
    }

    #[test]
    fn bad_urls_are_rejected_without_secrets() {
        for (url, needle) in [
            ("redis://u:s3cret@a:1,b:2", "redlock://"),
            ("redis://u:s3cret@a:1/x", "database number"),
            ("redis://u:s3cret@a:1/-1", "database number"),
            ("redis://u:s3cret@a:1?bogus=1", "bogus"),
            ("redis://u:s3cret@a:1?tls=true", "tls"),
            ("redis://u:s3cret@a:1?tls_ca=/x", "tls_ca needs TLS"),
            ("redis://u:s3cret@a:1?prefix=a{b", "prefix"),
            ("redis://u:s3cret@a:1?node_timeout=0s", "node_timeout"),
            ("redlock://u:s3cret@", "list of servers"),
            ("redlock://u:s3cret@a:1,b:2,A:1", "twice"),
            ("memory://x", "serves"),
            ("redis+sentinel://u:s3cret@", "list of Sentinels"),
            ("redis+sentinel://u:s3cret@a,b", "master name"),
            ("redis+sentinel://u:s3cret@a,b/m/x", "database number"),
            ("redis+sentinel://u:s3cret@a,A/m", "twice"),
            (
                "redis+sentinel://u:s3cret@a/m?wait_timeout=0s",
                "wait_timeout",
            ),
            (
                "redis+sentinel://u:s3cret@a/m?wait_timeout=1h",
                "wait_timeout",
            ),
            (
                "redis+sentinel://u:s3cret@a/m?wait_replicas=-1",
                "wait_replicas",
            ),
            ("redlock://u:s3cret@a,b,c?wait_replicas=1", "wait_replicas"),
            ("redis+cluster://u:s3cret@", "seed nodes"),
            ("redis+cluster://u:s3cret@a,b/1", "database 0"),
            (
                "redis+cluster://u:s3cret@a,b?node_timeout=1s",
                "node_timeout",
            ),
            ("redis+cluster://u:s3cret@a,A", "twice"),
            (
                "redis+cluster://u:s3cret@a?sentinel_password=x",
                "sentinel_password",
            ),
            (
                "redis://u:s3cret@a?sentinel_password=x",
                "sentinel_password",
            ),
        ] {
            let err = RedisBackend::config_from_str(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            let text = format!("{err} {err:?}");
            assert!(text.contains(needle), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
        }
    }
}
