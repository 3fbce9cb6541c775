//! TLS (`sslmode=`) against real servers serving TLS with a CA made by the test: every
//! mode that should work locks and unlocks, over TLS on every connection of the client;
//! an untrusted certificate, a missing CA, a plain session where only TLS is taken and
//! TLS asked of a server without it are clear configuration errors (not retried), none
//! of them showing the password; a client certificate where the server asks for one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use harness::tls::make_certificates;
use harness::{or_skip, PostgresOptions, PostgresServer};
use lock_core::{DistributedLock, DistributedLockExt, Error, ErrorKind, ReleaseOutcome};
use tokio::process::Command;

const PASSWORD: &str = "s3cret-Pa55-pg";

fn register() {
    lock_core::raw::driver::register::<lock_postgres::PostgresBackend>();
}

/// A server taking TCP sessions over TLS only, serving the certificates in `certs`.
async fn tls_only_server(certs: &Path) -> Option<PostgresServer> {
    let options = PostgresOptions::default().tls(certs).tls_only(true);
    or_skip(PostgresServer::start_with(options).await)
}

/// `postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres?QUERY` (the server trusts every
/// session: the password is there to be hidden).
fn url(server: &PostgresServer, query: &str) -> String {
    format!(
        "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres?request_timeout=5s&{query}",
        server.port()
    )
}

fn path(dir: &Path, file: &str) -> String {
    dir.join(file).display().to_string()
}

/// Connects to `url`, locks and unlocks a name; the client.
async fn lock_and_unlock(url: &str) -> Arc<dyn DistributedLock> {
    let client = lock_core::connect(url).await.expect("connect");
    let shown = format!("{client} {client:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    let name = format!("security/{}", uuid::Uuid::new_v4().simple());
    let guard = client
        .lock_timeout(&name, Duration::from_secs(5))
        .await
        .expect("acquire");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    client
}

/// Connecting to `url` fails; the error, with its sources, shown in full.
async fn refused(url: &str) -> (Error, String) {
    let err = lock_core::connect(url).await.expect_err(url);
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    assert!(!text.contains(PASSWORD), "{text}");
    println!("{err}");
    (err, text)
}

/// How many of the clients' sessions (`distlock…`) the server has, and how many of
/// them are over TLS.
async fn client_sessions(server: &PostgresServer) -> (i64, i64) {
    let row = server
        .query(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'distlock%'",
        )
        .await
        .expect("query");
    let number = |i: usize| {
        row[0][i]
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("a count")
    };
    (number(0), number(1))
}

/// A temp dir with a CA and the certificates it signed (`harness`'s `make_certificates`).
async fn certificates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    make_certificates(dir.path()).await;
    dir
}

/// `verify-full` with the CA: locks and unlocks, and every connection of the client (its
/// pool, its listening one, its advisory-lock holding one) is over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_ca_locks_over_tls_on_every_connection() {
    register();
    let certs = certificates().await;
    let Some(server) = tls_only_server(certs.path()).await else {
        return;
    };
    let ca = path(certs.path(), "ca.pem");
    let client = lock_and_unlock(&url(
        &server,
        &format!("sslmode=verify-full&sslrootcert={ca}&advisory_locks=on"),
    ))
    .await;
    // The listening connection comes up on its own: wait for pool + listener + holder.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let (all, tls) = loop {
        let (all, tls) = client_sessions(&server).await;
        if all >= 3 || tokio::time::Instant::now() > deadline {
            break (all, tls);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(all >= 3, "{all} client sessions");
    assert_eq!(tls, all, "every client session is over TLS");
    drop(client);
    // The workspace's name for the CA, and `verify-ca`, do too.
    lock_and_unlock(&url(&server, &format!("sslmode=verify-ca&ca_file={ca}"))).await;
}

/// `require` and `prefer` need no CA (as libpq: the certificate is then not checked) and
/// use TLS (the server takes nothing else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_and_prefer_without_a_ca() {
    register();
    let certs = certificates().await;
    let Some(server) = tls_only_server(certs.path()).await else {
        return;
    };
    lock_and_unlock(&url(&server, "sslmode=require")).await;
    lock_and_unlock(&url(&server, "sslmode=prefer")).await;
}

/// An unknown CA is refused by `verify-full` (and by `require` given that CA, which then
/// checks the chain, as libpq); `verify-full` without a CA is refused before connecting.
/// Both are `InvalidConfig`: retrying cannot help, a setting must change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_without_the_right_ca_is_refused() {
    register();
    let certs = certificates().await;
    let other = certificates().await;
    let Some(server) = tls_only_server(certs.path()).await else {
        return;
    };
    let wrong_ca = path(other.path(), "ca.pem");
    for mode in ["verify-full", "verify-ca", "require"] {
        let (err, text) = refused(&url(
            &server,
            &format!("sslmode={mode}&sslrootcert={wrong_ca}"),
        ))
        .await;
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{mode}: {text}");
        assert!(!err.is_retryable());
        assert!(err.to_string().contains("TLS"), "{mode}: {err}");
        // Both test CAs have one subject: the chain fails on the signature.
        assert!(text.contains("invalid peer certificate"), "{mode}: {text}");
    }
    let (err, _) = refused(&url(&server, "sslmode=verify-full")).await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("sslrootcert"), "{err}");
    let (err, _) = refused(&url(
        &server,
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ))
    .await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}

/// A server certificate for another host name: `verify-ca` takes it (chain only),
/// `verify-full` refuses it (name checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_checks_the_host_name_and_verify_ca_does_not() {
    register();
    let certs = certificates().await;
    // Re-sign the server certificate for a name that is not 127.0.0.1.
    let ext = certs.path().join("elsewhere.ext");
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
         extendedKeyUsage=serverAuth\nsubjectAltName=DNS:elsewhere.invalid\n",
    )
    .expect("write ext");
    let status = Command::new("openssl")
        .args([
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "elsewhere.ext",
            "-out",
            "server.pem",
        ])
        .current_dir(certs.path())
        .output()
        .await
        .expect("openssl");
    assert!(status.status.success(), "{status:?}");
    let Some(server) = tls_only_server(certs.path()).await else {
        return;
    };
    let ca = path(certs.path(), "ca.pem");
    lock_and_unlock(&url(
        &server,
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .await;
    let (err, text) = refused(&url(
        &server,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{text}");
    assert!(text.contains("NotValidForName"), "{text}");
}

/// `disable` where only TLS is taken: the server's refusal (`pg_hba.conf`), a clear
/// `InvalidConfig`; `require` of a server without TLS: `InvalidConfig` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_where_tls_is_required_and_tls_where_there_is_none() {
    register();
    let certs = certificates().await;
    let Some(server) = tls_only_server(certs.path()).await else {
        return;
    };
    let (err, text) = refused(&url(&server, "sslmode=disable")).await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{text}");
    assert!(err.to_string().contains("no encryption"), "{err}");
    drop(server);

    let Some(plain) = or_skip(PostgresServer::start().await) else {
        return;
    };
    let (err, text) = refused(&url(&plain, "sslmode=require")).await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{text}");
    assert!(err.to_string().contains("does not offer TLS"), "{err}");
    // prefer falls back to plain.
    lock_and_unlock(&url(&plain, "sslmode=prefer")).await;
}

/// A server that asks for a client certificate: `sslcert`/`sslkey` (the CA signed) are
/// let in; without them the server refuses the session (`InvalidConfig`); a key that is
/// not the certificate's is refused before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_where_the_server_asks_for_one() {
    register();
    let certs = certificates().await;
    let options = PostgresOptions::default()
        .tls(certs.path())
        .tls_only(true)
        .client_certificates(true);
    let Some(server) = or_skip(PostgresServer::start_with(options).await) else {
        return;
    };
    let (ca, cert, key) = (
        path(certs.path(), "ca.pem"),
        path(certs.path(), "client.pem"),
        path(certs.path(), "client.key"),
    );
    lock_and_unlock(&url(
        &server,
        &format!("sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"),
    ))
    .await;
    lock_and_unlock(&url(
        &server,
        &format!("sslmode=require&cert_file={cert}&key_file={key}"),
    ))
    .await;
    let (err, text) = refused(&url(
        &server,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{text}");
    let wrong_key = path(certs.path(), "server.key");
    let (err, text) = refused(&url(
        &server,
        &format!("sslmode=require&sslcert={cert}&sslkey={wrong_key}"),
    ))
    .await;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{text}");
    assert!(err.to_string().contains("not the private key"), "{err}");
}
