//! What lockbench measures: one target per backend, with its servers, its lock URL and
//! the raw protocol floor on the same servers.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use std::net::SocketAddr;

use async_trait::async_trait;
use conformance::harness::{EtcdServer, HarnessError, RedisNodes, RedisServer, ZkServer};
use conformance::proxy::FaultProxy;

use crate::floors::{EtcdFloor, RedisFloor, ZkFloor};
use crate::workloads::TrafficCounter;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One raw hold of the floor protocol (key and token, node path, key).
#[derive(Debug)]
pub(crate) struct RawHold {
    pub(crate) name: String,
    pub(crate) token: String,
}

/// The same operations as a lock, in the backend's raw protocol with no library on top:
/// the floor every ratio is measured against.
#[async_trait]
pub(crate) trait RawFloor: Send + Sync {
    /// What the floor does, for the report.
    fn describe(&self) -> String;
    /// Takes `name` (uncontended).
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError>;
    /// Gives it back.
    async fn release(&self, hold: RawHold) -> Result<(), BoxError>;
}

/// A backend under test.
pub(crate) struct Target {
    /// Short label (`memory`, `redis`, `redlock-5`, `zookeeper`, `etcd`).
    pub(crate) label: String,
    /// URL of the lock service, without query string.
    pub(crate) url: String,
    /// The raw protocol floor on the same servers, if the backend has one.
    pub(crate) floor: Option<Arc<dyn RawFloor>>,
    /// Whether a holder in another process can be killed (not for in-process backends).
    pub(crate) cross_process: bool,
    /// Shortest TTL for the takeover workload.
    pub(crate) takeover_ttl: Duration,
    /// A path to the servers through counting proxies, for the renewal workload.
    pub(crate) traffic: Option<Traffic>,
    /// Servers kept alive for the run.
    pub(crate) servers: Vec<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.label)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The URL with `query` appended.
    pub(crate) fn url_with(&self, query: &str) -> String {
        if query.is_empty() {
            self.url.clone()
        } else {
            format!("{}?{query}", self.url)
        }
    }
}

/// The backends lockbench knows, in report order.
pub(crate) const BACKENDS: &[&str] = &["memory", "redis", "redlock", "zookeeper", "etcd"];

/// TTL of the takeover workload on networked backends (etcd leases are whole seconds).
const TAKEOVER_TTL: Duration = Duration::from_secs(2);

/// A URL whose connections pass through counting proxies, for the renewal workload.
pub(crate) struct Traffic {
    pub(crate) url: String,
    pub(crate) proxies: Vec<FaultProxy>,
}

impl TrafficCounter for Traffic {
    fn requests(&self) -> u64 {
        self.proxies.iter().map(FaultProxy::client_reads).sum()
    }
}

async fn proxies(addrs: &[SocketAddr]) -> Result<(Vec<FaultProxy>, Vec<String>), String> {
    let mut proxies = Vec::new();
    let mut hosts = Vec::new();
    for addr in addrs {
        let proxy = FaultProxy::start(*addr)
            .await
            .map_err(|e| format!("cannot start a counting proxy: {e}"))?;
        hosts.push(proxy.addr().to_string());
        proxies.push(proxy);
    }
    Ok((proxies, hosts))
}

fn harness(err: HarnessError) -> String {
    format!("cannot start its servers: {err}")
}

/// Starts what `backend` needs on this machine, or says why it cannot.
pub(crate) async fn start(backend: &str) -> Result<Target, String> {
    let networked = |label: &str, url: String, floor: Arc<dyn RawFloor>, traffic: Traffic| Target {
        label: label.into(),
        url,
        floor: Some(floor),
        cross_process: true,
        takeover_ttl: TAKEOVER_TTL,
        traffic: Some(traffic),
        servers: Vec::new(),
    };
    let floor_err = |e: BoxError| format!("raw floor client failed: {e}");
    let scheme = match backend {
        "redis" => "redis",
        "redlock" => "redlock",
        "zookeeper" => "zk",
        "etcd" => "etcd",
        _ => "memory",
    };
    if !lock_core::registry().schemes().iter().any(|s| s == scheme) {
        return Err(format!("no backend serves {scheme}:// in this build"));
    }
    match backend {
        "memory" => Ok(Target {
            label: "memory".into(),
            url: format!("memory://lockbench-{}", uuid::Uuid::new_v4().simple()),
            floor: None,
            cross_process: false,
            takeover_ttl: Duration::from_secs(1),
            traffic: None,
            servers: Vec::new(),
        }),
        "redis" => {
            let server = RedisServer::start().await.map_err(harness)?;
            let floor = RedisFloor::connect(&server.url())
                .await
                .map_err(floor_err)?;
            let (proxies, hosts) = proxies(&[server.addr()]).await?;
            let traffic = Traffic {
                url: format!("redis://{}", hosts.join(",")),
                proxies,
            };
            let mut target = networked("redis", server.url(), Arc::new(floor), traffic);
            target.servers.push(Box::new(server));
            Ok(target)
        }
        "redlock" => {
            let nodes = RedisNodes::start(5).await.map_err(harness)?;
            let mut floors = Vec::new();
            for url in nodes.urls() {
                floors.push(RedisFloor::connect(&url).await.map_err(floor_err)?);
            }
            let addrs: Vec<SocketAddr> = nodes.members().iter().map(RedisServer::addr).collect();
            let (proxies, hosts) = proxies(&addrs).await?;
            let traffic = Traffic {
                url: format!("redlock://{}", hosts.join(",")),
                proxies,
            };
            let floor = Arc::new(QuorumFloor { nodes: floors });
            let mut target = networked("redlock-5", nodes.url(), floor, traffic);
            target.servers.push(Box::new(nodes));
            Ok(target)
        }
        "zookeeper" => {
            let server = ZkServer::start().await.map_err(harness)?;
            let floor = ZkFloor::connect(&server.connect_string())
                .await
                .map_err(floor_err)?;
            let (proxies, hosts) = proxies(&[server.addr()]).await?;
            let traffic = Traffic {
                url: format!("zk://{}/lockbench", hosts.join(",")),
                proxies,
            };
            let url = format!("{}/lockbench", server.url());
            let mut target = networked("zookeeper", url, Arc::new(floor), traffic);
            target.servers.push(Box::new(server));
            Ok(target)
        }
        "etcd" => {
            let server = EtcdServer::start().await.map_err(harness)?;
            let floor = EtcdFloor::connect(&[server.endpoint()])
                .await
                .map_err(floor_err)?;
            let (proxies, hosts) = proxies(&[server.addr()]).await?;
            let traffic = Traffic {
                url: format!("etcd://{}/lockbench", hosts.join(",")),
                proxies,
            };
            let url = format!("{}/lockbench", server.url());
            let mut target = networked("etcd", url, Arc::new(floor), traffic);
            target.servers.push(Box::new(server));
            Ok(target)
        }
        other => Err(format!(
            "unknown backend `{other}` (known: {})",
            BACKENDS.join(", ")
        )),
    }
}

/// RedLock's floor: the raw Redis floor on every node in parallel.
struct QuorumFloor {
    nodes: Vec<RedisFloor>,
}

#[async_trait]
impl RawFloor for QuorumFloor {
    fn describe(&self) -> String {
        format!(
            "SET NX PX + EVALSHA on {} nodes in parallel",
            self.nodes.len()
        )
    }

    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let holds = futures::future::join_all(self.nodes.iter().map(|n| n.acquire(name))).await;
        let mut token = String::new();
        for hold in holds {
            token.push_str(&hold?.token);
            token.push(' ');
        }
        Ok(RawHold {
            name: name.to_owned(),
            token,
        })
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let releases = self
            .nodes
            .iter()
            .zip(hold.token.split(' '))
            .map(|(node, token)| {
                node.release(RawHold {
                    name: hold.name.clone(),
                    token: token.to_owned(),
                })
            });
        for released in futures::future::join_all(releases).await {
            released?;
        }
        Ok(())
    }
}
