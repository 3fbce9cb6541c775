//! TLS for `zks://`: the client's certificate options, read from their PEM files and
//! checked (each file parses, the key matches its certificate) before any connection.

use std::path::Path;

use lock_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use zookeeper_client as zk;

use crate::config::{ZkConfig, NEEDS_CA};

/// The TLS options of `config`, or `None` for plain `zk://`. Reads the files off the
/// runtime threads, every time (a re-established session picks up renewed files).
///
/// # Errors
/// [`Error::InvalidConfig`] naming the option whose file is unreadable or malformed,
/// or a key that does not match its certificate; never quoting a key.
pub(crate) async fn options(config: &ZkConfig) -> Result<Option<zk::TlsOptions>> {
    if !config.tls {
        return Ok(None);
    }
    // Several rustls providers may be compiled in; pick one explicitly (a no-op when the
    // process already chose).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(ca_path) = &config.ca_file else {
        return Err(Error::config(NEEDS_CA));
    };
    let ca = read("ca_file", ca_path).await?;
    if CertificateDer::pem_slice_iter(ca.as_bytes())
        .next()
        .is_none()
    {
        return Err(malformed("ca_file", ca_path, "holds no PEM certificate"));
    }
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|err| malformed("ca_file", ca_path, &err.to_string()))?;
    if let (Some(cert_path), Some(key_path)) = (&config.cert_file, &config.key_file) {
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
        let provider = rustls::crypto::ring::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, parsed, &provider).map_err(|_| {
            malformed(
                "key_file",
                key_path,
                "is not the private key of cert_file (or of a kind TLS cannot use)",
            )
        })?;
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|_| malformed("key_file", key_path, "was refused by the client"))?;
    }
    Ok(Some(options))
}

/// The contents of the file of option `what`.
async fn read(what: &'static str, path: &Path) -> Result<String> {
    let owned = path.to_owned();
    let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(owned))
        .await
        .map_err(|err| Error::InvalidConfig {
            message: format!("reading {what} {} failed", path.display()),
            source: Some(Box::new(err)),
        })?;
    read.map_err(|err| Error::InvalidConfig {
        message: format!("cannot read {what} {}", path.display()),
        source: Some(Box::new(err)),
    })
}

fn malformed(what: &str, path: &Path, why: &str) -> Error {
    Error::config(format!("{what} {} {why}", path.display()))
}
