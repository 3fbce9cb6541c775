//! TLS for `zks://`: the client's certificate options, read from their PEM files and
//! checked (each file parses, the key matches its certificate) before any connection,
//! and a probe that tells why servers refused the TLS session.
//!
//! The ZooKeeper client retries a failed handshake like any connection loss and never
//! says why it failed; so when a round over every server fails, [`Tls::refusal`] does
//! one handshake of its own with the same certificates and turns a certificate the
//! client does not trust, or a server refusing the client's, into a typed error at once.

use std::path::Path;
use std::sync::Arc;

use lock_core::raw::plumbing::read_config_file;
use lock_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zookeeper_client as zk;

use crate::config::{ZkConfig, NEEDS_CA};

/// Longest answer the probe reads (a `srvr` answer is a few hundred bytes).
const PROBE_READ: u64 = 4096;

/// The TLS settings of one session attempt. `Debug` shows none of them (they hold the
/// client's key).
pub(crate) struct Tls {
    /// For the ZooKeeper client.
    pub(crate) options: zk::TlsOptions,
    /// The same trust and identity, for [`Tls::refusal`].
    probe: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// The TLS settings of `config`, or `None` for plain `zk://`. Reads the files off the
    /// runtime threads, every time (a re-established session picks up renewed files).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the option whose file is unreadable or malformed,
    /// or a key that does not match its certificate; never quoting a key.
    pub(crate) async fn of(config: &ZkConfig) -> Result<Option<Tls>> {
        if !config.tls {
            return Ok(None);
        }
        let Some(ca_path) = &config.ca_file else {
            return Err(Error::config(NEEDS_CA));
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let ca = read("ca_file", ca_path).await?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            let cert = cert.map_err(|err| malformed("ca_file", ca_path, &err.to_string()))?;
            roots
                .add(cert)
                .map_err(|err| malformed("ca_file", ca_path, &err.to_string()))?;
        }
        if roots.is_empty() {
            return Err(malformed("ca_file", ca_path, "holds no PEM certificate"));
        }
        let mut options = zk::TlsOptions::new()
            .with_pem_ca(&ca)
            .map_err(|err| malformed("ca_file", ca_path, &err.to_string()))?;
        let probe = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|err| Error::config(format!("no TLS version to offer: {err}")))?
            .with_root_certificates(roots);
        let probe = match (&config.cert_file, &config.key_file) {
            (Some(cert_path), Some(key_path)) => {
                let cert = read("cert_file", cert_path).await?;
                let key = read("key_file", key_path).await?;
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|err| malformed("cert_file", cert_path, &err.to_string()))?;
                if chain.is_empty() {
                    return Err(malformed(
                        "cert_file",
                        cert_path,
                        "holds no PEM certificate",
                    ));
                }
                // The parser's errors may quote a line of the file: never shown for the key.
                let parsed = PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|_| malformed("key_file", key_path, "holds no PEM private key"))?;
                let mismatch = |_| {
                    malformed(
                        "key_file",
                        key_path,
                        "is not the private key of cert_file (or of a kind TLS cannot use)",
                    )
                };
                options = options
                    .with_pem_identity(&cert, &key)
                    .map_err(|_| malformed("key_file", key_path, "was refused by the client"))?;
                // Also checks that the key is the certificate's.
                probe
                    .with_client_auth_cert(chain, parsed)
                    .map_err(mismatch)?
            }
            _ => probe.with_no_client_auth(),
        };
        Ok(Some(Tls {
            options,
            probe: Arc::new(probe),
        }))
    }

    /// Why the servers `endpoints` (`host:port`) refuse the TLS session, if a handshake
    /// with them says so: a server certificate this client does not trust, or a client
    /// certificate (or none) the server does not accept. `None` when every handshake
    /// works or fails otherwise (a server down, a port that does not speak TLS).
    pub(crate) async fn refusal(&self, endpoints: &[String]) -> Option<Error> {
        for endpoint in endpoints {
            if let Err(err) = self.handshake(endpoint).await {
                let refused = err
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|tls| {
                        matches!(
                            tls,
                            rustls::Error::InvalidCertificate(_)
                                | rustls::Error::AlertReceived(_)
                                | rustls::Error::NoCertificatesPresented
                                | rustls::Error::InvalidCertRevocationList(_)
                        )
                    });
                if refused {
                    return Some(Error::InvalidConfig {
                        message: format!("TLS with ZooKeeper at {endpoint} was refused: {err}"),
                        source: Some(Box::new(err)),
                    });
                }
            }
        }
        None
    }

    /// One TLS session with `endpoint`: the handshake, then a `srvr` four-letter word and
    /// its answer (a server refuses a client certificate after the client's side of a
    /// TLS 1.3 handshake is done, so only a read shows it). Unbounded: callers bound it.
    async fn handshake(&self, endpoint: &str) -> std::io::Result<()> {
        let host = endpoint.rsplit_once(':').map_or(endpoint, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?;
        let tcp = TcpStream::connect(endpoint).await?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.probe));
        let mut stream = connector.connect(name, tcp).await?;
        stream.write_all(b"srvr").await?;
        let mut answer = Vec::new();
        (&mut stream)
            .take(PROBE_READ)
            .read_to_end(&mut answer)
            .await?;
        Ok(())
    }
}

/// The contents of the file of option `what`, as text.
async fn read(what: &'static str, path: &Path) -> Result<String> {
    String::from_utf8(read_config_file(what, path).await?)
        .map_err(|_| malformed(what, path, "is not UTF-8 text (PEM)"))
}

fn malformed(what: &str, path: &Path, why: &str) -> Error {
    Error::config(format!("{what} {} {why}", path.display()))
}
