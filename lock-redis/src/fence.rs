//! A fenced resource on Redis ([`RedisFence`]): one hash per resource, its newest token
//! and value changed together by a Lua compare-and-set.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::fence::{FenceOutcome, Fenced, FencedStore};
use lock_core::raw::url::LockUrl;
use lock_core::{Error, FencingToken, Result};
use tokio::time::Instant;

use crate::config::{RedisConfig, RedisDeployment};
use crate::connection::read_ca;
use crate::error;
use crate::scripts::{token_of, Scripts};
use crate::topology::Topology;

/// The hash fields of a fenced resource.
const TOKEN: &str = "token";
const VALUE: &str = "value";

/// A fenced resource on Redis: the hash at `key`, with fields `token` (the newest accepted
/// fencing token, in decimal) and `value`.
///
/// A write runs one Lua script (`scripts/fenced_store.lua`, called from `scripts/fence.rs`) that compares the stored token
/// and sets both fields, so the check and the write are one atomic step of the server.
/// One key per resource: on Redis Cluster it lives on the primary of its hash slot (name
/// it with a hash tag, `{profile/42}`, to keep it beside related keys). The token is kept
/// as durably as the server keeps the value: with `appendonly`/`fsync` as the deployment
/// has them, and across a failover only what the replica had received.
///
/// Built from the same configuration or URL as a lock client (`redis://`, `rediss://`,
/// `redis+sentinel://`, `redis+cluster://`, …; not `redlock://`: a resource lives on one
/// store). Every call is bounded by the configuration's request timeout; a call whose
/// connection broke is sent once more on a new one, so a write that landed before the
/// break may then report [`FenceOutcome::Stale`] if a newer token came in between.
#[derive(Clone)]
pub struct RedisFence {
    shared: Arc<Shared>,
    key: Arc<str>,
}

/// The connection a client's resources share.
struct Shared {
    topology: Topology,
    config: RedisConfig,
    scripts: Scripts,
}

impl fmt::Debug for RedisFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFence")
            .field("endpoint", &self.shared.config.endpoint())
            .field("key", &self.key)
            .finish()
    }
}

impl RedisFence {
    /// The fenced resource at `key` on the servers `url` names (a lock URL; its query may
    /// set `request_timeout`), once a server answers.
    ///
    /// # Errors
    /// As [`RedisFence::open`], and [`Error::InvalidConfig`] for a malformed URL.
    pub async fn connect(url: &str, key: &str) -> Result<Self> {
        let config = RedisConfig::from_url(&LockUrl::parse(url)?)?;
        Self::open(config, key).await
    }

    /// The fenced resource at `key` on the servers of `config` (a lock client's own:
    /// `RedisBackend::config`), once a server answers.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid configuration or an empty key;
    /// [`Error::Unsupported`] for RedLock; the server's error when it does not answer
    /// within the request timeout.
    pub async fn open(config: RedisConfig, key: &str) -> Result<Self> {
        config.validate()?;
        if let RedisDeployment::RedLock { .. } = config.deployment {
            return Err(Error::unsupported(
                "redlock",
                "a fenced resource: it lives on one store, not a quorum of independent servers",
            ));
        }
        let key = checked_key(key)?;
        let backend = config.backend();
        let ca = read_ca(&config).await?;
        let topology = Topology::new(backend, &config, ca.as_deref())?;
        let deadline = Instant::now() + config.options.request_timeout;
        topology.check(backend, deadline).await?;
        let shared = Arc::new(Shared {
            scripts: Scripts::new(backend, topology.shards().is_some()),
            topology,
            config,
        });
        Ok(RedisFence { shared, key })
    }

    /// Another resource, `key`, on the same connection.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty key.
    pub fn resource(&self, key: &str) -> Result<Self> {
        Ok(RedisFence {
            shared: self.shared.clone(),
            key: checked_key(key)?,
        })
    }

    /// The resource's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.shared.config.options.request_timeout
    }

    fn route(&self) -> Result<crate::connection::Route<'_>> {
        self.shared
            .topology
            .routes(&self.key)
            .into_iter()
            .next()
            .ok_or_else(|| error::protocol("redis", "no server for a fenced resource".into()))
    }
}

/// `key` if Redis can name a resource with it.
fn checked_key(key: &str) -> Result<Arc<str>> {
    if key.is_empty() {
        return Err(Error::config(
            "a fenced resource needs a non-empty Redis key",
        ));
    }
    Ok(key.into())
}

#[async_trait]
impl FencedStore for RedisFence {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        let call = self.shared.scripts.fenced_store(&self.key, token, value);
        call.on(self.route()?, self.deadline()).await
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&*self.key).arg(TOKEN).arg(VALUE);
        let (token, value): (Option<String>, Option<Vec<u8>>) = self
            .route()?
            .command("fenced read", self.deadline(), &cmd)
            .await?;
        match token {
            None => Ok(None),
            Some(token) => Ok(Some(Fenced {
                token: token_of("redis", &token)?,
                value: value.unwrap_or_default(),
            })),
        }
    }
}
