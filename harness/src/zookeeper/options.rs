//! What a ZooKeeper server or ensemble is started with: [`ZkOptions`], and the
//! certificates of one that serves TLS ([`ZkTls`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::tls::make_certificates;
use crate::{temp_dir, write_file, HarnessError, DEFAULT_READY_TIMEOUT};

/// Options for [`ZkServer`](super::ZkServer) and [`ZkEnsemble`](super::ZkEnsemble).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZkOptions {
    /// `tickTime`. Default: 500 ms.
    pub tick_time: Duration,
    /// `syncLimit` in ticks: how long a follower serves without hearing from its leader
    /// (and a leader without a quorum) before it gives up. Default: 5.
    pub sync_limit: u32,
    /// `minSessionTimeout`. Default: 1 s.
    pub min_session_timeout: Duration,
    /// `maxSessionTimeout`. Default: 60 s.
    pub max_session_timeout: Duration,
    /// JVM maximum heap in MiB (`-Xmx`). Default: 256.
    pub heap_mb: u32,
    /// Ensemble size (odd); ignored by [`ZkServer`](super::ZkServer). Default: 3.
    pub members: usize,
    /// Bound on the readiness wait. Default: [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// Ensemble only: every member reaches each peer's quorum port through a fault proxy
    /// of the ensemble, so that [`ZkEnsemble::partition`](super::ZkEnsemble::partition) can cut a member off from its
    /// peers while its clients still reach it. Default: off.
    pub peer_links: bool,
    /// Serve TLS on a secure client port too ([`ZkServer::secure_port`](super::ZkServer::secure_port)), beside the
    /// plain one. Default: none.
    pub tls: Option<ZkTls>,
    /// Start on a wall clock the harness moves ([`ZkServer::jump_clock`](super::ZkServer::jump_clock)):
    /// `System.currentTimeMillis` follows it, `System.nanoTime` (which times sessions)
    /// does not. Default: off (the machine's clock).
    pub movable_clock: bool,
}

impl Default for ZkOptions {
    fn default() -> Self {
        Self {
            tick_time: Duration::from_millis(500),
            sync_limit: 5,
            min_session_timeout: Duration::from_secs(1),
            max_session_timeout: Duration::from_secs(60),
            heap_mb: 256,
            members: 3,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            peer_links: false,
            tls: None,
            movable_clock: false,
        }
    }
}

impl ZkOptions {
    /// Sets the session timeout bounds.
    pub fn session_timeouts(mut self, min: Duration, max: Duration) -> Self {
        self.min_session_timeout = min;
        self.max_session_timeout = max;
        self
    }

    /// Sets [`tls`](Self::tls).
    pub fn tls(mut self, tls: ZkTls) -> Self {
        self.tls = Some(tls);
        self
    }
}

setters!(ZkOptions {
    tick_time: Duration,
    sync_limit: u32,
    peer_links: bool,
    members: usize,
    ready_timeout: Duration,
    movable_clock: bool,
});

/// Certificates for a ZooKeeper serving TLS ([`ZkOptions::tls`]): a throwaway CA, a
/// server certificate and a client certificate it signed (see
/// [`crate::tls::make_certificates`]), in a temp dir that lives as
/// long as a clone of this. ZooKeeper serves them with Netty
/// (`serverCnxnFactory=NettyServerCnxnFactory`) from PEM key and trust stores.
#[derive(Debug, Clone)]
pub struct ZkTls {
    dir: Arc<tempfile::TempDir>,
    client_auth: bool,
}

impl ZkTls {
    /// Makes the certificates; the server asks for no client certificate.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the files cannot be written.
    ///
    /// # Panics
    /// When `openssl` is missing or fails (see
    /// [`crate::tls::make_certificates`]).
    pub async fn make() -> Result<Self, HarnessError> {
        let dir = temp_dir("zookeeper-tls")?;
        make_certificates(dir.path()).await;
        // A PEM key store is the key followed by its certificate, in one file.
        let read = |name: &str| {
            let path = dir.path().join(name);
            std::fs::read_to_string(&path).map_err(|e| {
                HarnessError::io("zookeeper tls", format!("read {}", path.display()), e)
            })
        };
        let store = read("server.key")? + &read("server.pem")?;
        write_file(
            "zookeeper tls",
            &dir.path().join("server-store.pem"),
            &store,
        )?;
        Ok(Self {
            dir: Arc::new(dir),
            client_auth: false,
        })
    }

    /// Requires a client certificate signed by the CA (`ssl.clientAuth=need`), or not.
    pub fn client_auth(mut self, need: bool) -> Self {
        self.client_auth = need;
        self
    }

    /// The CA certificate (PEM): a client's `ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The client certificate (PEM): a client's `cert_file`.
    pub fn cert_file(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client certificate's key (PEM): a client's `key_file`.
    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The `zoo.cfg` lines serving TLS on `port`.
    pub(super) fn config_lines(&self, port: u16) -> String {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        format!(
            "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
             ssl.clientAuth={}\n",
            path("server-store.pem"),
            path("ca.pem"),
            if self.client_auth { "need" } else { "none" },
        )
    }
}
