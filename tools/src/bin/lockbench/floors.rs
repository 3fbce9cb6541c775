//! The raw protocol floors: what a lock costs on each server with no library on top, and
//! what a hand-off costs when a raw waiter is woken by the server's own push.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::BoxError;

mod etcd;
mod file;
mod postgres;
mod redis;
mod zookeeper;

use etcd::EtcdFloor;
use file::FileFloor;
use postgres::PgFloor;
use redis::RedisFloor;
use zookeeper::ZkFloor;

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
    /// A local directory of lock files (`file://`).
    File(PathBuf),
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
            FloorSpec::File(_) => "open + flock(LOCK_EX | LOCK_NB) + close".into(),
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
            FloorSpec::File(dir) => Box::new(FileFloor::new(dir.clone())),
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
