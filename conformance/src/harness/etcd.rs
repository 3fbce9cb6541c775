//! etcd: a single member, and a cluster (3 members by default).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::probe::{http, json_str_field, Probe};
use super::process::{find_binary, log_tail, LaunchSpec, Node};
use super::{
    create_dir, first_error, free_ports, majority, temp_dir, wait_for_leader, with_port_retries,
    HarnessError, DEFAULT_READY_TIMEOUT, STOP_GRACE,
};

const HINT: &str = "apt-get install etcd-server";
/// Bound on one HTTP request to a member.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

static CLUSTER_SEQ: AtomicU64 = AtomicU64::new(0);

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

    /// Sets [`members`](Self::members).
    pub fn members(mut self, n: usize) -> Self {
        self.members = n;
        self
    }

    /// Sets [`ready_timeout`](Self::ready_timeout).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Appends one command-line argument to [`extra_args`](Self::extra_args).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }
}

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

/// Ports of one member.
#[derive(Debug, Clone, Copy)]
struct MemberPorts {
    client: u16,
    peer: u16,
}

/// One etcd member (alone, or part of an [`EtcdCluster`]). Killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    node: Node,
    name: String,
    ports: MemberPorts,
    data_dir: PathBuf,
    _dir: Option<TempDir>,
}

impl EtcdServer {
    /// Starts a single-member etcd with default options.
    ///
    /// # Errors
    /// [`HarnessError::MissingBinary`] if `etcd` is not installed (or `$ETCD_BIN` points
    /// nowhere); other variants if it does not start.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(EtcdOptions::default()).await
    }

    /// Starts a single-member etcd with `options`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: EtcdOptions) -> Result<Self, HarnessError> {
        let program = find_binary("etcd", "ETCD_BIN", HINT)?;
        with_port_retries("etcd", || async {
            let dir = temp_dir("etcd")?;
            let ports = member_ports(1)?;
            let token = cluster_token();
            let server = Self::prepare(&program, &options, dir.path(), 0, &ports, &token)?;
            server.node.launch().await?;
            Ok(Self {
                _dir: Some(dir),
                ..server
            })
        })
        .await
    }

    /// Builds member `index` of the cluster described by `all`; does not spawn.
    fn prepare(
        program: &Path,
        options: &EtcdOptions,
        dir: &Path,
        index: usize,
        all: &[MemberPorts],
        token: &str,
    ) -> Result<Self, HarnessError> {
        let name = format!("m{}", index + 1);
        let ports = all.get(index).copied().ok_or_else(|| {
            HarnessError::io(
                "etcd",
                "pick ports",
                std::io::Error::other("no ports for member"),
            )
        })?;
        let label = format!("etcd {name} 127.0.0.1:{}", ports.client);
        let data_dir = dir.join("data");
        create_dir(&label, dir)?;
        let client_url = format!("http://127.0.0.1:{}", ports.client);
        let peer_url = format!("http://127.0.0.1:{}", ports.peer);
        let initial_cluster = all
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{}=http://127.0.0.1:{}", i + 1, p.peer))
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
            token.to_owned(),
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
        };
        let probe = Probe::EtcdHealth(loopback(ports.client));
        Ok(Self {
            node: Node::new(label, spec, probe, options.ready_timeout),
            name,
            ports,
            data_dir,
            _dir: None,
        })
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.ports.client)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.ports.client
    }

    /// The peer (Raft) port.
    pub fn peer_port(&self) -> u16 {
        self.ports.peer
    }

    /// The member name (`m1`, `m2`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.ports.client)
    }

    /// `http://127.0.0.1:PORT`, the client endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.client)
    }

    /// Pid of the member, `None` when it is not running.
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// True when the process is alive and not paused.
    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// True when `GET /health` says healthy now.
    pub async fn is_ready(&self) -> bool {
        self.node.probe_once().await.is_ok()
    }

    /// The member's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        self.node.log_path()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(self.node.log_path(), lines)
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

    /// SIGKILL the member and reap it. No-op if it is not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn kill9(&self) -> Result<(), HarnessError> {
        self.node.kill9().await
    }

    /// SIGSTOP the member.
    ///
    /// # Errors
    /// [`HarnessError::NotRunning`] or a signal error.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.node.pause()
    }

    /// SIGCONT a paused member.
    ///
    /// # Errors
    /// [`HarnessError::NotRunning`] or a signal error.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.node.resume()
    }

    /// Kills the member if it runs and starts it again on the same ports and data dir;
    /// returns once it reports healthy (which needs a quorum with a leader).
    ///
    /// # Errors
    /// If the member does not come back in time.
    pub async fn restart(&self) -> Result<(), HarnessError> {
        self.node.restart(|| Ok(())).await
    }

    /// Graceful stop: SIGTERM, then SIGKILL after a grace period. No-op if not running.
    ///
    /// # Errors
    /// If the process cannot be reaped in time.
    pub async fn stop(&self) -> Result<(), HarnessError> {
        self.node.stop(STOP_GRACE).await
    }
}

/// An etcd cluster (3 members by default) on loopback. Killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
    label: String,
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts a 3-member cluster with default options; returns once every member is
    /// healthy and they agree on a leader.
    ///
    /// # Errors
    /// As [`EtcdServer::start`], or [`HarnessError::Cluster`] if no leader is agreed in time.
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(EtcdOptions::default()).await
    }

    /// Starts a cluster of `options.members` members.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with(options: EtcdOptions) -> Result<Self, HarnessError> {
        let program = find_binary("etcd", "ETCD_BIN", HINT)?;
        let n = options.members.max(1);
        with_port_retries("etcd cluster", || Self::try_start(&program, &options, n)).await
    }

    async fn try_start(
        program: &Path,
        options: &EtcdOptions,
        n: usize,
    ) -> Result<Self, HarnessError> {
        let dir = temp_dir("etcd-cluster")?;
        let ports = member_ports(n)?;
        let token = cluster_token();
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let member_dir = dir.path().join(format!("m{}", i + 1));
            members.push(EtcdServer::prepare(
                program,
                options,
                &member_dir,
                i,
                &ports,
                &token,
            )?);
        }
        let label = format!(
            "etcd cluster {}",
            members
                .iter()
                .map(|m| format!("127.0.0.1:{}", m.ports.client))
                .collect::<Vec<_>>()
                .join(",")
        );
        let cluster = Self {
            members,
            label,
            _dir: dir,
        };
        let started = Instant::now();
        let mut offsets = Vec::with_capacity(n);
        for m in &cluster.members {
            offsets.push(m.node.spawn()?);
        }
        let results = futures::future::join_all(
            cluster
                .members
                .iter()
                .zip(offsets)
                .map(|(m, offset)| m.node.wait_ready(offset)),
        )
        .await;
        first_error(results)?;
        let remaining = options.ready_timeout.saturating_sub(started.elapsed());
        cluster
            .wait_for_leader(remaining.max(Duration::from_secs(5)))
            .await?;
        Ok(cluster)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the cluster has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i` (0-based; named `m{i+1}`).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,...` (every member, also stopped ones).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.ports.client))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// `http://127.0.0.1:PORT` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// Kills every member that runs and starts all of them again concurrently, on the
    /// same ports and data dirs (one member alone cannot be healthy without a quorum);
    /// returns once every member is healthy and they agree on a leader.
    ///
    /// # Errors
    /// If a member does not come back or no leader is agreed in time.
    pub async fn restart_all(&self) -> Result<(), HarnessError> {
        futures::future::try_join_all(self.members.iter().map(EtcdServer::restart)).await?;
        self.wait_for_leader(DEFAULT_READY_TIMEOUT)
            .await
            .map(|_| ())
    }

    /// The current leader's index, asking every running member: a majority of all
    /// members must answer, all answers must name the same leader, and the leader must
    /// be among those answering.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] when that is not the case right now.
    pub async fn leader(&self) -> Result<usize, HarnessError> {
        let statuses = futures::future::join_all(self.members.iter().map(|m| async move {
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
            Some(i) if answering.len() >= majority(self.members.len()) => Ok(i),
            _ => Err(HarnessError::Cluster {
                cluster: self.label.clone(),
                detail: format!("no agreed leader; status by member: {statuses:?}"),
            }),
        }
    }

    /// Polls [`leader`](Self::leader) until it succeeds, for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if no leader shows up in time.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, HarnessError> {
        self.wait_for_leader_other_than(None, timeout).await
    }

    /// Polls until a leader other than member `old` is agreed, for at most `timeout`.
    ///
    /// # Errors
    /// [`HarnessError::Cluster`] with the last observation if none shows up in time.
    pub async fn wait_for_new_leader(
        &self,
        old: usize,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        self.wait_for_leader_other_than(Some(old), timeout).await
    }

    async fn wait_for_leader_other_than(
        &self,
        old: Option<usize>,
        timeout: Duration,
    ) -> Result<usize, HarnessError> {
        wait_for_leader(&self.label, old, timeout, || self.leader()).await
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // Kill all first; each member's own drop then only reaps.
        for m in &self.members {
            m.node.kill_now();
        }
    }
}

fn member_ports(n: usize) -> Result<Vec<MemberPorts>, HarnessError> {
    Ok(free_ports(2 * n)?
        .chunks_exact(2)
        .map(|c| MemberPorts {
            client: c[0],
            peer: c[1],
        })
        .collect())
}

/// A cluster token unique across processes and within this one.
fn cluster_token() -> String {
    format!(
        "distlock-{}-{}-{:08x}",
        std::process::id(),
        CLUSTER_SEQ.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    )
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

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}
