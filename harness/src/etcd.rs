//! etcd as a [`ServerKind`]: a single member ([`EtcdServer`]) and a cluster
//! ([`EtcdCluster`], 3 members by default) that agrees on a leader.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use super::clock::ClockHook;
use super::cluster::Cluster;
use super::majority;
use super::node::Node;
use super::probe::{http, json_str_field, Probe};
use super::process::{find_binary, LaunchSpec};
use super::server::{loopback, Member, Prepared, Server, ServerKind};
use super::{create_dir, HarnessError, DEFAULT_READY_TIMEOUT};

const HINT: &str = "apt-get install etcd-server";
/// Bound on one HTTP request to a member.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// Options for [`EtcdServer`] and [`EtcdCluster`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// `--heartbeat-interval`. Default: 50 ms.
    pub heartbeat_interval: Duration,
    /// `--election-timeout`. Default: 500 ms.
    pub election_timeout: Duration,
    /// Cluster size; ignored by [`EtcdServer`]. Default: 3.
    pub members: usize,
    /// Bound on the readiness wait. Default: [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Extra command-line arguments for every member. Default: none.
    pub extra_args: Vec<String>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(50),
            election_timeout: Duration::from_millis(500),
            members: 3,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            extra_args: Vec::new(),
        }
    }
}

impl EtcdOptions {
    /// Sets the Raft heartbeat interval and election timeout.
    pub fn raft_timing(mut self, heartbeat: Duration, election: Duration) -> Self {
        self.heartbeat_interval = heartbeat;
        self.election_timeout = election;
        self
    }

    /// Appends one command-line argument to [`extra_args`](Self::extra_args).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }
}

setters!(EtcdOptions {
    members: usize,
    ready_timeout: Duration,
});

/// What `POST /v3/maintenance/status` says about a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStatus {
    /// The answering member's id.
    pub member_id: u64,
    /// The leader's member id as this member knows it (0: none).
    pub leader: u64,
    /// The Raft term.
    pub raft_term: u64,
}

/// One etcd member (alone, or part of an [`EtcdCluster`]). Killed on drop.
pub type EtcdServer = Server<Etcd>;

/// An etcd cluster (3 members by default) on loopback. Killed on drop.
pub type EtcdCluster = Cluster<Etcd>;

/// The etcd kind: what a member keeps beyond its process.
#[derive(Debug)]
pub struct Etcd {
    name: String,
    peer_port: u16,
}

#[async_trait]
impl ServerKind for Etcd {
    type Options = EtcdOptions;
    type Program = PathBuf;

    const NAME: &'static str = "etcd";
    const CLUSTER: &'static str = "etcd cluster";
    const SCHEME: &'static str = "etcd";
    const CLUSTER_SCHEME: &'static str = "etcd";
    /// Client and peer ports.
    const PORTS: usize = 2;
    const ELECTS_LEADER: bool = true;
    const CLOCK_HOOK: ClockHook = ClockHook::Unreachable(
        "etcd is a Go program: it reads the clock through the kernel's vDSO, not the C \
         library, so no preloaded library (libfaketime) moves it; its leases are timed by \
         the monotonic readings of Go's clock besides",
    );

    fn find() -> Result<PathBuf, HarnessError> {
        find_binary("etcd", "ETCD_BIN", HINT)
    }

    fn members(options: &EtcdOptions) -> usize {
        options.members
    }

    fn ready_timeout(options: &EtcdOptions) -> Duration {
        options.ready_timeout
    }

    fn prepare(
        program: &PathBuf,
        options: &EtcdOptions,
        dir: &Path,
        member: Member<'_>,
    ) -> Result<Prepared<Self>, HarnessError> {
        let index = member.index.unwrap_or(0);
        let name = format!("m{}", index + 1);
        let ports = member.own_ports();
        let (client_port, peer_port) = (ports[0], ports[1]);
        let label = format!("etcd {name} 127.0.0.1:{}", client_port);
        let data_dir = dir.join("data");
        create_dir(&label, dir)?;
        let client_url = format!("http://127.0.0.1:{}", client_port);
        let peer_url = format!("http://127.0.0.1:{}", peer_port);
        let initial_cluster = member
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{}=http://127.0.0.1:{}", i + 1, p[1]))
            .collect::<Vec<_>>()
            .join(",");
        let mut args: Vec<String> = vec![
            "--name".into(),
            name.clone(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen-client-urls".into(),
            client_url.clone(),
            "--advertise-client-urls".into(),
            client_url,
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url,
            "--initial-cluster".into(),
            initial_cluster,
            "--initial-cluster-state".into(),
            "new".into(),
            "--initial-cluster-token".into(),
            cluster_token(member.ports),
            "--heartbeat-interval".into(),
            options.heartbeat_interval.as_millis().to_string(),
            "--election-timeout".into(),
            options.election_timeout.as_millis().to_string(),
            "--logger".into(),
            "zap".into(),
            "--log-outputs".into(),
            "stderr".into(),
        ];
        args.extend(options.extra_args.iter().cloned());
        let mut env = Vec::new();
        if let Some(arch) = unsupported_arch() {
            env.push(("ETCD_UNSUPPORTED_ARCH".into(), arch.into()));
        }
        let spec = LaunchSpec {
            program: program.to_owned(),
            args: args.into_iter().map(Into::into).collect(),
            env,
            cwd: dir.to_owned(),
            log: dir.join("server.log"),
            run_as: None,
            with_children: false,
        };
        let probe = Probe::EtcdHealth(loopback(client_port));
        Ok(Prepared {
            node: Node::new(label, spec, probe, options.ready_timeout),
            data_dir,
            kind: Etcd { name, peer_port },
        })
    }

    /// A majority of all members must answer, all answers must name the same leader,
    /// and the leader must be among those answering.
    async fn leader(members: &[EtcdServer], cluster: &str) -> Result<usize, HarnessError> {
        let statuses = futures::future::join_all(members.iter().map(|m| async move {
            if m.is_running() {
                m.status().await.ok()
            } else {
                None
            }
        }))
        .await;
        let answering: Vec<(usize, EtcdStatus)> = statuses
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .collect();
        let agreed = answering
            .first()
            .map(|(_, s)| s.leader)
            .filter(|l| *l != 0 && answering.iter().all(|(_, s)| s.leader == *l));
        let leader = agreed.and_then(|l| {
            answering
                .iter()
                .find(|(_, s)| s.member_id == l)
                .map(|(i, _)| *i)
        });
        match leader {
            Some(i) if answering.len() >= majority(members.len()) => Ok(i),
            _ => Err(HarnessError::Cluster {
                cluster: cluster.to_owned(),
                detail: format!("no agreed leader; status by member: {statuses:?}"),
            }),
        }
    }
}

impl Server<Etcd> {
    /// The peer (Raft) port.
    pub fn peer_port(&self) -> u16 {
        self.kind.peer_port
    }

    /// The member name (`m1`, `m2`, ...).
    pub fn name(&self) -> &str {
        &self.kind.name
    }

    /// `http://127.0.0.1:PORT`, the client endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Member id, leader id and term, from `POST /v3/maintenance/status`.
    ///
    /// # Errors
    /// [`HarnessError::Io`] if the member does not answer within 2 s or answers garbage.
    pub async fn status(&self) -> Result<EtcdStatus, HarnessError> {
        let label = self.node.label();
        let (code, body) = http(
            self.addr(),
            "POST",
            "/v3/maintenance/status",
            Some("{}"),
            HTTP_TIMEOUT,
        )
        .await
        .map_err(|e| HarnessError::io(label, "POST /v3/maintenance/status", e))?;
        let field = |f: &str| json_str_field(&body, f).and_then(|v| v.parse::<u64>().ok());
        match (code, field("member_id"), field("leader")) {
            (200, Some(member_id), Some(leader)) => Ok(EtcdStatus {
                member_id,
                leader,
                raft_term: field("raftTerm").unwrap_or(0),
            }),
            _ => Err(HarnessError::io(
                label,
                "POST /v3/maintenance/status",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("answered {code} {:?}", body.trim_end()),
                ),
            )),
        }
    }
}

impl Cluster<Etcd> {
    /// `http://127.0.0.1:PORT` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members().iter().map(EtcdServer::endpoint).collect()
    }
}

/// A cluster token unique across processes and clusters: the same for every member
/// of one cluster (they share `ports`), another for the next cluster.
fn cluster_token(ports: &[Vec<u16>]) -> String {
    let first = ports.first().map_or(0, |p| p[0]);
    format!("distlock-{}-{first}", std::process::id())
}

/// `ETCD_UNSUPPORTED_ARCH` value etcd 3.4 wants on architectures other than amd64.
fn unsupported_arch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => None,
        "aarch64" => Some("arm64"),
        "powerpc64" => Some("ppc64le"),
        other => Some(other),
    }
}
