//! Connections to the servers: one multiplexed connection per server, with a deadline on
//! every call and reconnection with backoff, and the routes requests take ([`Route`]).
//! TLS lives here too (the CA file, the client library's TLS client). The client's
//! wake-up subscriptions are in [`wakeups`], finding the primary through Sentinels in
//! [`sentinel`], routing by hash slot on Redis Cluster in [`cluster`].

mod cluster;
mod sentinel;
mod wakeups;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::raw::plumbing::{lock_unpoisoned, Backoff};
use lock_core::{Error, Result};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, FromRedisValue, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, RedisFuture, ScriptInvocation, TlsCertificates, Value,
};
use tokio::time::{timeout_at, Instant};

use crate::config::{RedisConfig, RedisNode, ReplicaWait};
use crate::error;

pub(crate) use cluster::{group_by_shard, slot_of, Shards};
pub(crate) use sentinel::Sentinels;
pub(crate) use wakeups::{Grant, Subscription, Wakeups};

/// Ceiling of the first (jittered) pause before reconnecting after a failure; doubles up
/// to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Longest ceiling of the pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The pauses between reconnection attempts (to a server, or of a subscription), and
/// between the tries of an abandoned acquire's cleanup.
pub(crate) fn reconnect_backoff() -> Backoff {
    Backoff::new(MIN_BACKOFF, MAX_BACKOFF)
}

/// How many replicas the server at the other end of `conn` lists (`ROLE`: a primary's
/// third element is its replicas; anything else counts none).
async fn replicas_of(conn: &mut Conn) -> redis::RedisResult<usize> {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(conn).await?;
    Ok(match role.get(2) {
        Some(redis::Value::Array(replicas)) => replicas.len(),
        _ => 0,
    })
}

/// The CA certificates (PEM) of `config`'s `ca_file`, if it names one.
pub(crate) async fn read_ca(config: &RedisConfig) -> lock_core::Result<Option<Vec<u8>>> {
    let Some(path) = &config.ca_file else {
        return Ok(None);
    };
    let pem = tokio::fs::read(path)
        .await
        .map_err(|err| lock_core::Error::InvalidConfig {
            message: format!("cannot read the TLS CA file {}", path.display()),
            source: Some(Box::new(err)),
        })?;
    Ok(Some(pem))
}

/// The client library's client for `node` as `config` says (TLS, credentials, database),
/// trusting the CA certificates in `ca` (PEM) when given. Opens no connection.
pub(crate) fn redis_client(
    config: &RedisConfig,
    node: &RedisNode,
    ca: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    client_for(
        node,
        config.tls,
        ca,
        config.username.as_deref(),
        config.password.as_deref(),
        config.deployment.db(),
        ProtocolVersion::RESP2,
    )
}

/// The client library's client for `node` with these TLS, credentials, database and
/// protocol.
fn client_for(
    node: &RedisNode,
    tls: bool,
    ca: Option<&[u8]>,
    username: Option<&str>,
    password: Option<&str>,
    db: i64,
    protocol: ProtocolVersion,
) -> redis::RedisResult<redis::Client> {
    let addr = if tls {
        ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(node.host.clone(), node.port)
    };
    let mut settings = RedisConnectionInfo::default()
        .set_db(db)
        .set_protocol(protocol);
    if let Some(user) = username {
        settings = settings.set_username(user);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    let info = addr.into_connection_info()?.set_redis_settings(settings);
    match ca {
        Some(pem) => redis::Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        None => redis::Client::open(info),
    }
}

/// Where a node's connections go.
#[derive(Clone)]
pub(crate) enum Target {
    /// One server.
    Server(Box<redis::Client>),
    /// The primary that these Sentinels name at each (re)connection.
    Primary(Arc<Sentinels>),
}

impl Target {
    /// A client of the server to connect to now.
    pub(crate) async fn client(&self, deadline: Instant) -> Result<redis::Client> {
        match self {
            Target::Server(client) => Ok((**client).clone()),
            Target::Primary(sentinels) => sentinels.primary(deadline).await,
        }
    }
}

/// A node's connection as a request sees it: its commands go as they are or, after a
/// cluster's `ASK` redirection, each behind an `ASKING` in one pipeline, written as one
/// block on the node's shared multiplexed connection so that nothing comes between them
/// (a script reloaded on `NOSCRIPT` goes the same way: `SCRIPT LOAD`, then the script
/// again after `ASKING`).
#[derive(Clone)]
pub(crate) struct Conn {
    inner: MultiplexedConnection,
    asking: bool,
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        if !self.asking {
            return self.inner.req_packed_command(cmd);
        }
        Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(cmd.clone());
            let mut replies = self.inner.req_packed_commands(&pipe, 1, 1).await?;
            match replies.pop() {
                Some(reply) => reply.extract_error(),
                None => Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "no reply after ASKING",
                ))),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if !self.asking {
            return self.inner.req_packed_commands(pipeline, offset, count);
        }
        Box::pin(async {
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a pipeline is not sent after ASK",
            )))
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// Why a request to a node did not succeed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No usable answer (connection, deadline, configuration): the error to report.
    Failed(Error),
    /// The server refused the request with this error reply on a connection that stays
    /// usable.
    Refused(redis::RedisError),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure::Failed(err)
    }
}

/// The `run_id` field of an `INFO server` reply.
fn run_id(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
}

/// The current connection of a node and its reconnection state.
#[derive(Default)]
struct Slot {
    conn: Option<(u64, MultiplexedConnection)>,
    generation: u64,
    failures: u32,
    retry_at: Option<Instant>,
}

/// One Redis server (or the primary Sentinels name): a lazily (re)connected multiplexed
/// connection.
pub(crate) struct Node {
    backend: &'static str,
    /// `host:port` (behind Sentinels: the master name and the Sentinels), for messages
    /// (never credentials).
    pub(crate) label: String,
    target: Target,
    connect_timeout: Duration,
    backoff: Backoff,
    slot: Mutex<Slot>,
    /// Serializes connection attempts.
    connecting: tokio::sync::Mutex<()>,
    /// Whether each new connection reads the server's `run_id` (see [`Node::identity`]).
    identify: bool,
    /// The `run_id` the server reported on the latest connection that read it.
    identity: Mutex<Option<Arc<str>>>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node").field("label", &self.label).finish()
    }
}

impl Node {
    pub(crate) fn new(
        backend: &'static str,
        label: String,
        target: Target,
        connect_timeout: Duration,
    ) -> Self {
        Node {
            backend,
            label,
            target,
            connect_timeout,
            backoff: reconnect_backoff(),
            slot: Mutex::new(Slot::default()),
            connecting: tokio::sync::Mutex::new(()),
            identify: false,
            identity: Mutex::new(None),
        }
    }

    /// This node, reading the server's `run_id` on each new connection.
    pub(crate) fn identified(mut self) -> Self {
        self.identify = true;
        self
    }

    /// The `run_id` of the server (`INFO server`), as the latest connection read it:
    /// the same for every client however it addresses the server (a proxy, another host
    /// name), new after a restart. `None` before the first connection, for a node not
    /// [`identified`](Node::identified), or where the server refuses `INFO`.
    pub(crate) fn identity(&self) -> Option<Arc<str>> {
        lock_unpoisoned(&self.identity).clone()
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// The current connection, connecting first if there is none (unless a recent failure
    /// asks to wait: then the call fails at once rather than hammering a dead server).
    async fn connection(&self, deadline: Instant) -> Result<(u64, MultiplexedConnection)> {
        if let Some(conn) = lock_unpoisoned(&self.slot).conn.clone() {
            return Ok(conn);
        }
        let _serial = timeout_at(deadline, self.connecting.lock())
            .await
            .map_err(|_| self.deadline_error("connect", deadline))?;
        {
            let slot = lock_unpoisoned(&self.slot);
            if let Some(conn) = slot.conn.clone() {
                return Ok(conn);
            }
            if let Some(at) = slot.retry_at.filter(|at| *at > Instant::now()) {
                return Err(Error::Connection {
                    backend: self.backend,
                    message: format!(
                        "{} is unreachable ({} failed connection attempts); next attempt in {:?}",
                        self.label,
                        slot.failures,
                        at - Instant::now()
                    ),
                    source: None,
                });
            }
        }
        let outcome = timeout_at(deadline, self.open(deadline)).await;
        let mut slot = lock_unpoisoned(&self.slot);
        match outcome {
            Ok(Ok(conn)) => {
                slot.generation += 1;
                slot.failures = 0;
                slot.retry_at = None;
                let entry = (slot.generation, conn);
                slot.conn = Some(entry.clone());
                Ok(entry)
            }
            Ok(Err(err)) => {
                slot.failures += 1;
                slot.retry_at = Some(Instant::now() + self.backoff.after(slot.failures));
                Err(err)
            }
            Err(_) => {
                slot.failures += 1;
                slot.retry_at = Some(Instant::now() + self.backoff.after(slot.failures));
                Err(self.deadline_error("connect", deadline))
            }
        }
    }

    /// A new connection (behind Sentinels: to the primary they name, checked with `ROLE`).
    async fn open(&self, deadline: Instant) -> Result<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        let client = self.target.client(deadline).await?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|err| self.failed("connect", err))?;
        if let Target::Primary(sentinels) = &self.target {
            sentinels.check_role(&mut conn).await?;
        }
        if self.identify {
            // A server that refuses INFO (an ACL) keeps the identity unknown.
            let info = redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut conn)
                .await;
            if let Ok(info) = info {
                *lock_unpoisoned(&self.identity) = run_id(&info).map(Arc::from);
            }
        }
        Ok(conn)
    }

    /// Forgets connection `generation` so that the next call reconnects.
    fn invalidate(&self, generation: u64) {
        let mut slot = lock_unpoisoned(&self.slot);
        if slot.conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            slot.conn = None;
        }
    }

    /// `what` on this server failed with `err`.
    pub(crate) fn failed(&self, what: &str, err: redis::RedisError) -> Error {
        error::from_client(self.backend, format_args!("{what} on {}", self.label), err)
    }

    /// `what` on this server got no answer within `limit`.
    fn no_answer(&self, what: &str, limit: Duration) -> Error {
        Error::no_answer(
            self.backend,
            format_args!("{what} on {}", self.label),
            limit,
        )
    }

    fn deadline_error(&self, what: &str, deadline: Instant) -> Error {
        let limit = deadline.saturating_duration_since(Instant::now());
        self.no_answer(what, limit.max(Duration::from_millis(1)))
    }

    /// Sends a request (`send` on a connection) with a deadline.
    ///
    /// A connection that turns out broken (the server restarted, the network reset it) or
    /// reaches a replica (`READONLY`: a failover demoted the server) is replaced and the
    /// request is sent once more on the new one, within the same deadline; behind
    /// Sentinels the new one goes to the primary they name then.
    async fn call<T, F, Fut>(&self, what: &str, deadline: Instant, send: F) -> Result<T>
    where
        T: Send,
        F: Fn(Conn) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        match self.call_raw(what, deadline, &send, false).await {
            Ok(value) => Ok(value),
            Err(Failure::Failed(err)) => Err(err),
            Err(Failure::Refused(err)) => Err(self.failed(what, err)),
        }
    }

    /// As [`Node::call`], but a reply that refuses the request (an error reply that leaves
    /// the connection usable: a cluster redirection, `TRYAGAIN`, a script error) comes
    /// back as it is, for the caller to act on. With `asking`, each command goes behind
    /// an `ASKING` (see [`Conn`]): a cluster redirection to a node importing the slot.
    pub(crate) async fn call_raw<T, F, Fut>(
        &self,
        what: &str,
        deadline: Instant,
        send: &F,
        asking: bool,
    ) -> std::result::Result<T, Failure>
    where
        T: Send,
        F: Fn(Conn) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        let started = Instant::now();
        let mut retried = false;
        loop {
            let (generation, conn) = self.connection(deadline).await?;
            match timeout_at(
                deadline,
                send(Conn {
                    inner: conn,
                    asking,
                }),
            )
            .await
            {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) => {
                    if error::breaks_connection(&err) {
                        self.invalidate(generation);
                        if !retried && (err.is_connection_dropped() || error::is_read_only(&err)) {
                            retried = true;
                            continue;
                        }
                        return Err(Failure::Failed(self.failed(what, err)));
                    }
                    return Err(Failure::Refused(err));
                }
                Err(_) => {
                    // A reply may still arrive, or be lost for good: a fresh connection
                    // keeps later replies from being paired with the wrong request.
                    self.invalidate(generation);
                    return Err(Failure::Failed(
                        self.no_answer(what, deadline.saturating_duration_since(started)),
                    ));
                }
            }
        }
    }

    /// Connects now (if not connected) to check that the server answers.
    pub(crate) async fn ping(&self, deadline: Instant) -> Result<()> {
        let (generation, mut conn) = self.connection(deadline).await?;
        let reply = timeout_at(
            deadline,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => {
                self.invalidate(generation);
                Err(self.failed("PING", err))
            }
            Err(_) => {
                self.invalidate(generation);
                Err(self.deadline_error("PING", deadline))
            }
        }
    }
}

/// Where the requests for one lock go: a server (behind Sentinels: the primary), or on
/// Redis Cluster the primary that serves the lock key's hash slot.
#[derive(Clone, Copy)]
pub(crate) enum Route<'a> {
    Node(&'a Node),
    Slot(&'a Shards, u16),
}

impl Route<'_> {
    /// Sends a request with a deadline: [`Node::call`], or [`Shards::call`] for the slot.
    async fn call<T, F, Fut>(&self, what: &str, deadline: Instant, send: F) -> Result<T>
    where
        T: Send,
        F: Fn(Conn) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        match self {
            Route::Node(node) => node.call(what, deadline, send).await,
            Route::Slot(shards, slot) => shards.call(*slot, what, deadline, send).await,
        }
    }

    /// Runs a script (EVALSHA, loading it on `NOSCRIPT`) with a deadline, as
    /// [`Route::call`] does. Every script of this crate may safely run twice: acquire
    /// recognizes its own token, renew and release compare it, a second force release
    /// finds the key free or its new holder's (an operator who breaks a name accepts
    /// that).
    pub(crate) async fn script<T: FromRedisValue + Send>(
        &self,
        what: &str,
        deadline: Instant,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T> {
        self.call(what, deadline, |mut conn| async move {
            invocation.invoke_async::<T>(&mut conn).await
        })
        .await
    }

    /// Runs an acquire script as [`Route::script`] does and, when there is a `wait` and the
    /// reply is a grant (its first element is 1), `WAIT replicas time` on the same
    /// connection, so that it covers the grant's writes (unless the wait is only for a
    /// replicated primary and `ROLE` lists no replica): the reply, and how many replicas
    /// acknowledged them (`None` without `WAIT`).
    pub(crate) async fn acquire_script(
        &self,
        deadline: Instant,
        invocation: &ScriptInvocation<'_>,
        wait: Option<ReplicaWait>,
    ) -> Result<(Vec<i64>, Option<i64>)> {
        self.call("acquire", deadline, |mut conn| async move {
            let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
            let Some(wait) = wait.filter(|_| reply.first() == Some(&1)) else {
                return Ok((reply, None));
            };
            if wait.if_replicated && replicas_of(&mut conn).await? == 0 {
                return Ok((reply, None));
            }
            let acked = redis::cmd("WAIT")
                .arg(wait.replicas)
                // WAIT takes whole milliseconds, and 0 would wait forever.
                .arg(
                    u64::try_from(wait.timeout.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1),
                )
                .query_async::<i64>(&mut conn)
                .await?;
            Ok((reply, Some(acked)))
        })
        .await
    }

    /// Runs a command that may safely run twice (a read) with a deadline, as
    /// [`Route::call`] does.
    pub(crate) async fn command<T: FromRedisValue + Send>(
        &self,
        what: &str,
        deadline: Instant,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        self.call(what, deadline, |mut conn| async move {
            cmd.query_async::<T>(&mut conn).await
        })
        .await
    }
}
