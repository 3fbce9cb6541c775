//! Redis Cluster (`redis+cluster://`): the slot map, learnt with `CLUSTER SLOTS` from the
//! seed nodes or any primary known, one [`Node`] per primary, and requests routed by the
//! hash slot of their lock key. A `MOVED` reply updates the map and the request goes to
//! the new owner; `ASK` sends `ASKING` and the request to the importing node in one
//! pipeline on its shared connection; `TRYAGAIN` and `CLUSTERDOWN` (a slot being
//! resharded, a failover under way) are retried after a jittered pause growing from 25 to 250 ms,
//! at the node that answered it. While a slot migrates, a script whose declared keys are
//! not all on the node asked is refused with `TRYAGAIN` until the move ends (the acquire
//! of a free name: granting it on the importing node while the key may still be on the
//! other would make two holders);
//! a connection failure reloads the map (a failover promotes a replica) and the request
//! goes to the new owner if there is one. Every retry stays within the caller's deadline.
//!
//! The `redis` crate's cluster client is not used: renewal sends one script per primary
//! covering the holds of many slots (their keys passed as arguments to a script flagged
//! `allow-cross-slot-keys`), which that client routes by the first key or refuses as
//! cross-slot; and the per-call deadline, reconnection backoff, error mapping and script
//! handling are those of [`Node`], shared with the single-server and Sentinel paths.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use lock_core::raw::plumbing::{lock_unpoisoned, Backoff};
use lock_core::{Error, Result};
use redis::{ErrorKind, ProtocolVersion, ServerErrorKind, Value};
use tokio::time::{sleep, Instant};

use super::{client_for, Conn, Failure, Node, Route, Target};
use crate::config::{RedisConfig, RedisNode};
use crate::error;

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// Redirections and failovers one request follows at most (within its deadline).
const MAX_HOPS: u32 = 16;

/// Pause before retrying after a failed primary, and first pause after `TRYAGAIN` or
/// `CLUSTERDOWN`; it doubles at each such answer up to [`MAX_BUSY_PAUSE`].
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// Longest pause between retries after `TRYAGAIN` or `CLUSTERDOWN`.
const MAX_BUSY_PAUSE: Duration = Duration::from_millis(250);

/// What a request does when a node answers `TRYAGAIN` (its slot migrating, the
/// request's keys not all on that node).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Busy {
    /// Retry until the deadline.
    Wait,
    /// Give up at once (the caller has another way).
    GiveUp,
}

/// The hash slot of `key` (CRC16 of the key, or of its hash tag, modulo 16384).
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS
}

/// CRC16-CCITT (XModem), as Redis Cluster hashes keys.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Which primary serves each slot.
struct SlotMap {
    /// Per slot, the index of its primary in `nodes`.
    owner: Vec<Option<usize>>,
    /// Every node seen (seeds and primaries), by address; never shrinks.
    nodes: Vec<(RedisNode, Arc<Node>)>,
    /// Bumped at every reload.
    version: u64,
}

/// The primaries of a Redis Cluster and which slots each serves.
pub(crate) struct Shards {
    backend: &'static str,
    config: RedisConfig,
    ca: Option<Vec<u8>>,
    connect_timeout: Duration,
    map: Mutex<SlotMap>,
    /// Serializes reloads of the map.
    reloading: tokio::sync::Mutex<()>,
}

impl Shards {
    /// The cluster that the `seeds` belong to, reached as `config` says, trusting `ca` for
    /// TLS. Opens no connection.
    pub(crate) fn new(
        backend: &'static str,
        config: &RedisConfig,
        seeds: &[RedisNode],
        ca: Option<&[u8]>,
    ) -> Result<Self> {
        let shards = Shards {
            backend,
            config: config.clone(),
            ca: ca.map(<[u8]>::to_vec),
            connect_timeout: config.options.request_timeout,
            map: Mutex::new(SlotMap {
                owner: vec![None; usize::from(SLOTS)],
                nodes: Vec::new(),
                version: 0,
            }),
            reloading: tokio::sync::Mutex::new(()),
        };
        for seed in seeds {
            shards.node_at(seed)?;
        }
        Ok(shards)
    }

    /// For messages: `cluster (seeds h1:p1,…)`.
    pub(crate) fn label(&self) -> String {
        let seeds: Vec<String> = self
            .config
            .deployment
            .nodes()
            .iter()
            .map(|n| n.to_string())
            .collect();
        format!("the cluster (seeds {})", seeds.join(","))
    }

    /// The node at `addr`, made on first use.
    fn node_at(&self, addr: &RedisNode) -> Result<(usize, Arc<Node>)> {
        let mut map = lock_unpoisoned(&self.map);
        if let Some(i) = map.nodes.iter().position(|(a, _)| a == addr) {
            return Ok((i, Arc::clone(&map.nodes[i].1)));
        }
        let client = self.client_of(addr, ProtocolVersion::RESP2)?;
        let node = Arc::new(Node::new(
            self.backend,
            addr.to_string(),
            Target::Server(Box::new(client)),
            self.connect_timeout,
        ));
        map.nodes.push((addr.clone(), Arc::clone(&node)));
        Ok((map.nodes.len() - 1, node))
    }

    /// A client of the node at `addr` speaking `protocol`.
    fn client_of(&self, addr: &RedisNode, protocol: ProtocolVersion) -> Result<redis::Client> {
        client_for(
            addr,
            self.config.tls,
            self.ca.as_deref(),
            self.config.username.as_deref(),
            self.config.password.as_deref(),
            0,
            protocol,
        )
        .map_err(|err| error::from_client(self.backend, format_args!("configure {addr}"), err))
    }

    /// A RESP3 client of node `index` (of the nodes seen), for sharded subscriptions
    /// (their messages and the server's own unsubscriptions come as pushes), and its
    /// address.
    pub(crate) fn pubsub_client(&self, index: usize) -> Result<(String, redis::Client)> {
        let addr = lock_unpoisoned(&self.map)
            .nodes
            .get(index)
            .map(|(a, _)| a.clone());
        let Some(addr) = addr else {
            return Err(Error::config(format!("no cluster node {index}")));
        };
        let client = self.client_of(&addr, ProtocolVersion::RESP3)?;
        Ok((addr.to_string(), client))
    }

    /// The index (of the nodes seen) of the primary serving `slot` in the map as it is.
    pub(crate) fn owner_index(&self, slot: u16) -> Option<usize> {
        lock_unpoisoned(&self.map).owner[usize::from(slot)]
    }

    /// How often the map was loaded (to reload only what the caller found wanting).
    pub(crate) fn version(&self) -> u64 {
        lock_unpoisoned(&self.map).version
    }

    /// The primary serving `slot` in the map as it is, if any.
    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        let map = lock_unpoisoned(&self.map);
        let i = map.owner[usize::from(slot)]?;
        Some(Arc::clone(&map.nodes[i].1))
    }

    /// The primary serving `slot`, loading the map first if it names none.
    async fn owner_of(&self, slot: u16, deadline: Instant) -> Result<Arc<Node>> {
        if let Some(node) = self.owner(slot) {
            return Ok(node);
        }
        self.reload(self.version(), deadline).await?;
        self.owner(slot).ok_or_else(|| Error::Unavailable {
            backend: self.backend,
            message: format!("no primary of {} serves hash slot {slot}", self.label()),
            source: None,
        })
    }

    /// Every primary that serves some slot, loading the map first if it is empty.
    pub(crate) async fn primaries(&self, deadline: Instant) -> Result<Vec<Arc<Node>>> {
        if self.version() == 0 {
            self.reload(0, deadline).await?;
        }
        let map = lock_unpoisoned(&self.map);
        let mut seen: Vec<usize> = map.owner.iter().flatten().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        Ok(seen
            .into_iter()
            .map(|i| Arc::clone(&map.nodes[i].1))
            .collect())
    }

    /// The primary that serves `slot`, as [`Shards::primaries`] lists them (its index).
    pub(crate) fn shard_of(&self, slot: u16, primaries: &[Arc<Node>]) -> Option<usize> {
        let owner = self.owner(slot)?;
        primaries.iter().position(|p| Arc::ptr_eq(p, &owner))
    }

    /// Reloads the slot map with `CLUSTER SLOTS`, asking every known node at once and
    /// taking the first answer, unless it was reloaded since `seen` (the version the
    /// caller found wanting).
    ///
    /// # Errors
    /// `InvalidConfig` when a node answers that it is no cluster node or refuses the
    /// credentials; else the first node's error when none answers.
    pub(crate) async fn reload(&self, seen: u64, deadline: Instant) -> Result<()> {
        let Ok(_serial) = tokio::time::timeout_at(deadline, self.reloading.lock()).await else {
            return Err(Error::no_answer(
                self.backend,
                format_args!("the slot map of {}", self.label()),
                Duration::from_millis(1),
            ));
        };
        if self.version() != seen {
            return Ok(());
        }
        let nodes: Vec<Arc<Node>> = lock_unpoisoned(&self.map)
            .nodes
            .iter()
            .map(|(_, n)| Arc::clone(n))
            .collect();
        let mut asks: FuturesUnordered<_> = nodes
            .iter()
            .map(|node| async move {
                let reply = Route::Node(node)
                    .command::<Value>(
                        "CLUSTER SLOTS",
                        deadline,
                        redis::cmd("CLUSTER").arg("SLOTS"),
                    )
                    .await;
                (node, reply)
            })
            .collect();
        let mut first_error = None;
        while let Some((node, reply)) = asks.next().await {
            let err = match reply.and_then(|value| self.parse_slots(&node.label, &value)) {
                Ok(ranges) => return self.install(ranges),
                Err(err) if err.to_string().contains("cluster support disabled") => {
                    Error::InvalidConfig {
                        message: format!(
                            "{} is not a Redis Cluster node (cluster support disabled); use \
                             redis:// for a single server",
                            node.label
                        ),
                        source: Some(Box::new(err)),
                    }
                }
                Err(err) => err,
            };
            if err.kind() == lock_core::ErrorKind::InvalidConfig {
                return Err(err);
            }
            first_error.get_or_insert(err);
        }
        Err(first_error.unwrap_or_else(|| Error::config("no seed node to ask for the slot map")))
    }

    /// The slot ranges and their primaries in a `CLUSTER SLOTS` reply from `label`.
    fn parse_slots(&self, label: &str, value: &Value) -> Result<Vec<(u16, u16, RedisNode)>> {
        let bad = || {
            error::protocol(
                self.backend,
                format!("unexpected reply of CLUSTER SLOTS on {label}: {value:?}"),
            )
        };
        let Value::Array(ranges) = value else {
            return Err(bad());
        };
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let Value::Array(parts) = range else {
                return Err(bad());
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                return Err(bad());
            };
            let host = match primary.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => return Err(bad()),
            };
            let Some(Value::Int(port)) = primary.get(1) else {
                return Err(bad());
            };
            let (Ok(start), Ok(end), Ok(port)) = (
                u16::try_from(*start),
                u16::try_from(*end),
                u16::try_from(*port),
            ) else {
                return Err(bad());
            };
            if end >= SLOTS || start > end {
                return Err(bad());
            }
            // A node that does not know its own address says "" or "?": it is the one asked.
            let host = if host.is_empty() || host == "?" {
                label
                    .rsplit_once(':')
                    .map(|(h, _)| h.to_owned())
                    .unwrap_or(host)
            } else {
                host
            };
            out.push((start, end, RedisNode::new(host, port)));
        }
        if out.is_empty() {
            return Err(Error::Unavailable {
                backend: self.backend,
                message: format!("{label} serves no hash slot (the cluster is not formed yet)"),
                source: None,
            });
        }
        Ok(out)
    }

    fn install(&self, ranges: Vec<(u16, u16, RedisNode)>) -> Result<()> {
        let mut owner = vec![None; usize::from(SLOTS)];
        for (start, end, addr) in ranges {
            let (i, _) = self.node_at(&addr)?;
            for slot in start..=end {
                owner[usize::from(slot)] = Some(i);
            }
        }
        let mut map = lock_unpoisoned(&self.map);
        map.owner = owner;
        map.version += 1;
        Ok(())
    }

    /// `slot` is served by `addr` from now on (a `MOVED` reply).
    pub(crate) fn moved(&self, slot: u16, addr: &RedisNode) -> Result<()> {
        let (i, _) = self.node_at(addr)?;
        lock_unpoisoned(&self.map).owner[usize::from(slot)] = Some(i);
        Ok(())
    }

    /// Sends a request for keys of hash `slot` to the primary that serves it, following
    /// the cluster's redirections within `deadline` (see the module's documentation).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        slot: u16,
        what: &str,
        deadline: Instant,
        send: F,
    ) -> Result<T>
    where
        T: Send,
        F: Fn(Conn) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        match self.route(slot, what, deadline, &send, Busy::Wait).await? {
            Some(value) => Ok(value),
            None => Err(self.migrating(slot, what, None)),
        }
    }

    /// Runs a script as [`Shards::call`] does, but `None` at the first `TRYAGAIN` (the
    /// slot is migrating and the script's keys are not all on the node asked).
    pub(crate) async fn script_unless_busy<T: redis::FromRedisValue + Send>(
        &self,
        slot: u16,
        what: &str,
        deadline: Instant,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<Option<T>> {
        let send = |mut conn: Conn| async move { invocation.invoke_async::<T>(&mut conn).await };
        self.route(slot, what, deadline, &send, Busy::GiveUp).await
    }

    /// [`Shards::call`]; `None` on `TRYAGAIN` with [`Busy::GiveUp`].
    async fn route<T, F, Fut>(
        &self,
        slot: u16,
        what: &str,
        deadline: Instant,
        send: &F,
        busy: Busy,
    ) -> Result<Option<T>>
    where
        T: Send,
        F: Fn(Conn) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<T>> + Send,
    {
        // Redirections and failovers followed; `TRYAGAIN` is bounded by the deadline alone.
        let mut hops = 0;
        let mut busy_pause = Backoff::new(RETRY_PAUSE, MAX_BUSY_PAUSE);
        let mut asked: Option<Arc<Node>> = None;
        // The latest TRYAGAIN, and the node that answered it.
        let mut busy_at: Option<(Arc<Node>, redis::RedisError)> = None;
        loop {
            let version = self.version();
            let node = self.owner_of(slot, deadline).await?;
            let (outcome, via) = match &asked {
                Some(target) => (
                    target.call_raw(what, deadline, send, true).await,
                    Arc::clone(target),
                ),
                None => (
                    node.call_raw(what, deadline, send, false).await,
                    Arc::clone(&node),
                ),
            };
            let err = match outcome {
                Ok(value) => return Ok(Some(value)),
                Err(Failure::Failed(err)) => {
                    // The primary may have failed over: go where the reloaded map says.
                    asked = None;
                    hops += 1;
                    if Instant::now() + RETRY_PAUSE >= deadline {
                        // The last try after TRYAGAIN ran out of time: the move is the cause.
                        return Err(match busy_at.take() {
                            Some((node, busy)) => self.migrating(slot, what, Some((&node, busy))),
                            None => err,
                        });
                    }
                    if hops >= MAX_HOPS {
                        return Err(err);
                    }
                    if err.kind() == lock_core::ErrorKind::InvalidConfig {
                        return Err(err);
                    }
                    let reloaded = self.reload(version, deadline).await;
                    match self.owner(slot) {
                        Some(now) if reloaded.is_ok() && !Arc::ptr_eq(&now, &node) => continue,
                        _ => return Err(err),
                    }
                }
                Err(Failure::Refused(err)) => err,
            };
            match err.kind() {
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
                    if hops + 1 >= MAX_HOPS =>
                {
                    return Err(via.failed(what, err));
                }
                ErrorKind::Server(ServerErrorKind::Moved) => {
                    hops += 1;
                    asked = None;
                    let Some(addr) = redirect(&err) else {
                        return Err(via.failed(what, err));
                    };
                    self.moved(slot, &addr)?;
                }
                ErrorKind::Server(ServerErrorKind::Ask) => {
                    hops += 1;
                    let Some(addr) = redirect(&err) else {
                        return Err(via.failed(what, err));
                    };
                    asked = Some(self.node_at(&addr)?.1);
                }
                ErrorKind::Server(ServerErrorKind::TryAgain) if busy == Busy::GiveUp => {
                    return Ok(None);
                }
                // The node asked (the importing one after ASK, whose keys are still
                // arriving) is asked again, without counting a hop.
                ErrorKind::Server(
                    kind @ (ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown),
                ) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left <= RETRY_PAUSE {
                        return Err(match kind {
                            ServerErrorKind::TryAgain => {
                                self.migrating(slot, what, Some((&via, err)))
                            }
                            _ => via.failed(what, err),
                        });
                    }
                    if kind == ServerErrorKind::TryAgain {
                        busy_at = Some((Arc::clone(&via), err));
                    }
                    sleep(busy_pause.next_pause().min(left - RETRY_PAUSE)).await;
                }
                _ => return Err(via.failed(what, err)),
            }
        }
    }

    /// `what` was refused with `TRYAGAIN` (by `refused`'s node) until its deadline.
    fn migrating(
        &self,
        slot: u16,
        what: &str,
        refused: Option<(&Node, redis::RedisError)>,
    ) -> Error {
        let (at, source) = match refused {
            Some((node, err)) => (
                node.label.clone(),
                Some(Box::new(err) as lock_core::raw::backend::BoxError),
            ),
            None => (self.label(), None),
        };
        Error::Unavailable {
            backend: self.backend,
            message: format!(
                "{what} on {at}: hash slot {slot} is being migrated (TRYAGAIN until the \
                 move ends)"
            ),
            source,
        }
    }
}

/// The node a `MOVED` or `ASK` reply names.
pub(crate) fn redirect(err: &redis::RedisError) -> Option<RedisNode> {
    let (addr, _) = err.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some(RedisNode::new(host, port.parse().ok()?))
}

/// Groups `keys` (by index) by the primary that serves their slot: one group per primary
/// of `primaries`, and the keys of slots no primary serves.
pub(crate) fn group_by_shard<'a>(
    shards: &Shards,
    primaries: &[Arc<Node>],
    keys: impl Iterator<Item = &'a str>,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); primaries.len()];
    let mut orphans = Vec::new();
    let mut cache: HashMap<u16, Option<usize>> = HashMap::new();
    for (i, key) in keys.enumerate() {
        let slot = slot_of(key.as_bytes());
        let shard = *cache
            .entry(slot)
            .or_insert_with(|| shards.shard_of(slot, primaries));
        match shard {
            Some(s) => groups[s].push(i),
            None => orphans.push(i),
        }
    }
    (groups, orphans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis_cluster_hashing() {
        // Values given by `CLUSTER KEYSLOT` on a Redis 7 server.
        assert_eq!(slot_of(b"lk"), 5002);
        assert_eq!(slot_of(b"a"), 15495);
        assert_eq!(slot_of(b"b"), 3300);
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"x{lk}:fence"), 5002);
        assert_eq!(slot_of(b"{}a"), slot_of(b"{}a"));
        assert_ne!(slot_of(b"{}a"), slot_of(b"a"));
    }
}
