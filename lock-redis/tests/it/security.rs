//! Credentials and TLS against real servers: ACL users and `requirepass`, wrong or missing
//! passwords (clear errors that never show the password), and `rediss://` with a CA made
//! by the test.

use std::time::Duration;

use harness::tls::make_certificates;
use harness::{free_port, or_skip, RedisOptions, RedisServer};
use lock_core::{DistributedLockExt, ErrorKind, ReleaseOutcome};
use testkit::redis::raw;

const USER_PASSWORD: &str = "l0ck-Pa55-user";
const DEFAULT_PASSWORD: &str = "s3cret-Pa55-default";

async fn lock_and_release(url: &str) {
    let client = lock_core::connect(url).await.expect("connect");
    let shown = format!("{client} {client:?}");
    assert!(
        !shown.contains(USER_PASSWORD) && !shown.contains(DEFAULT_PASSWORD),
        "{shown}"
    );
    let name = format!("security/{}", uuid::Uuid::new_v4().simple());
    let guard = client
        .lock_timeout(&name, Duration::from_secs(5))
        .await
        .expect("acquire");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// An ACL user and the default user's `requirepass` both work from the URL; a wrong or
/// missing password is a clear, non-retryable configuration error without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_from_the_url_and_clear_auth_errors() {
    lock_core::raw::driver::register::<lock_redis::RedisBackend>();
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let mut admin = raw(server.addr()).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(format!(">{USER_PASSWORD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(DEFAULT_PASSWORD)
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET requirepass");
    let port = server.port();

    lock_and_release(&format!("redis://locker:{USER_PASSWORD}@127.0.0.1:{port}")).await;
    lock_and_release(&format!("redis://:{DEFAULT_PASSWORD}@127.0.0.1:{port}/2")).await;

    for (url, secret) in [
        (
            format!("redis://locker:wr0ng-Pa55@127.0.0.1:{port}"),
            "wr0ng-Pa55",
        ),
        (
            format!("redis://:wr0ng-Pa55@127.0.0.1:{port}"),
            "wr0ng-Pa55",
        ),
        (format!("redis://127.0.0.1:{port}"), DEFAULT_PASSWORD),
        (
            format!("redlock://:wr0ng-Pa55@127.0.0.1:{port}"),
            "wr0ng-Pa55",
        ),
    ] {
        let err = lock_core::connect(&url).await.expect_err("bad credentials");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        assert!(!err.is_retryable());
        let mut text = format!("{err} {err:?}");
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            text.push_str(&format!(" {s} {s:?}"));
            source = s.source();
        }
        assert!(!text.contains(secret), "{text}");
        assert!(text.contains("authentication"), "{text}");
        println!("{err}");
    }
}

/// `rediss://` with the CA from `tls_ca` locks and releases; without the CA the server's
/// certificate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca() {
    lock_core::raw::driver::register::<lock_redis::RedisBackend>();
    let certs = tempfile::tempdir().expect("tempdir");
    make_certificates(certs.path()).await;
    let tls_port = free_port().expect("port");
    let path = |f: &str| certs.path().join(f).display().to_string();
    let options = RedisOptions::default()
        .config_line(format!("tls-port {tls_port}"))
        .config_line(format!("tls-cert-file {}", path("server.pem")))
        .config_line(format!("tls-key-file {}", path("server.key")))
        .config_line(format!("tls-ca-cert-file {}", path("ca.pem")))
        .config_line("tls-auth-clients no");
    let Some(server) = or_skip(RedisServer::start_with(options).await) else {
        return;
    };

    lock_and_release(&format!(
        "rediss://127.0.0.1:{tls_port}?tls_ca={}",
        path("ca.pem")
    ))
    .await;
    lock_and_release(&format!(
        "redlock://127.0.0.1:{tls_port}?tls=true&tls_ca={}",
        path("ca.pem")
    ))
    .await;

    let err = lock_core::connect(&format!("rediss://127.0.0.1:{tls_port}"))
        .await
        .expect_err("an unknown CA is refused");
    println!("without the CA: {err}");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let err = lock_core::connect(&format!(
        "rediss://127.0.0.1:{tls_port}?tls_ca=/nonexistent/ca.pem"
    ))
    .await
    .expect_err("a missing CA file is a config error");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    drop(server);
}
