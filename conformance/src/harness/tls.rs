//! Throwaway TLS certificates for the tests that serve TLS (`rediss://`, `etcds://`),
//! made by `openssl` in a directory the test owns: a CA and a server certificate for
//! 127.0.0.1 and localhost, P-256 keys, valid for one day.

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

/// Writes `ca.pem` (with `ca.key`), and `server.pem` with `server.key`, signed by that CA
/// for `IP:127.0.0.1` and `DNS:localhost`, into `dir`.
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
    let csr = ["req", "-subj", "/CN=localhost"];
    let csr_out = ["-keyout", "server.key", "-out", "server.csr"];
    openssl(dir, &[&csr[..], &KEY, &csr_out].concat()).await;
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n\
         subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write the certificate extensions");
    let sign = [
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
        "server.ext",
        "-out",
        "server.pem",
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
