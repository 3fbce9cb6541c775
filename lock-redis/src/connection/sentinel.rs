//! Finding the primary through Sentinels (`redis+sentinel://`): every Sentinel is asked
//! `SENTINEL get-master-addr-by-name <master>` at once, each within the caller's deadline,
//! and the first answer names the primary; the connection made to it is used only once
//! the server itself says `ROLE` `master` (a Sentinel that has not yet heard of a failover
//! names the old primary, which is then a replica or gone).
//!
//! Discovery runs on every (re)connection: after a connection loss, a `READONLY` reply or
//! a role check that failed, the next call asks the Sentinels again, so the client
//! follows a failover at its next connection attempt.
//!
//! The `redis` crate's `sentinel` module is not used: it asks the Sentinels in their
//! configured order and takes their answers in that order (one silent Sentinel holds up
//! discovery with no bound of ours), and it checks the primary's role on a connection of
//! its own rather than on the one the client then uses.

use std::sync::Mutex;

use futures::stream::{FuturesUnordered, StreamExt};
use lock_core::raw::plumbing::lock_unpoisoned;
use lock_core::{Error, Result};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ProtocolVersion, Value};
use tokio::time::{timeout_at, Instant};

use super::client_for;
use crate::config::{RedisConfig, RedisNode, SentinelAuth};
use crate::error;

/// The Sentinels of one primary and how to reach the servers they name.
pub(crate) struct Sentinels {
    backend: &'static str,
    master: String,
    /// Each Sentinel (`host:port`) and a client of it (the Sentinels' credentials).
    sentinels: Vec<(String, redis::Client)>,
    /// The configuration the data servers are reached with (TLS, credentials, database).
    config: RedisConfig,
    ca: Option<Vec<u8>>,
    /// The primary named last, to tell a failover in the log.
    last: Mutex<Option<RedisNode>>,
}

impl Sentinels {
    /// The `sentinels` of the primary they name for `master`, reached with `auth`; the
    /// data servers as `config` says; trusting `ca` for TLS.
    pub(crate) fn new(
        backend: &'static str,
        config: &RedisConfig,
        sentinels: &[RedisNode],
        master: &str,
        auth: &SentinelAuth,
        ca: Option<&[u8]>,
    ) -> redis::RedisResult<Self> {
        let sentinels = sentinels
            .iter()
            .map(|node| {
                let client = client_for(
                    node,
                    config.tls,
                    ca,
                    auth.username.as_deref(),
                    auth.password.as_deref(),
                    0,
                    ProtocolVersion::RESP2,
                )?;
                Ok((node.to_string(), client))
            })
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Sentinels {
            backend,
            master: master.to_owned(),
            sentinels,
            config: config.clone(),
            ca: ca.map(<[u8]>::to_vec),
            last: Mutex::new(None),
        })
    }

    /// For messages: `the primary of <master> (via s1,s2,…)`.
    pub(crate) fn label(&self) -> String {
        let hosts: Vec<&str> = self.sentinels.iter().map(|(h, _)| h.as_str()).collect();
        format!("the primary of `{}` (via {})", self.master, hosts.join(","))
    }

    /// A client of the primary the Sentinels name now.
    ///
    /// # Errors
    /// `Unavailable` when every Sentinel that answered knows no primary by this name (or
    /// none answered in time: then the first Sentinel's error); `InvalidConfig` for
    /// rejected Sentinel credentials.
    pub(crate) async fn primary(&self, deadline: Instant) -> Result<redis::Client> {
        let node = self.ask(deadline).await?;
        {
            let mut last = lock_unpoisoned(&self.last);
            if last.as_ref() != Some(&node) {
                if let Some(old) = last.as_ref() {
                    tracing::info!(backend = self.backend, master = %self.master, from = %old,
                        to = %node, "the Sentinels name a new primary");
                }
                *last = Some(node.clone());
            }
        }
        client_for(
            &node,
            self.config.tls,
            self.ca.as_deref(),
            self.config.username.as_deref(),
            self.config.password.as_deref(),
            self.config.deployment.db(),
            ProtocolVersion::RESP2,
        )
        .map_err(|err| error::from_client(self.backend, format_args!("configure {node}"), err))
    }

    /// The first answer of any Sentinel.
    async fn ask(&self, deadline: Instant) -> Result<RedisNode> {
        let limit = deadline.saturating_duration_since(Instant::now());
        let mut asks: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|(label, client)| async move {
                let answer = timeout_at(deadline, self.ask_one(client)).await;
                (label, answer)
            })
            .collect();
        let mut first_error = None;
        let mut unknown = Vec::new();
        while let Some((label, answer)) = asks.next().await {
            let err = match answer {
                Ok(Ok(Some(node))) => return Ok(node),
                Ok(Ok(None)) => {
                    unknown.push(label.as_str());
                    continue;
                }
                Ok(Err(err)) => {
                    error::from_client(self.backend, format_args!("ask Sentinel {label}"), err)
                }
                Err(_) => {
                    Error::no_answer(self.backend, format_args!("ask Sentinel {label}"), limit)
                }
            };
            if err.kind() == lock_core::ErrorKind::InvalidConfig {
                return Err(err);
            }
            first_error.get_or_insert(err);
        }
        match first_error {
            Some(err) if unknown.is_empty() => Err(err),
            first_error => Err(error::no_majority(
                self.backend,
                format!(
                    "no Sentinel names a primary for `{}` (unknown to {})",
                    self.master,
                    unknown.join(",")
                ),
                first_error,
            )),
        }
    }

    /// One Sentinel's answer: the primary's address, `None` when it knows no such master.
    async fn ask_one(&self, client: &redis::Client) -> redis::RedisResult<Option<RedisNode>> {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&AsyncConnectionConfig::new())
            .await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(&mut conn)
            .await?;
        Ok(addr.map(|(host, port)| RedisNode::new(host, port)))
    }

    /// Checks on `conn`, a new connection to the server the Sentinels named, that it is a
    /// primary.
    ///
    /// # Errors
    /// `Unavailable` when it is not (yet, or no longer).
    pub(crate) async fn check_role(&self, conn: &mut MultiplexedConnection) -> Result<()> {
        let role: Vec<Value> = redis::cmd("ROLE").query_async(conn).await.map_err(|err| {
            error::from_client(self.backend, format_args!("ROLE on {}", self.label()), err)
        })?;
        match role.first() {
            Some(Value::BulkString(role)) if role.as_slice() == b"master" => Ok(()),
            Some(Value::SimpleString(role)) if role == "master" => Ok(()),
            other => Err(Error::Unavailable {
                backend: self.backend,
                message: format!(
                    "the server the Sentinels name for `{}` is not a primary (ROLE {other:?})",
                    self.master
                ),
                source: None,
            }),
        }
    }
}
