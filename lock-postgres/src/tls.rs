//! TLS for `postgres://` (`sslmode=`), on rustls with the aws-lc-rs provider (the
//! workspace's one provider; none is installed process-wide), through
//! `tokio-postgres-rustls`'s connector, which also gives SCRAM its channel binding.
//!
//! What is checked follows libpq:
//!
//! | `sslmode` | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (`allow`) | when the server offers it | the chain, when a CA is given; else none |
//! | `require` | always | the chain, when a CA is given; else none |
//! | `verify-ca` | always | the chain (a CA is needed), not the host name |
//! | `verify-full` | always | the chain (a CA is needed) and the host name |
//!
//! The CA (`sslrootcert`, `ca_file`), client certificate and key (`sslcert`, `sslkey`)
//! are read from their PEM files off the runtime threads, each time a client opens, and
//! checked then (each parses, the key matches its certificate): a bad file is
//! [`Error::InvalidConfig`] before any connection.

use std::path::Path;
use std::sync::Arc;

use lock_core::raw::plumbing::read_config_file;
use lock_core::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{PostgresConfig, SslMode};

/// The connector every connection of a client uses (the pool's, the listening and the
/// holding ones): [`Connector::make`]. With `sslmode=disable` it is never called.
#[derive(Clone)]
pub(crate) struct Connector(MakeRustlsConnect);

impl Connector {
    /// The connector, for one connection attempt or the pool.
    pub(crate) fn make(&self) -> MakeRustlsConnect {
        self.0.clone()
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

/// The connector for `config`: reads and checks its TLS files.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the option whose file is unreadable or malformed, or a
/// key that does not match its certificate; never quoting a key.
pub(crate) async fn connector(config: &PostgresConfig) -> Result<Connector> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|err| Error::config(format!("no TLS version to offer: {err}")))?;
    if config.sslmode == SslMode::Disable {
        return Ok(Connector(MakeRustlsConnect::new(
            builder
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth(),
        )));
    }
    let roots = match &config.ca_file {
        Some(path) => Some(roots("sslrootcert", path).await?),
        None => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (config.sslmode, roots) {
        (SslMode::VerifyFull, Some(roots)) => webpki(roots, &provider)?,
        (_, Some(roots)) => Arc::new(AnyName(webpki(roots, &provider)?)),
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(Error::config(crate::config::NEEDS_CA));
        }
        (_, None) => Arc::new(Unchecked(provider)),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let tls = match (&config.cert_file, &config.key_file) {
        (Some(cert_path), Some(key_path)) => {
            let cert = read_config_file("sslcert", cert_path).await?;
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|err| malformed("sslcert", cert_path, &err.to_string()))?;
            if chain.is_empty() {
                return Err(malformed("sslcert", cert_path, "holds no PEM certificate"));
            }
            let key = read_config_file("sslkey", key_path).await?;
            // The parser's errors may quote a line of the file: never shown for the key.
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|_| malformed("sslkey", key_path, "holds no PEM private key"))?;
            builder.with_client_auth_cert(chain, key).map_err(|_| {
                malformed(
                    "sslkey",
                    key_path,
                    "is not the private key of sslcert (or of a kind TLS cannot use)",
                )
            })?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(Error::config(crate::config::NEEDS_PAIR)),
    };
    Ok(Connector(MakeRustlsConnect::new(tls)))
}

/// The CA certificates of the PEM file at `path`.
async fn roots(what: &str, path: &Path) -> Result<RootCertStore> {
    let pem = read_config_file(what, path).await?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|err| malformed(what, path, &err.to_string()))?;
        roots
            .add(cert)
            .map_err(|err| malformed(what, path, &err.to_string()))?;
    }
    if roots.is_empty() {
        return Err(malformed(what, path, "holds no PEM certificate"));
    }
    Ok(roots)
}

fn webpki(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|err| Error::config(format!("the TLS CA cannot be used: {err}")))
}

fn malformed(what: &str, path: &Path, why: &str) -> Error {
    Error::config(format!("{what} {} {why}", path.display()))
}

/// `verify-ca` (and `require`/`prefer` given a CA): the chain up to the CA, as webpki
/// checks it, whatever names the certificate is for. webpki checks the name last, after
/// the chain, so "not valid for this name" means the chain was good.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` and `prefer` without a CA, as libpq: the session is encrypted, the server's
/// certificate not checked (the handshake's signatures still are, so the session is with
/// the holder of the certificate's key, whoever that is).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Whether `err` (a client error's cause chain) is a TLS session refused for its
/// certificates: the server's not trusted, or the client's refused by the server.
pub(crate) fn refused<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(err);
    while let Some(err) = next {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return matches!(
                tls,
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::AlertReceived(_)
                    | rustls::Error::NoCertificatesPresented
                    | rustls::Error::InvalidCertRevocationList(_)
            )
            .then_some(tls);
        }
        next = err.source();
    }
    None
}
