//! Connecting fails fast: with nothing listening, or a listener that never answers, the
//! connect itself fails with a retryable [`ErrorKind::Connection`] within the request
//! timeout (no server needed).

use std::time::Duration;

use lock_core::{Error, ErrorKind};
use tokio::net::TcpListener;
use tokio::time::{timeout, Instant};

/// The request timeout of these tests.
const LIMIT: Duration = Duration::from_secs(2);

/// Slack on top of [`LIMIT`] for scheduling on a loaded machine.
const SLACK: Duration = Duration::from_secs(1);

/// A loopback port with nothing listening on it.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local address").port();
    drop(listener);
    port
}

/// A loopback listener that accepts connections and never reads nor answers; it and its
/// connections live until the task is aborted.
async fn silent_listener() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a free port");
    let port = listener.local_addr().expect("local address").port();
    let task = tokio::spawn(async move {
        let mut accepted = Vec::new();
        // Bounded: the test aborts the task long before this many connections.
        while accepted.len() < 1000 {
            match listener.accept().await {
                Ok((socket, _)) => accepted.push(socket),
                Err(_) => break,
            }
        }
    });
    (port, task)
}

/// Connects to `url` (a request timeout of [`LIMIT`] is appended) and checks that the
/// connect fails with a retryable connection error within the limit.
async fn connect_fails_fast(url: &str) -> Error {
    lock_core::raw::register::<lock_etcd::EtcdBackend>();
    let url = format!("{url}?request_timeout={}ms", LIMIT.as_millis());
    let started = Instant::now();
    let connected = timeout(LIMIT * 5, lock_core::connect(&url))
        .await
        .unwrap_or_else(|_| panic!("connect to {url} still pending after {:?}", LIMIT * 5));
    let elapsed = started.elapsed();
    let err = match connected {
        Ok(client) => panic!("connect to {url} succeeded after {elapsed:?}: {client}"),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::Connection, "{url}: {err}");
    assert!(err.is_retryable(), "{url}: {err}");
    assert!(
        elapsed < LIMIT + SLACK,
        "{url}: failed only after {elapsed:?}: {err}"
    );
    err
}

/// Nothing listens on the port: the connect fails at once, not at the first acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_closed_port_fails_fast() {
    let port = closed_port();
    connect_fails_fast(&format!("etcd://127.0.0.1:{port}")).await;
}

/// The port accepts connections but never answers: the connect fails at the request
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_silent_listener_fails_within_the_request_timeout() {
    let (port, listener) = silent_listener().await;
    let err = connect_fails_fast(&format!("etcd://127.0.0.1:{port}")).await;
    listener.abort();
    assert!(err.to_string().contains("no answer"), "{err}");
}

/// Every member is down or silent: one deadline covers them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_dead_members_fails_within_one_request_timeout() {
    let (silent, listener) = silent_listener().await;
    let closed = closed_port();
    connect_fails_fast(&format!("etcd://127.0.0.1:{closed},127.0.0.1:{silent}")).await;
    listener.abort();
}
