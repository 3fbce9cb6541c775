//! `etcds://`: TLS to a real etcd serving HTTPS with a throwaway CA.
//!
//! The harness serves plain HTTP only, so this test launches its own single member on
//! free loopback ports, with certificates made by `openssl` in a temporary directory.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use harness::free_ports;
use harness::tls::make_certificates;
use lock_core::{DistributedLockExt, ErrorKind, ReleaseOutcome};
use tokio::process::{Child, Command};
use tokio::time::{sleep, Instant};

/// etcd serving HTTPS on `client_port`; killed on drop.
fn start_tls_etcd(dir: &Path, client_port: u16, peer_port: u16) -> Child {
    let client_url = format!("https://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    Command::new("etcd")
        .args([
            "--name",
            "tls",
            "--data-dir",
            &dir.join("data").display().to_string(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("tls={peer_url}"),
            "--cert-file",
            &dir.join("server.pem").display().to_string(),
            "--key-file",
            &dir.join("server.key").display().to_string(),
            "--log-outputs",
            "stderr",
            "--logger",
            "zap",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("etcd (Debian etcd-server) is needed for this test")
}

/// `etcds://` with the CA from `ca_file` locks over TLS; without trusting that CA the
/// connection fails with a connection error (the server is not trusted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_locks_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    make_certificates(dir.path()).await;
    let ports = free_ports(2).expect("free ports");
    let mut etcd = start_tls_etcd(dir.path(), ports[0], ports[1]);
    lock_core::raw::driver::register::<lock_etcd::EtcdBackend>();
    let ca = dir.path().join("ca.pem").display().to_string();
    let url = format!("etcds://127.0.0.1:{}/tls?ttl=5s&ca_file={ca}", ports[0]);

    // Wait (bounded) for the member to serve: connecting fails fast until it does.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (_locks, guard) = loop {
        let attempt = match lock_core::connect(&url).await {
            Ok(locks) => {
                let got = locks.try_lock("tls").await;
                got.map(|got| got.map(|guard| (locks, guard)))
            }
            Err(err) => Err(err),
        };
        match attempt {
            Ok(Some(held)) => break held,
            Ok(None) => panic!("a fresh server has the lock held"),
            Err(err) => {
                assert!(
                    Instant::now() < deadline,
                    "etcd over TLS never served: {err}"
                );
                assert!(
                    etcd.try_wait().expect("etcd status").is_none(),
                    "etcd exited"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(guard.fencing_token().get() > 0);
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    // Same server, no trusted CA: the handshake fails, at connect.
    let err = lock_core::connect(&format!("etcds://127.0.0.1:{}/tls", ports[0]))
        .await
        .expect_err("an untrusted server is refused");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");

    // Plain etcd:// to a TLS port fails too, with an error rather than a hang.
    assert!(lock_core::connect(&format!(
        "etcd://127.0.0.1:{}/tls?request_timeout=2s",
        ports[0]
    ))
    .await
    .is_err());
    drop(etcd.kill().await);
}
