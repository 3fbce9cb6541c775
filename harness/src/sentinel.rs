//! Redis behind Sentinel ([`RedisSentinel`]): one primary, replicas that follow it
//! (`replicaof`) and Sentinels that watch it ([`Sentinel`], `redis-server --sentinel` with
//! a generated `sentinel.conf`), each process a [`Server`] on free loopback ports.
//!
//! A start returns once every replica's link to the primary is up and every Sentinel
//! names the same primary, knows every replica and finds a quorum of Sentinels
//! (`SENTINEL CKQUORUM`); every wait is bounded. Detection and failover are short
//! ([`SentinelOptions`]) so that a failover takes a few seconds in tests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::cluster::Cluster;
use super::node::Node;
use super::probe::{self, redis_reply, Probe, Reply};
use super::process::{find_binary, LaunchSpec};
use super::redis::{tls_config, RedisOptions, RedisServer};
use super::server::{loopback, Member, Prepared, Server, ServerKind};
use super::tls::make_certificates;
use super::{temp_dir, wait_for_leader, write_file, HarnessError, DEFAULT_READY_TIMEOUT};
use crate::proxy::{FaultProxy, SourceRouter};

const HINT: &str = "apt-get install redis-server (Sentinel runs as `redis-server --sentinel`)";

/// Bound on one question to a server while waiting for a state.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Options of a [`RedisSentinel`] deployment (and of its [`Sentinel`] members).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SentinelOptions {
    /// The name the Sentinels monitor the primary under. Default `distlock`.
    pub master_name: String,
    /// Replicas of the primary. Default 2.
    pub replicas: usize,
    /// Sentinels. Default 3 (quorum 2).
    pub sentinels: usize,
    /// `down-after-milliseconds`: how long the primary may be silent before a Sentinel
    /// thinks it down. Default 1 s.
    pub down_after: Duration,
    /// `failover-timeout`. Default 3 s.
    pub failover_timeout: Duration,
    /// Options of the data servers (primary and replicas).
    pub redis: RedisOptions,
    /// Bound on the readiness wait of each process and of the whole deployment.
    /// Default: [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Put the first primary behind fault proxies ([`Front`]) that the Sentinels, the
    /// replicas and the clients that ask the Sentinels go through, so that it can be cut
    /// off from its replicas alone, or from everyone but clients with a path of their own.
    /// Default: off.
    pub partitionable: bool,
    /// The primary the Sentinels monitor (set by [`RedisSentinel`]).
    #[doc(hidden)]
    pub primary: Option<SocketAddr>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            master_name: "distlock".to_owned(),
            replicas: 2,
            sentinels: 3,
            down_after: Duration::from_secs(1),
            failover_timeout: Duration::from_secs(3),
            redis: RedisOptions::default(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
            partitionable: false,
            primary: None,
        }
    }
}

impl SentinelOptions {
    /// Appends one line to the data servers' `redis.conf`.
    pub fn redis_config_line(mut self, line: impl Into<String>) -> Self {
        self.redis = self.redis.config_line(line);
        self
    }

    fn quorum(&self) -> usize {
        self.sentinels / 2 + 1
    }
}

setters!(SentinelOptions {
    replicas: usize,
    partitionable: bool,
});

/// A Sentinel process (`redis-server --sentinel`).
#[derive(Debug)]
pub struct Sentinel {
    tls_port: Option<u16>,
}

#[async_trait]
impl ServerKind for Sentinel {
    type Options = SentinelOptions;
    type Program = PathBuf;

    const NAME: &'static str = "redis-sentinel";
    const CLUSTER: &'static str = "redis sentinels";
    const SCHEME: &'static str = "redis";
    const CLUSTER_SCHEME: &'static str = "redis+sentinel";
    /// The client port and the TLS port (used with TLS data servers only).
    const PORTS: usize = 2;

    fn find() -> Result<PathBuf, HarnessError> {
        find_binary("redis-server", "REDIS_SERVER_BIN", HINT)
    }

    fn members(options: &SentinelOptions) -> usize {
        options.sentinels
    }

    fn ready_timeout(options: &SentinelOptions) -> Duration {
        options.ready_timeout
    }

    fn prepare(
        program: &PathBuf,
        options: &SentinelOptions,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Prepared<Self>, HarnessError> {
        let port = member.own_ports()[0];
        let tls_port = options.redis.tls.as_ref().map(|_| member.own_ports()[1]);
        let label = format!("redis-sentinel 127.0.0.1:{port}");
        let primary = options.primary.ok_or_else(|| HarnessError::Cluster {
            cluster: label.clone(),
            detail: "a Sentinel needs the primary it monitors".to_owned(),
        })?;
        let conf = dir.join("sentinel.conf");
        let mut text = sentinel_config(port, dir, primary, options);
        if let (Some(certificates), Some(tls_port)) = (&options.redis.tls, tls_port) {
            text.push_str(&tls_config(tls_port, certificates));
        }
        write_file(&label, &conf, &text)?;
        let spec = LaunchSpec {
            program: program.clone(),
            args: vec![conf.into_os_string(), "--sentinel".into()],
            env: Vec::new(),
            cwd: dir.to_owned(),
            log: dir.join("server.log"),
            run_as: None,
            with_children: false,
        };
        Ok(Prepared {
            node: Node::new(
                label,
                spec,
                Probe::RedisPing(loopback(port)),
                options.ready_timeout,
            ),
            data_dir: dir.to_owned(),
            kind: Sentinel { tls_port },
        })
    }
}

impl Server<Sentinel> {
    /// Where clients reach the Sentinel: its TLS port when the deployment serves TLS,
    /// else [`addr`](Self::addr).
    pub fn client_addr(&self) -> SocketAddr {
        self.kind.tls_port.map_or_else(|| self.addr(), loopback)
    }
}

fn sentinel_config(
    port: u16,
    dir: &Path,
    primary: SocketAddr,
    options: &SentinelOptions,
) -> String {
    let name = &options.master_name;
    format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         protected-mode no\n\
         daemonize no\n\
         logfile \"\"\n\
         dir \"{}\"\n\
         sentinel monitor {name} {} {} {}\n\
         sentinel down-after-milliseconds {name} {}\n\
         sentinel failover-timeout {name} {}\n\
         sentinel parallel-syncs {name} 1\n",
        dir.display(),
        primary.ip(),
        primary.port(),
        options.quorum(),
        options.down_after.as_millis(),
        options.failover_timeout.as_millis(),
    )
}

/// The source address the replicas of a [`partitionable`](SentinelOptions::partitionable)
/// deployment bind their connections to (`bind-source-addr`), so that [`Front`] tells
/// replication from the rest.
const REPLICA_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The way in to the first primary of a [`partitionable`](SentinelOptions::partitionable)
/// deployment: one address (the one the Sentinels monitor, the replicas follow and the
/// clients are told), whose connections go through [`replication`](Self::replication)
/// when they come from a replica and through [`others`](Self::others) otherwise.
///
/// Sentinel re-points a replica that follows another address than the one it monitors
/// (`+fix-slave-config`), so replication cannot go through a proxy of its own: both share
/// the address and are told apart by their source.
#[derive(Debug)]
pub struct Front {
    router: SourceRouter,
    /// What the replicas' links to the primary go through.
    pub replication: Arc<Vec<FaultProxy>>,
    /// What everything else (Sentinels, clients) goes through.
    pub others: Arc<Vec<FaultProxy>>,
}

impl Front {
    async fn start(primary: SocketAddr, label: &str) -> Result<Self, HarnessError> {
        let proxy = || async {
            FaultProxy::start(primary)
                .await
                .map_err(|e| HarnessError::io(label, "start a fault proxy", e))
        };
        let (replication, others) = (proxy().await?, proxy().await?);
        let router = SourceRouter::start(
            vec![(IpAddr::V4(REPLICA_SOURCE), replication.addr())],
            others.addr(),
        )
        .await
        .map_err(|e| HarnessError::io(label, "start a source router", e))?;
        Ok(Self {
            router,
            replication: Arc::new(vec![replication]),
            others: Arc::new(vec![others]),
        })
    }

    /// The address in front of the primary.
    pub fn addr(&self) -> SocketAddr {
        self.router.addr()
    }
}

/// A primary with replicas behind Sentinels, on loopback. Data server 0 is the primary
/// at start; after a failover [`primary`](Self::primary) says which one is. Every process
/// is killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    servers: Vec<RedisServer>,
    front: Option<Front>,
    sentinels: Cluster<Sentinel>,
    options: SentinelOptions,
    /// The certificates of a TLS deployment ([`start_tls`](Self::start_tls)).
    certificates: Option<tempfile::TempDir>,
}

impl RedisSentinel {
    /// Starts a primary, two replicas and three Sentinels (default options).
    ///
    /// # Errors
    /// As [`Server::start`](super::Server::start), or [`HarnessError::Cluster`] when the
    /// replicas or the Sentinels do not come to agree in time.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(SentinelOptions::default()).await
    }

    /// Starts a primary, two replicas and three Sentinels that all speak TLS to clients
    /// and to each other (replication and monitoring over TLS), with throwaway
    /// certificates ([`ca_file`](Self::ca_file)). Clients and Sentinels know only the TLS
    /// ports ([`url`](Self::url) is `rediss+sentinel://`); the plain ports stay open for
    /// the harness.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    ///
    /// # Panics
    /// When `openssl` is missing or fails (see [`make_certificates`]).
    pub async fn start_tls() -> Result<Self, HarnessError> {
        let certificates = temp_dir("redis-tls")?;
        make_certificates(certificates.path()).await;
        let options = SentinelOptions {
            redis: RedisOptions::default().tls(certificates.path()),
            ..SentinelOptions::default()
        };
        let mut deployment = Self::start_with(options).await?;
        deployment.certificates = Some(certificates);
        Ok(deployment)
    }

    /// Starts the deployment with `options`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(mut options: SentinelOptions) -> Result<Self, HarnessError> {
        let started = Instant::now();
        let primary = RedisServer::start_with(options.redis.clone()).await?;
        let front = if options.partitionable {
            Some(Front::start(primary.addr(), &primary.url()).await?)
        } else {
            None
        };
        let entry = front.as_ref().map_or(primary.client_addr(), Front::addr);
        let follow = format!("replicaof {} {}", entry.ip(), entry.port());
        let mut servers = vec![primary];
        for _ in 0..options.replicas {
            let mut replica = options.redis.clone().config_line(follow.clone());
            if front.is_some() {
                replica = replica.config_line(format!("bind-source-addr {REPLICA_SOURCE}"));
            }
            servers.push(RedisServer::start_with(replica).await?);
        }
        options.primary = Some(entry);
        let sentinels = Cluster::<Sentinel>::start_with(options.clone()).await?;
        let deployment = Self {
            servers,
            front,
            sentinels,
            options,
            certificates: None,
        };
        let remaining = deployment
            .options
            .ready_timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(5));
        deployment.wait_until_watched(remaining).await?;
        Ok(deployment)
    }

    /// The data servers (primary and replicas), in start order.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Data server `i`.
    ///
    /// # Panics
    /// If there is no such server.
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// The way in to the first primary, when the deployment is
    /// [`partitionable`](SentinelOptions::partitionable).
    pub fn front(&self) -> Option<&Front> {
        self.front.as_ref()
    }

    /// The data server at `addr`, its own or its [`Front`]'s.
    fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        if self.front.as_ref().is_some_and(|f| f.addr() == addr) {
            return Some(0);
        }
        self.servers.iter().position(|s| s.client_addr() == addr)
    }

    /// The Sentinels.
    pub fn sentinels(&self) -> &Cluster<Sentinel> {
        &self.sentinels
    }

    /// The name the primary is monitored under.
    pub fn master_name(&self) -> &str {
        &self.options.master_name
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,…/<master name>`; with TLS
    /// `rediss+sentinel://` to the Sentinels' TLS ports with `tls_ca` set.
    pub fn url(&self) -> String {
        let Some(ca) = self.ca_file() else {
            return format!("{}/{}", self.sentinels.url(), self.options.master_name);
        };
        let hosts: Vec<String> = self
            .sentinels
            .members()
            .iter()
            .map(|s| s.client_addr().to_string())
            .collect();
        format!(
            "rediss+sentinel://{}/{}?tls_ca={}",
            hosts.join(","),
            self.options.master_name,
            ca.display()
        )
    }

    /// The CA that signed the servers' certificates, in a TLS deployment.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.certificates.as_ref().map(|d| d.path().join("ca.pem"))
    }

    /// One more Sentinel, of its own, that names `primary` (e.g. a fault proxy in front of
    /// the primary, so that a client reaching the primary through it can be cut off) and
    /// never thinks it down. It joins the others' gossip; start it only while no failover
    /// is wanted. Killed on drop.
    ///
    /// # Errors
    /// As [`Cluster::start`].
    pub async fn own_sentinel(
        &self,
        primary: SocketAddr,
    ) -> Result<Cluster<Sentinel>, HarnessError> {
        let options = SentinelOptions {
            sentinels: 1,
            down_after: Duration::from_secs(3600),
            failover_timeout: Duration::from_secs(3600),
            primary: Some(primary),
            ..self.options.clone()
        };
        Cluster::start_with(options).await
    }

    /// The data server the Sentinels name as primary now: a majority of all Sentinels
    /// must name it, and it must say it is a primary.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] when that is not the case right now.
    pub async fn primary(&self) -> Result<usize, HarnessError> {
        let cluster = self.sentinels.label.as_str();
        let mut named: Vec<SocketAddr> = Vec::new();
        for sentinel in self.sentinels.members().iter().filter(|s| s.is_running()) {
            let args = ["SENTINEL", "get-master-addr-by-name", self.master_name()];
            if let Ok(Reply::Array(items)) = redis_reply(sentinel.addr(), &args, ASK_TIMEOUT).await
            {
                let addr = match items.as_slice() {
                    [host, port] => format!(
                        "{}:{}",
                        host.text().unwrap_or(""),
                        port.text().unwrap_or("")
                    ),
                    _ => continue,
                };
                if let Ok(addr) = addr.parse() {
                    named.push(addr);
                }
            }
        }
        let majority = self.sentinels.len() / 2 + 1;
        let agreed = named
            .iter()
            .find(|a| named.iter().filter(|b| b == a).count() >= majority);
        let Some(addr) = agreed else {
            return Err(HarnessError::Cluster {
                cluster: cluster.to_owned(),
                detail: format!("no majority of Sentinels names one primary: {named:?}"),
            });
        };
        let index = self.index_of(*addr).ok_or_else(|| HarnessError::Cluster {
            cluster: cluster.to_owned(),
            detail: format!("the Sentinels name {addr}, which is no server of ours"),
        })?;
        if self.role(index).await.as_deref() != Some("master") {
            return Err(HarnessError::Cluster {
                cluster: cluster.to_owned(),
                detail: format!("the Sentinels name {addr}, which is not a primary (yet)"),
            });
        }
        Ok(index)
    }

    /// Polls until the Sentinels name a primary other than server `old` (a failover
    /// happened and the promoted replica is a primary), for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if none shows up in time.
    pub async fn wait_for_new_primary(
        &self,
        old: usize,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        wait_for_leader(&self.sentinels.label, Some(old), timeout, || self.primary()).await
    }

    /// The `role` server `i` reports in `INFO replication` (`master` or `slave`).
    pub async fn role(&self, i: usize) -> Option<String> {
        info_field(self.servers[i].addr(), "replication", "role").await
    }

    /// Waits until every replica's link is up and every Sentinel names the first primary,
    /// knows every replica and finds a quorum.
    async fn wait_until_watched(&self, timeout: Duration) -> Result<(), HarnessError> {
        let started = Instant::now();
        let name = self.master_name().to_owned();
        loop {
            let last = self.watched(&name).await;
            let Err(detail) = last else {
                return Ok(());
            };
            if started.elapsed() >= timeout {
                return Err(HarnessError::Cluster {
                    cluster: self.sentinels.label.clone(),
                    detail: format!("not watching the primary after {timeout:?}: {detail}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Err` says what is not ready yet.
    async fn watched(&self, name: &str) -> Result<(), String> {
        for replica in &self.servers[1..] {
            let link = info_field(replica.addr(), "replication", "master_link_status").await;
            if link.as_deref() != Some("up") {
                return Err(format!("{}: master link {link:?}", replica.addr()));
            }
        }
        for sentinel in self.sentinels.members() {
            let addr = sentinel.addr();
            let ask = |args: &'static [&'static str]| {
                let mut full: Vec<&str> = args.to_vec();
                full.push(name);
                async move { redis_reply(addr, &full, ASK_TIMEOUT).await }
            };
            match ask(&["SENTINEL", "ckquorum"]).await {
                Ok(Reply::Text(ok)) if ok.starts_with("OK") => {}
                other => return Err(format!("{addr}: CKQUORUM {other:?}")),
            }
            match ask(&["SENTINEL", "replicas"]).await {
                Ok(Reply::Array(known)) if known.len() == self.servers.len() - 1 => {}
                other => return Err(format!("{addr}: replicas {other:?}")),
            }
        }
        let primary = self.primary().await.map_err(|e| e.to_string())?;
        if primary == 0 {
            Ok(())
        } else {
            Err(format!("the Sentinels name server {primary}"))
        }
    }
}

/// `field` of `INFO section` on `addr`, `None` when it cannot be read.
async fn info_field(addr: SocketAddr, section: &str, field: &str) -> Option<String> {
    probe::info_field(addr, "INFO", section, field, ASK_TIMEOUT).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinels_fail_over_to_a_replica() {
        let Some(deployment) = crate::or_skip(RedisSentinel::start().await) else {
            return;
        };
        assert_eq!(deployment.primary().await.expect("primary"), 0);
        assert!(deployment.url().starts_with("redis+sentinel://127.0.0.1:"));
        assert!(deployment.url().ends_with("/distlock"));
        deployment
            .server(0)
            .kill9()
            .await
            .expect("kill the primary");
        let killed = Instant::now();
        let promoted = deployment
            .wait_for_new_primary(0, Duration::from_secs(30))
            .await
            .expect("failover");
        println!("failover to server {promoted} in {:?}", killed.elapsed());
        assert!(promoted == 1 || promoted == 2);
        assert_eq!(deployment.role(promoted).await.as_deref(), Some("master"));
    }

    #[test]
    fn the_config_monitors_the_primary_with_short_timeouts() {
        let options = SentinelOptions::default();
        let conf = sentinel_config(26379, Path::new("/tmp/x"), loopback(7000), &options);
        assert!(conf.contains("sentinel monitor distlock 127.0.0.1 7000 2\n"));
        assert!(conf.contains("down-after-milliseconds distlock 1000\n"));
        assert!(conf.contains("failover-timeout distlock 3000\n"));
    }
}
