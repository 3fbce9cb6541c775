//! TLS for `etcds://`: the CA, client certificate and key files of the configuration, read
//! off the runtime threads, as the etcd client's TLS options.

use etcd_client::{Certificate, Identity, TlsOptions};
use lock_core::{Error, Result};

use crate::config::EtcdConfig;

/// Reads the TLS files off the runtime threads and builds the TLS options.
pub(crate) async fn tls_options(config: &EtcdConfig) -> Result<TlsOptions> {
    let read = |path: Option<std::path::PathBuf>, what: &'static str| async move {
        let Some(path) = path else {
            return Ok(None);
        };
        let shown = path.display().to_string();
        let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
            .await
            .map_err(|err| Error::InvalidConfig {
                message: format!("reading the {what} failed"),
                source: Some(Box::new(err)),
            })?
            .map_err(|err| Error::InvalidConfig {
                message: format!("cannot read the {what} {shown}"),
                source: Some(Box::new(err)),
            })?;
        Ok::<_, Error>(Some(bytes))
    };
    let ca = read(config.ca_file.clone(), "CA file (ca_file)").await?;
    let cert = read(config.cert_file.clone(), "client certificate (cert_file)").await?;
    let key = read(config.key_file.clone(), "client key (key_file)").await?;
    let mut tls = TlsOptions::new();
    tls = match ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
        None => tls.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (cert, key) {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    if let Some(domain) = &config.tls_domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(tls)
}
