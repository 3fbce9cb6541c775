//! The raw protocol floors: what a lock costs on each server with no library on top, and
//! what a hand-off costs when a raw waiter is woken by the server's own push.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use futures::StreamExt;
use tokio::sync::OnceCell;
use tokio::time::{timeout, Instant};
use zookeeper_client as zk;

use crate::error::BoxError;

/// One raw hold of the floor protocol (key and token, node path, key).
#[derive(Debug)]
pub(crate) struct RawHold {
    pub(crate) name: String,
    pub(crate) token: String,
    /// The holds of each side, for a floor made of two (the dual lock's).
    pub(crate) sides: Vec<RawHold>,
}

impl RawHold {
    fn new(name: String, token: String) -> Self {
        RawHold {
            name,
            token,
            sides: Vec::new(),
        }
    }
}

/// The same operations as a lock, in the backend's raw protocol with no library on top:
/// the floor every ratio is measured against.
#[async_trait]
pub(crate) trait RawFloor: Send + Sync {
    /// Takes `name` (uncontended).
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError>;
    /// Gives it back.
    async fn release(&self, hold: RawHold) -> Result<(), BoxError>;

    /// One raw hand-off on `name`: a raw waiter queues behind a raw hold and waits for the
    /// server's push (a message, a watch); the time from the holder's release sent until
    /// the waiter holds. `None` where the floor has no push of its own to wait on.
    async fn handoff(&self, _name: &str) -> Result<Option<Duration>, BoxError> {
        Ok(None)
    }
}

/// Where a backend's floor connects. Each measurement opens its own floor client on its
/// own runtime, as it does its library client, so both run on the same runtime flavour.
#[derive(Debug, Clone)]
pub(crate) enum FloorSpec {
    /// One Redis server (URL).
    Redis(String),
    /// The primaries of a Redis Cluster (URL) and a hash tag of a slot each serves.
    RedisCluster(Vec<(String, String)>),
    /// One Redis server (URL) whose grants wait for this many replicas (`WAIT`).
    RedisWait(String, u32),
    /// Redis nodes written in parallel, as RedLock does (URLs).
    RedisQuorum(Vec<String>),
    /// A ZooKeeper connect string.
    ZooKeeper(String),
    /// A ZooKeeper connect string of TLS ports, and the CA that signed their certificates.
    ZooKeeperTls(String, PathBuf),
    /// etcd endpoints.
    Etcd(Vec<String>),
    /// A PostgreSQL server (libpq key/value connection string).
    Postgres(String),
    /// The dual lock's floor: the old side's floor, then the new side's; released in
    /// parallel.
    Dual(Box<[FloorSpec; 2]>),
}

impl FloorSpec {
    /// What the floor does, for the report.
    pub(crate) fn describe(&self) -> String {
        match self {
            FloorSpec::Redis(_) => "SET NX PX + EVALSHA compare-and-delete".into(),
            FloorSpec::RedisCluster(shards) => format!(
                "SET NX PX + EVALSHA on the name's primary (of {}), no redirection",
                shards.len()
            ),
            FloorSpec::RedisWait(_, replicas) => {
                format!("SET NX PX + WAIT {replicas} + EVALSHA compare-and-delete")
            }
            FloorSpec::RedisQuorum(urls) => {
                format!("SET NX PX + EVALSHA on {} nodes in parallel", urls.len())
            }
            FloorSpec::ZooKeeper(_) => "create ephemeral sequential + delete".into(),
            FloorSpec::ZooKeeperTls(..) => "create ephemeral sequential + delete, over TLS".into(),
            FloorSpec::Etcd(_) => "txn put-if-absent with lease + delete".into(),
            FloorSpec::Postgres(_) => {
                "prepared INSERT … ON CONFLICT DO UPDATE … RETURNING + compare-and-DELETE".into()
            }
            FloorSpec::Dual(sides) => format!(
                "{}, then {}; released in parallel",
                sides[0].describe(),
                sides[1].describe()
            ),
        }
    }

    /// Opens a floor client on the current runtime, within [`CONNECT_LIMIT`].
    pub(crate) async fn connect(&self) -> Result<Box<dyn RawFloor>, BoxError> {
        tokio::time::timeout(CONNECT_LIMIT, self.open())
            .await
            .map_err(|_| format!("raw floor client did not connect within {CONNECT_LIMIT:?}"))?
    }

    async fn open(&self) -> Result<Box<dyn RawFloor>, BoxError> {
        Ok(match self {
            FloorSpec::Dual(sides) => {
                let [old, new] = &**sides;
                Box::new(DualFloor {
                    old: Box::pin(old.open()).await?,
                    new: Box::pin(new.open()).await?,
                })
            }
            FloorSpec::Redis(url) => Box::new(RedisFloor::connect(url, None).await?),
            FloorSpec::RedisCluster(shards) => {
                let mut nodes = Vec::new();
                for (url, tag) in shards {
                    nodes.push((tag.clone(), RedisFloor::connect(url, None).await?));
                }
                Box::new(ClusterFloor { nodes })
            }
            FloorSpec::RedisWait(url, replicas) => {
                Box::new(RedisFloor::connect(url, Some(*replicas)).await?)
            }
            FloorSpec::RedisQuorum(urls) => {
                let mut nodes = Vec::new();
                for url in urls {
                    nodes.push(RedisFloor::connect(url, None).await?);
                }
                Box::new(QuorumFloor { nodes })
            }
            FloorSpec::ZooKeeper(connect_string) => {
                Box::new(ZkFloor::connect(connect_string, None).await?)
            }
            FloorSpec::ZooKeeperTls(connect_string, ca_file) => {
                Box::new(ZkFloor::connect(connect_string, Some(ca_file.clone())).await?)
            }
            FloorSpec::Etcd(endpoints) => Box::new(EtcdFloor::connect(endpoints).await?),
            FloorSpec::Postgres(conninfo) => Box::new(PgFloor::connect(conninfo).await?),
        })
    }
}

/// Lease of raw holds: long enough never to expire during a measurement.
const RAW_TTL: Duration = Duration::from_secs(30);
/// `WAIT`'s timeout in the replicated Redis floor, in milliseconds (lock-redis's default
/// `wait_timeout`).
const WAIT_LIMIT_MS: u64 = 100;
/// Bound on opening a floor client.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// Bound on a raw waiter's wait for the server's push.
const PUSH_LIMIT: Duration = Duration::from_secs(10);

/// A hand-off floor's "released" wait timed out or the stream ended.
fn no_push(what: &str) -> BoxError {
    format!("raw waiter: no {what} within {PUSH_LIMIT:?}").into()
}

/// Redis: `SET key token NX PX ttl` (then `WAIT replicas`, when set), then a
/// compare-and-delete script by EVALSHA. Its hand-off: the release script also publishes
/// on the key's channel, where the waiter (its own connection) is subscribed.
struct RedisFloor {
    client: redis::Client,
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
    release_and_publish: redis::Script,
    wait: Option<u32>,
}

impl RedisFloor {
    async fn connect(url: &str, wait: Option<u32>) -> Result<Self, BoxError> {
        let client = redis::Client::open(url)?;
        let conn = client.get_multiplexed_async_connection().await?;
        let release = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
        );
        let release_and_publish = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]) \
             redis.call('publish', ARGV[2], 'released') return 1 else return 0 end",
        );
        Ok(RedisFloor {
            client,
            conn,
            release,
            release_and_publish,
            wait,
        })
    }
}

#[async_trait]
impl RawFloor for RedisFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let token = uuid::Uuid::new_v4().to_string();
        let mut conn = self.conn.clone();
        let ttl_ms = u64::try_from(RAW_TTL.as_millis())?;
        let set: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await?;
        set.ok_or("raw SET NX found the key held")?;
        if let Some(replicas) = self.wait {
            let acked: u32 = redis::cmd("WAIT")
                .arg(replicas)
                .arg(WAIT_LIMIT_MS)
                .query_async(&mut conn)
                .await?;
            if acked < replicas {
                return Err(
                    format!("raw WAIT: {acked} of {replicas} replicas acknowledged").into(),
                );
            }
        }
        Ok(RawHold::new(name.to_owned(), token))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let mut conn = self.conn.clone();
        let deleted: i64 = self
            .release
            .key(&hold.name)
            .arg(&hold.token)
            .invoke_async(&mut conn)
            .await?;
        if deleted != 1 {
            return Err("raw release found the key gone".into());
        }
        Ok(())
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let channel = format!("{name}/released");
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        let mut messages = pubsub.into_on_message();
        let mut waiter = self.client.get_multiplexed_async_connection().await?;
        let hold = self.acquire(name).await?;
        let token = uuid::Uuid::new_v4().to_string();
        let set_nx = |conn: &mut redis::aio::MultiplexedConnection| {
            let mut conn = conn.clone();
            let (name, token) = (name.to_owned(), token.clone());
            async move {
                redis::cmd("SET")
                    .arg(name)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(u64::try_from(RAW_TTL.as_millis()).unwrap_or(u64::MAX))
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        };
        if set_nx(&mut waiter).await?.is_some() {
            return Err("raw waiter took a held key".into());
        }
        let started = Instant::now();
        let mut conn = self.conn.clone();
        let _: i64 = self
            .release_and_publish
            .key(name)
            .arg(&hold.token)
            .arg(&channel)
            .invoke_async(&mut conn)
            .await?;
        loop {
            timeout(PUSH_LIMIT, messages.next())
                .await
                .map_err(|_| no_push("release message"))?
                .ok_or_else(|| no_push("release message"))?;
            if set_nx(&mut waiter).await?.is_some() {
                break;
            }
        }
        let took = started.elapsed();
        self.release(RawHold::new(name.to_owned(), token)).await?;
        Ok(Some(took))
    }
}

/// ZooKeeper: create an ephemeral sequential node, then delete it. Its hand-off: a waiter
/// (a session of its own, opened at the first hand-off) queues its node behind the
/// holder's and watches it; once it fires, the waiter's listing shows its node first.
struct ZkFloor {
    client: zk::Client,
    connect_string: String,
    ca_file: Option<PathBuf>,
    waiter: OnceCell<zk::Client>,
}

impl ZkFloor {
    async fn connect(connect_string: &str, ca_file: Option<PathBuf>) -> Result<Self, BoxError> {
        Ok(ZkFloor {
            client: Self::session(connect_string, ca_file.as_deref()).await?,
            connect_string: connect_string.to_owned(),
            ca_file,
            waiter: OnceCell::new(),
        })
    }

    /// Over TLS when `ca_file` is given (the server asks for no client certificate).
    async fn session(connect_string: &str, ca_file: Option<&Path>) -> Result<zk::Client, BoxError> {
        let connector = zk::Client::connector().with_session_timeout(RAW_TTL);
        Ok(match ca_file {
            Some(ca_file) => {
                let ca = tokio::fs::read_to_string(ca_file).await?;
                connector
                    .with_tls(zk::TlsOptions::new().with_pem_ca(&ca)?)
                    .secure_connect(connect_string)
                    .await?
            }
            None => connector.connect(connect_string).await?,
        })
    }
}

#[async_trait]
impl RawFloor for ZkFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let dir = format!("/lockbench-floor/{}", name.replace('/', "_"));
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let prefix = format!("{dir}/lock-");
        let created = match self.client.create(&prefix, &[], &options).await {
            Err(zk::Error::NoNode) => {
                let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                for path in ["/lockbench-floor", dir.as_str()] {
                    match self.client.create(path, &[], &parents).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(err) => return Err(err.into()),
                    }
                }
                self.client.create(&prefix, &[], &options).await?
            }
            other => other?,
        };
        let (_stat, sequence) = created;
        Ok(RawHold::new(format!("{prefix}{sequence}"), String::new()))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        self.client.delete(&hold.name, None).await?;
        Ok(())
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let waiter = self
            .waiter
            .get_or_try_init(|| Self::session(&self.connect_string, self.ca_file.as_deref()))
            .await?;
        let hold = self.acquire(name).await?;
        let (dir, _) = hold
            .name
            .rsplit_once('/')
            .ok_or("a raw node without its dir")?;
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (_, sequence) = waiter
            .create(&format!("{dir}/lock-"), &[], &options)
            .await?;
        let queued = format!("lock-{sequence}");
        let (_, _, watch) = waiter.get_and_watch_data(&hold.name).await?;
        let started = Instant::now();
        self.client.delete(&hold.name, None).await?;
        timeout(PUSH_LIMIT, watch.changed())
            .await
            .map_err(|_| no_push("watch event"))?;
        let children = waiter.list_children(dir).await?;
        let took = started.elapsed();
        if children.iter().min() != Some(&queued) {
            return Err(format!("raw waiter is not first in {dir}: {children:?}").into());
        }
        waiter.delete(&format!("{dir}/{queued}"), None).await?;
        Ok(Some(took))
    }
}

/// etcd: a transaction that puts the key with a lease if absent, then a delete.
struct EtcdFloor {
    client: etcd_client::Client,
    lease: i64,
}

impl EtcdFloor {
    async fn connect(endpoints: &[String]) -> Result<Self, BoxError> {
        let mut client = etcd_client::Client::connect(endpoints, None).await?;
        let ttl = i64::try_from(RAW_TTL.as_secs())?;
        let lease = client.lease_grant(ttl, None).await?.id();
        Ok(EtcdFloor { client, lease })
    }
}

#[async_trait]
impl RawFloor for EtcdFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let key = format!("lockbench-floor/{name}/{:x}", self.lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let response = self.client.kv_client().txn(txn).await?;
        if !response.succeeded() {
            return Err("raw txn found the key present".into());
        }
        Ok(RawHold::new(key, String::new()))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        self.client.kv_client().delete(hold.name, None).await?;
        Ok(())
    }

    /// The waiter watches the holder's key for its delete, then takes the name.
    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let hold = self.acquire(name).await?;
        let deletes = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut watch = self
            .client
            .watch_client()
            .watch(hold.name.as_str(), Some(deletes))
            .await?;
        let started = Instant::now();
        self.client
            .kv_client()
            .delete(hold.name.as_str(), None)
            .await?;
        loop {
            let answer = timeout(PUSH_LIMIT, watch.message())
                .await
                .map_err(|_| no_push("watch event"))??
                .ok_or_else(|| no_push("watch event"))?;
            let events = answer.events();
            if events.iter().any(|e| e.event_type() == EventType::Delete) {
                break;
            }
        }
        let next = self.acquire(name).await?;
        let took = started.elapsed();
        self.release(next).await?;
        Ok(Some(took))
    }
}

/// The scratch table of the PostgreSQL floor (in the server's `public` schema).
const PG_FLOOR_TABLE: &str = "lockbench_floor";
/// The channel the PostgreSQL floor's release notifies and its raw waiter listens on.
const PG_FLOOR_CHANNEL: &str = "lockbench_floor";

/// PostgreSQL: what a lock does on the server, cut down to one row per name with no
/// queue, no fencing counter and no transaction of several statements. The acquire is one
/// round trip of a prepared single-row upsert, `INSERT … ON CONFLICT (name) DO UPDATE …
/// WHERE <the row's lease has passed> RETURNING token` (put-if-absent-or-expired, with a
/// lease on the server's clock: the analogue of Redis's `SET NX PX` and etcd's
/// put-if-absent with a lease), in its own implicit transaction; the release one round
/// trip of a prepared compare-and-`DELETE` (the analogue of the compare-and-delete
/// script). The library's grant is a pipelined transaction that also locks the name's
/// row, clears expired entries, reads the queue and raises the fencing counter (two round
/// trips), so the ratio shows what those cost. Its hand-off: the release also sends a
/// `NOTIFY` (one statement, `pg_notify` on the deleted row), which a raw waiter (a
/// connection of its own, opened at the first hand-off) `LISTEN`s for before it upserts
/// again, as the library's waiters are woken.
struct PgFloor {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    release_and_notify: tokio_postgres::Statement,
    conninfo: String,
    waiter: OnceCell<PgWaiter>,
}

/// The PostgreSQL floor's raw waiter: its connection, `LISTEN`ing, and the notifications'
/// payloads as they arrive.
struct PgWaiter {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    payloads: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

impl PgFloor {
    async fn connect(conninfo: &str) -> Result<Self, BoxError> {
        let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
        // The connection ends with the client (or with the measurement's runtime).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {PG_FLOOR_TABLE} (
                     name text PRIMARY KEY,
                     token text NOT NULL,
                     expires_at timestamptz NOT NULL
                 )"
            ))
            .await?;
        let acquire = Self::prepare_acquire(&client).await?;
        let release = client
            .prepare(&format!(
                "DELETE FROM {PG_FLOOR_TABLE} WHERE name = $1 AND token = $2"
            ))
            .await?;
        let release_and_notify = client
            .prepare(&format!(
                "WITH gone AS (DELETE FROM {PG_FLOOR_TABLE} WHERE name = $1 AND token = $2 \
                 RETURNING name) SELECT pg_notify('{PG_FLOOR_CHANNEL}', name) FROM gone"
            ))
            .await?;
        Ok(PgFloor {
            client,
            acquire,
            release,
            release_and_notify,
            conninfo: conninfo.to_owned(),
            waiter: OnceCell::new(),
        })
    }

    async fn prepare_acquire(
        client: &tokio_postgres::Client,
    ) -> Result<tokio_postgres::Statement, BoxError> {
        let ttl_ms = RAW_TTL.as_millis();
        Ok(client
            .prepare(&format!(
                "INSERT INTO {PG_FLOOR_TABLE} AS f (name, token, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + interval '{ttl_ms} milliseconds') \
                 ON CONFLICT (name) DO UPDATE \
                 SET token = excluded.token, expires_at = excluded.expires_at \
                 WHERE f.expires_at <= clock_timestamp() \
                 RETURNING token"
            ))
            .await?)
    }

    /// The upsert of `name` on `client`: the hold, or `None` when the row is held.
    async fn try_acquire(
        client: &tokio_postgres::Client,
        acquire: &tokio_postgres::Statement,
        name: &str,
    ) -> Result<Option<RawHold>, BoxError> {
        let token = uuid::Uuid::new_v4().to_string();
        let row = client.query_opt(acquire, &[&name, &token]).await?;
        Ok(row.map(|_| RawHold::new(name.to_owned(), token)))
    }

    /// The raw waiter's connection, listening on [`PG_FLOOR_CHANNEL`].
    async fn open_waiter(conninfo: &str) -> Result<PgWaiter, BoxError> {
        use tokio_postgres::AsyncMessage;
        let (client, mut connection) =
            tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
        let (sender, payloads) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if sender.send(n.payload().to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {PG_FLOOR_CHANNEL}"))
            .await?;
        let acquire = Self::prepare_acquire(&client).await?;
        Ok(PgWaiter {
            client,
            acquire,
            payloads: tokio::sync::Mutex::new(payloads),
        })
    }
}

#[async_trait]
impl RawFloor for PgFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        Self::try_acquire(&self.client, &self.acquire, name)
            .await?
            .ok_or_else(|| "raw upsert found the row held".into())
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let deleted = self
            .client
            .execute(&self.release, &[&hold.name, &hold.token])
            .await?;
        if deleted != 1 {
            return Err("raw release found the row gone".into());
        }
        Ok(())
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let waiter = self
            .waiter
            .get_or_try_init(|| Self::open_waiter(&self.conninfo))
            .await?;
        let mut payloads = waiter.payloads.lock().await;
        let hold = self.acquire(name).await?;
        if Self::try_acquire(&waiter.client, &waiter.acquire, name)
            .await?
            .is_some()
        {
            return Err("raw waiter took a held row".into());
        }
        let started = Instant::now();
        let notified = self
            .client
            .query(&self.release_and_notify, &[&hold.name, &hold.token])
            .await?;
        if notified.len() != 1 {
            return Err("raw release found the row gone".into());
        }
        let next = loop {
            let payload = timeout(PUSH_LIMIT, payloads.recv())
                .await
                .map_err(|_| no_push("notification"))?
                .ok_or_else(|| no_push("notification"))?;
            if payload != name {
                continue;
            }
            if let Some(next) = Self::try_acquire(&waiter.client, &waiter.acquire, name).await? {
                break next;
            }
        };
        let took = started.elapsed();
        self.release(next).await?;
        Ok(Some(took))
    }
}

/// Redis Cluster's floor: the raw Redis floor on one primary per name, the name's key
/// carrying a hash tag of that primary's slots (names spread over the primaries as a
/// hash of the name picks).
struct ClusterFloor {
    /// Each primary's hash tag and floor.
    nodes: Vec<(String, RedisFloor)>,
}

impl ClusterFloor {
    /// The hash tag and floor of the primary that serves `name`.
    fn shard(&self, name: &str) -> Result<(&str, &RedisFloor), BoxError> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut hasher);
        let shard = usize::try_from(hasher.finish() % u64::try_from(self.nodes.len())?)?;
        let (tag, node) = &self.nodes[shard];
        Ok((tag, node))
    }
}

#[async_trait]
impl RawFloor for ClusterFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let (tag, node) = self.shard(name)?;
        node.acquire(&format!("{tag}{name}")).await
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let (_, node) = self
            .nodes
            .iter()
            .find(|(tag, _)| hold.name.starts_with(tag.as_str()))
            .ok_or("a cluster raw hold without its shard's tag")?;
        node.release(hold).await
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let (tag, node) = self.shard(name)?;
        node.handoff(&format!("{tag}{name}")).await
    }
}

/// RedLock's floor: the raw Redis floor on every node in parallel.
struct QuorumFloor {
    nodes: Vec<RedisFloor>,
}

#[async_trait]
impl RawFloor for QuorumFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let holds = futures::future::join_all(self.nodes.iter().map(|n| n.acquire(name))).await;
        let mut token = String::new();
        for hold in holds {
            token.push_str(&hold?.token);
            token.push(' ');
        }
        Ok(RawHold::new(name.to_owned(), token))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let releases = self
            .nodes
            .iter()
            .zip(hold.token.split(' '))
            .map(|(node, token)| node.release(RawHold::new(hold.name.clone(), token.to_owned())));
        for released in futures::future::join_all(releases).await {
            released?;
        }
        Ok(())
    }
}

/// The dual lock's floor: the old side's raw acquire, then the new side's (the order a
/// dual acquire must keep); both released in parallel.
struct DualFloor {
    old: Box<dyn RawFloor>,
    new: Box<dyn RawFloor>,
}

#[async_trait]
impl RawFloor for DualFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let old = self.old.acquire(name).await?;
        let new = match self.new.acquire(name).await {
            Ok(new) => new,
            Err(err) => {
                // Best effort: the run fails anyway; the raw hold expires with its TTL.
                let _ = self.old.release(old).await;
                return Err(err);
            }
        };
        let mut hold = RawHold::new(name.to_owned(), String::new());
        hold.sides = vec![old, new];
        Ok(hold)
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let mut sides = hold.sides.into_iter();
        let (Some(old), Some(new)) = (sides.next(), sides.next()) else {
            return Err("a dual raw hold without its two sides".into());
        };
        let (old, new) = futures::future::join(self.old.release(old), self.new.release(new)).await;
        old.and(new)
    }
}
