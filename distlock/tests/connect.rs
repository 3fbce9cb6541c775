//! Connecting to a server that is not there fails at connect, for every backend alike:
//! with a typed, retryable error, within the request timeout, whether nothing listens on
//! the port or something accepts connections and never answers.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

/// The request timeout the URLs ask for.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Slack on top of it for scheduling on a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

/// The URLs of every backend on `port`.
fn urls(port: u16) -> Vec<String> {
    let query = "request_timeout=1s";
    vec![
        format!("redis://127.0.0.1:{port}?{query}"),
        format!("redlock://127.0.0.1:{port}?{query}"),
        format!("zk://127.0.0.1:{port}/locks?{query}"),
        format!("etcd://127.0.0.1:{port}/locks?{query}"),
    ]
}

/// Connects to every URL at once; panics listing each one that did not fail fast with a
/// retryable error.
async fn assert_fail_fast(urls: Vec<String>) {
    let outcomes = futures::future::join_all(urls.into_iter().map(|url| async move {
        let started = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT * 30, distlock::connect(&url)).await;
        let waited = started.elapsed();
        match outcome {
            Err(_) => Some(format!("{url}: connect still pending after {waited:?}")),
            Ok(Ok(client)) => Some(format!(
                "{url}: connected to nothing ({client}) after {waited:?}"
            )),
            Ok(Err(err)) if !err.is_retryable() => {
                Some(format!("{url}: not retryable ({:?}): {err}", err.kind()))
            }
            Ok(Err(err)) if waited > REQUEST_TIMEOUT + SLACK => {
                Some(format!("{url}: failed only after {waited:?}: {err}"))
            }
            Ok(Err(_)) => None,
        }
    }))
    .await;
    let failures: Vec<String> = outcomes.into_iter().flatten().collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn nothing_listening_fails_at_connect() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr").port()
    };
    assert_fail_fast(urls(port)).await;
}

#[tokio::test]
async fn silent_server_fails_at_connect_within_the_request_timeout() {
    // Accepts (the kernel completes the handshake) and never answers a byte.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    assert_fail_fast(urls(port)).await;
    accepted.abort();
}
