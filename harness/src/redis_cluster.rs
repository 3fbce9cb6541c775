//! Redis Cluster ([`RedisCluster`]): three primaries with one replica each, every one a
//! [`RedisServer`] with `cluster-enabled yes` on free loopback ports, formed without
//! `redis-cli` (`CLUSTER MEET`, `CLUSTER ADDSLOTSRANGE`, `CLUSTER REPLICATE`).
//!
//! A start returns once every node says `cluster_state:ok`, knows every other node and
//! every replica's link to its primary is up; every wait is bounded. The node timeout is
//! 3 s (a busy machine sets off no failover), 1 s for the tests that kill a primary (its
//! replica is promoted within a few seconds). Operations: kill or pause
//! a primary and wait for its replica's promotion; move a slot to another primary step
//! by step ([`SlotMove`]), stopping half-way if wanted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::probe::{self, redis_reply, Reply};
use super::redis::{RedisOptions, RedisServer};
use super::HarnessError;

/// Bound on one question to a node.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// Three primaries (servers 0, 1, 2, serving slots 0-5460, 5461-10922, 10923-16383) and
/// one replica each (server 3 + i follows primary i), on loopback. Every process is
/// killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    servers: Vec<RedisServer>,
    ids: Vec<String>,
    label: String,
}

/// A slot on its way from one primary to another ([`RedisCluster::begin_move`]).
#[derive(Debug, Clone)]
pub struct SlotMove {
    /// The slot.
    pub slot: u16,
    /// The server it leaves.
    pub from: usize,
    /// The server it goes to.
    pub to: usize,
}

impl RedisCluster {
    /// Starts the six servers and forms the cluster, with [`RedisCluster::NODE_TIMEOUT`]
    /// (failovers are slow, but a busy machine causes none).
    ///
    /// # Errors
    /// As [`RedisServer::start`], or [`HarnessError::Cluster`] when the cluster does not
    /// form in time.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(RedisOptions::default(), Self::NODE_TIMEOUT).await
    }

    /// Starts the cluster with [`RedisCluster::FAILOVER_NODE_TIMEOUT`], for the tests that
    /// kill a primary and wait for its replica's promotion.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_for_failover() -> Result<Self, HarnessError> {
        Self::start_with(RedisOptions::default(), Self::FAILOVER_NODE_TIMEOUT).await
    }

    /// `cluster-node-timeout` of [`start`](Self::start): long enough that a noisy machine
    /// does not make the nodes fail each other over.
    pub const NODE_TIMEOUT: Duration = Duration::from_secs(3);

    /// `cluster-node-timeout` of [`start_for_failover`](Self::start_for_failover): a
    /// killed primary's replica is promoted within about 2-3 s.
    pub const FAILOVER_NODE_TIMEOUT: Duration = Duration::from_secs(1);

    /// Starts the cluster with `options` for every server (cluster lines are added) and
    /// `cluster-node-timeout` `node_timeout`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(
        options: RedisOptions,
        node_timeout: Duration,
    ) -> Result<Self, HarnessError> {
        let options = options
            .config_line("cluster-enabled yes")
            .config_line("cluster-config-file nodes.conf")
            .config_line(format!("cluster-node-timeout {}", node_timeout.as_millis()))
            .config_line("cluster-replica-validity-factor 0")
            .config_line("cluster-require-full-coverage no")
            // A replica's first sync starts at once, not after the default 5 s.
            .config_line("repl-diskless-sync-delay 0");
        let starts = (0..6).map(|_| RedisServer::start_with(options.clone()));
        let servers = futures::future::join_all(starts)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let label = format!("redis cluster {}", servers[0].addr());
        let mut ids = Vec::with_capacity(6);
        for server in &servers {
            ids.push(text(
                &label,
                ask(server.addr(), &["CLUSTER", "MYID"]).await?,
            )?);
        }
        let mut cluster = Self {
            servers,
            ids,
            label,
        };
        cluster.form().await?;
        Ok(cluster)
    }

    async fn form(&mut self) -> Result<(), HarnessError> {
        let first = self.servers[0].addr();
        let port = first.port().to_string();
        for server in &self.servers[1..] {
            self.expect_ok(server.addr(), &["CLUSTER", "MEET", "127.0.0.1", &port])
                .await?;
        }
        let third = SLOTS / 3;
        let ranges = [
            (0, third),
            (third + 1, 2 * third + 1),
            (2 * third + 2, SLOTS - 1),
        ];
        for (i, (start, end)) in ranges.iter().enumerate() {
            let (start, end) = (start.to_string(), end.to_string());
            self.expect_ok(
                self.servers[i].addr(),
                &["CLUSTER", "ADDSLOTSRANGE", &start, &end],
            )
            .await?;
        }
        // A replica can follow its primary once it knows it.
        self.wait(
            "every node knows the others",
            Duration::from_secs(20),
            |c| async move {
                for server in &c.servers {
                    let nodes = c.nodes_text(server.addr()).await?;
                    let known = nodes
                        .lines()
                        .filter(|l| !l.contains("handshake") && !l.trim().is_empty())
                        .count();
                    if known != c.servers.len() {
                        return Err(format!("{} knows {known} nodes", server.addr()));
                    }
                }
                Ok(())
            },
        )
        .await?;
        for i in 0..3 {
            let primary = self.ids[i].clone();
            self.expect_ok(
                self.servers[3 + i].addr(),
                &["CLUSTER", "REPLICATE", &primary],
            )
            .await?;
        }
        self.wait_until_ok(Duration::from_secs(30)).await
    }

    /// Waits until every running node says `cluster_state:ok`, agrees on who serves every
    /// slot, and every running replica's link is up.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation.
    pub async fn wait_until_ok(&self, timeout: Duration) -> Result<(), HarnessError> {
        self.wait("the cluster is ok", timeout, |c| async move {
            let mut maps = Vec::new();
            for server in c.servers.iter().filter(|s| s.is_running()) {
                let addr = server.addr();
                let state = info_field(addr, "CLUSTER", "INFO", "cluster_state").await;
                if state.as_deref() != Some("ok") {
                    return Err(format!("{addr}: cluster_state {state:?}"));
                }
                let role = info_field(addr, "INFO", "replication", "role").await;
                if role.as_deref() == Some("slave") {
                    let link = info_field(addr, "INFO", "replication", "master_link_status").await;
                    if link.as_deref() != Some("up") {
                        return Err(format!("{addr}: master link {link:?}"));
                    }
                }
                maps.push(c.slot_owners(addr).await?);
            }
            if maps.windows(2).any(|w| w[0] != w[1]) {
                return Err("the nodes disagree on the slot map".to_owned());
            }
            Ok(())
        })
        .await
    }

    /// Polls `check` every 50 ms until it says `Ok`, for at most `timeout`.
    async fn wait<'a, F, Fut>(
        &'a self,
        what: &str,
        timeout: Duration,
        check: F,
    ) -> Result<(), HarnessError>
    where
        F: Fn(&'a Self) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let started = Instant::now();
        loop {
            let last = match check(self).await {
                Ok(()) => return Ok(()),
                Err(last) => last,
            };
            if started.elapsed() >= timeout {
                return Err(self.error(format!("{what}: not after {timeout:?}: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn error(&self, detail: String) -> HarnessError {
        HarnessError::Cluster {
            cluster: self.label.clone(),
            detail,
        }
    }

    async fn expect_ok(&self, addr: SocketAddr, args: &[&str]) -> Result<(), HarnessError> {
        match ask(addr, args).await? {
            Reply::Text(ok) if ok == "OK" => Ok(()),
            other => Err(self.error(format!("{addr}: {} answered {other:?}", args.join(" ")))),
        }
    }

    async fn nodes_text(&self, addr: SocketAddr) -> Result<String, String> {
        match redis_reply(addr, &["CLUSTER", "NODES"], ASK_TIMEOUT).await {
            Ok(Reply::Text(text)) => Ok(text),
            other => Err(format!("{addr}: CLUSTER NODES {other:?}")),
        }
    }

    /// Which server serves each slot range, as `addr` sees it: `(start, end, server)`.
    async fn slot_owners(&self, addr: SocketAddr) -> Result<Vec<(u16, u16, usize)>, String> {
        let reply = redis_reply(addr, &["CLUSTER", "SLOTS"], ASK_TIMEOUT)
            .await
            .map_err(|e| format!("{addr}: CLUSTER SLOTS: {e}"))?;
        let Reply::Array(ranges) = reply else {
            return Err(format!("{addr}: CLUSTER SLOTS {reply:?}"));
        };
        let mut owners = Vec::new();
        for range in ranges {
            let Reply::Array(parts) = range else {
                continue;
            };
            let number = |i: usize| parts.get(i).and_then(|p| p.text()?.parse::<u16>().ok());
            let port = match parts.get(2) {
                Some(Reply::Array(primary)) => {
                    primary.get(1).and_then(|p| p.text()?.parse::<u16>().ok())
                }
                _ => None,
            };
            let (Some(start), Some(end), Some(port)) = (number(0), number(1), port) else {
                return Err(format!("{addr}: unreadable CLUSTER SLOTS entry"));
            };
            let server = self
                .servers
                .iter()
                .position(|s| s.port() == port)
                .ok_or_else(|| format!("{addr}: slot owner port {port} is no server of ours"))?;
            owners.push((start, end, server));
        }
        owners.sort_unstable();
        Ok(owners)
    }

    /// The servers, in start order (0-2 primaries at start, 3 + i the replica of i).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Server `i`.
    ///
    /// # Panics
    /// If there is no such server.
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// The node id of server `i`.
    pub fn node_id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…`: every server, as seed nodes.
    pub fn hosts(&self) -> String {
        let hosts: Vec<String> = self.servers.iter().map(|s| s.addr().to_string()).collect();
        hosts.join(",")
    }

    /// `redis+cluster://` with every server as a seed node.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.hosts())
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT` on a running node).
    ///
    /// # Errors
    /// When no running node answers.
    pub async fn slot_of(&self, key: &str) -> Result<u16, HarnessError> {
        let node = self.running()?;
        let reply = ask(node, &["CLUSTER", "KEYSLOT", key]).await?;
        text(&self.label, reply)?
            .parse()
            .map_err(|_| self.error("unreadable CLUSTER KEYSLOT".to_owned()))
    }

    fn running(&self) -> Result<SocketAddr, HarnessError> {
        self.servers
            .iter()
            .find(|s| s.is_running())
            .map(RedisServer::addr)
            .ok_or_else(|| self.error("no node runs".to_owned()))
    }

    /// The server that serves `slot` as a running node sees it now.
    ///
    /// # Errors
    /// When no running node answers or none serves the slot.
    pub async fn owner_of(&self, slot: u16) -> Result<usize, HarnessError> {
        let owners = self
            .slot_owners(self.running()?)
            .await
            .map_err(|e| self.error(e))?;
        owners
            .into_iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, server)| server)
            .ok_or_else(|| self.error(format!("no node serves slot {slot}")))
    }

    /// The server that serves `key`.
    ///
    /// # Errors
    /// As [`owner_of`](Self::owner_of).
    pub async fn owner_of_key(&self, key: &str) -> Result<usize, HarnessError> {
        self.owner_of(self.slot_of(key).await?).await
    }

    /// Polls until a server other than `old` serves `slot` and says it is a primary (a
    /// failover promoted a replica), for at most `timeout`: its index.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation.
    pub async fn wait_for_new_owner(
        &self,
        slot: u16,
        old: usize,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        let started = Instant::now();
        loop {
            let last = match self.owner_of(slot).await {
                Ok(owner) if owner != old => {
                    let role =
                        info_field(self.servers[owner].addr(), "INFO", "replication", "role").await;
                    if role.as_deref() == Some("master") {
                        return Ok(owner);
                    }
                    format!("server {owner} says role {role:?}")
                }
                Ok(_) => format!("server {old} still serves slot {slot}"),
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= timeout {
                return Err(self.error(format!("no new owner after {timeout:?}: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts moving `slot` to primary `to`: `IMPORTING` on `to`, then `MIGRATING` on its
    /// owner. Clients are sent `ASK` for the slot's keys that are no longer on the owner.
    ///
    /// # Errors
    /// When a node refuses a step.
    pub async fn begin_move(&self, slot: u16, to: usize) -> Result<SlotMove, HarnessError> {
        let from = self.owner_of(slot).await?;
        let slot_text = slot.to_string();
        self.expect_ok(
            self.servers[to].addr(),
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_text,
                "IMPORTING",
                &self.ids[from],
            ],
        )
        .await?;
        self.expect_ok(
            self.servers[from].addr(),
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &self.ids[to]],
        )
        .await?;
        Ok(SlotMove { slot, from, to })
    }

    /// Moves every key of the slot to its new primary (one `MIGRATE … KEYS` call): the
    /// number of keys moved.
    ///
    /// # Errors
    /// When a node refuses a step.
    pub async fn move_keys(&self, moving: &SlotMove) -> Result<usize, HarnessError> {
        let from = self.servers[moving.from].addr();
        let to = self.servers[moving.to].addr();
        let slot = moving.slot.to_string();
        let reply = ask(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "10000"]).await?;
        let keys: Vec<String> = match reply {
            Reply::Array(keys) => keys
                .iter()
                .filter_map(|k| k.text().map(str::to_owned))
                .collect(),
            other => return Err(self.error(format!("GETKEYSINSLOT answered {other:?}"))),
        };
        if keys.is_empty() {
            return Ok(0);
        }
        let port = to.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        self.expect_ok(from, &args).await?;
        Ok(keys.len())
    }

    /// Ends the move: `SETSLOT … NODE` on the new primary, the old one and every other
    /// running node. Clients are sent `MOVED` from then on.
    ///
    /// # Errors
    /// When a node refuses a step.
    pub async fn finish_move(&self, moving: &SlotMove) -> Result<(), HarnessError> {
        let slot = moving.slot.to_string();
        let id = self.ids[moving.to].clone();
        let args = ["CLUSTER", "SETSLOT", slot.as_str(), "NODE", id.as_str()];
        self.expect_ok(self.servers[moving.to].addr(), &args)
            .await?;
        self.expect_ok(self.servers[moving.from].addr(), &args)
            .await?;
        for (i, server) in self.servers.iter().enumerate() {
            if i != moving.to && i != moving.from && server.is_running() && i < 3 {
                self.expect_ok(server.addr(), &args).await?;
            }
        }
        Ok(())
    }

    /// `INFO commandstats` calls of `command` (lower case, e.g. `evalsha`) on server `i`.
    pub async fn command_calls(&self, i: usize, command: &str) -> u64 {
        let field = format!("cmdstat_{command}");
        info_field(self.servers[i].addr(), "INFO", "commandstats", &field)
            .await
            .and_then(|v| {
                v.split(',')
                    .find_map(|part| part.strip_prefix("calls="))
                    .and_then(|n| n.parse().ok())
            })
            .unwrap_or(0)
    }
}

async fn ask(addr: SocketAddr, args: &[&str]) -> Result<Reply, HarnessError> {
    redis_reply(addr, args, ASK_TIMEOUT)
        .await
        .map_err(|e| HarnessError::Cluster {
            cluster: format!("redis cluster node {addr}"),
            detail: format!("{}: {e}", args.first().copied().unwrap_or("")),
        })
}

fn text(label: &str, reply: Reply) -> Result<String, HarnessError> {
    match reply {
        Reply::Text(text) => Ok(text),
        other => Err(HarnessError::Cluster {
            cluster: label.to_owned(),
            detail: format!("unexpected reply {other:?}"),
        }),
    }
}

/// `field` of what `command section` answers on `addr`.
async fn info_field(addr: SocketAddr, command: &str, section: &str, field: &str) -> Option<String> {
    probe::info_field(addr, command, section, field, ASK_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_forms_fails_over_and_moves_a_slot() {
        let Some(cluster) = crate::or_skip(RedisCluster::start_for_failover().await) else {
            return;
        };
        let slot = cluster.slot_of("jobs").await.expect("slot");
        let owner = cluster.owner_of(slot).await.expect("owner");
        assert!(owner < 3);
        let to = (owner + 1) % 3;
        let moving = cluster.begin_move(slot, to).await.expect("begin");
        cluster.move_keys(&moving).await.expect("keys");
        cluster.finish_move(&moving).await.expect("finish");
        cluster
            .wait_until_ok(Duration::from_secs(10))
            .await
            .expect("ok after the move");
        assert_eq!(cluster.owner_of(slot).await.expect("owner"), to);
        cluster.server(to).kill9().await.expect("kill");
        let killed = Instant::now();
        let promoted = cluster
            .wait_for_new_owner(slot, to, Duration::from_secs(30))
            .await
            .expect("failover");
        println!("promoted server {promoted} in {:?}", killed.elapsed());
        assert_eq!(promoted, to + 3);
    }
}
