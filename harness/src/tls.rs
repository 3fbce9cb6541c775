//! Throwaway TLS certificates for the tests that serve TLS (`rediss://`, `etcds://`,
//! `zks://`), made by `openssl` in a directory the test owns: a CA, a server certificate
//! and a client certificate (for mutual TLS) for 127.0.0.1 and localhost, P-256 keys,
//! valid for one day.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::time::timeout;

/// Longest one `openssl` call may take.
const OPENSSL_LIMIT: Duration = Duration::from_secs(30);

/// The key arguments of every `openssl req` here.
const KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// Writes `ca.pem` (with `ca.key`), `server.pem` with `server.key` and `client.pem` with
/// `client.key`, signed by that CA for `IP:127.0.0.1` and `DNS:localhost` (for server and
/// for client authentication), into `dir`.
///
/// # Panics
/// When `openssl` is missing (`make deps` installs it), fails, or takes over 30 s.
pub async fn make_certificates(dir: &Path) {
    let ca = [
        "req",
        "-x509",
        "-days",
        "1",
        "-subj",
        "/CN=distlock test CA",
    ];
    openssl(
        dir,
        &[&ca[..], &KEY, &["-keyout", "ca.key", "-out", "ca.pem"]].concat(),
    )
    .await;
    sign(dir, "server", "serverAuth").await;
    sign(dir, "client", "clientAuth").await;
}

/// Writes `NAME.pem` with `NAME.key`, signed by the CA in `dir`, for `usage`.
async fn sign(dir: &Path, name: &str, usage: &str) {
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let ext = format!("{name}.ext");
    let csr_args = [
        "req",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &key,
        "-out",
        &csr,
    ];
    openssl(dir, &[&csr_args[..3], &KEY, &csr_args[3..]].concat()).await;
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage={usage}\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        ),
    )
    .expect("write the certificate extensions");
    let sign = [
        "x509",
        "-req",
        "-days",
        "1",
        "-in",
        &csr,
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-extfile",
        &ext,
        "-out",
        &pem,
    ];
    openssl(dir, &sign).await;
}

async fn openssl(dir: &Path, args: &[&str]) {
    let output = timeout(
        OPENSSL_LIMIT,
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("openssl {args:?} took over {OPENSSL_LIMIT:?}"))
    .unwrap_or_else(|err| panic!("openssl is needed for this test (make deps): {err}"));
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
