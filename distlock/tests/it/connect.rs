//! Connecting to a server that is not there fails at connect, for every backend alike:
//! with a typed, retryable error, within the request timeout, whether nothing listens on
//! the port, something accepts connections and never answers, or several servers are
//! listed and each is one of those (one deadline covers them all). No server needed.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

/// The request timeout the URLs ask for.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Slack on top of it for scheduling on a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

/// The URLs of every backend on `hosts` (`host:port`, comma-separated where the scheme
/// takes several servers).
fn urls(hosts: &str) -> Vec<String> {
    let query = "request_timeout=1s";
    let single = hosts.split(',').next().unwrap_or(hosts);
    vec![
        format!("redis://{single}?{query}"),
        format!("redlock://{hosts}?{query}"),
        format!("zk://{hosts}/locks?{query}"),
        format!("etcd://{hosts}/locks?{query}"),
    ]
}

/// A loopback port with nothing listening on it.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A loopback listener that accepts connections (the kernel completes the handshake)
/// and never answers a byte, until the task is aborted.
async fn silent_listener() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded: the test aborts the task long before this many connections.
        while held.len() < 1000 {
            match listener.accept().await {
                Ok((socket, _)) => held.push(socket),
                Err(_) => break,
            }
        }
    });
    (port, task)
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
    let port = closed_port().await;
    assert_fail_fast(urls(&format!("127.0.0.1:{port}"))).await;
}

#[tokio::test]
async fn silent_server_fails_at_connect_within_the_request_timeout() {
    let (port, listener) = silent_listener().await;
    assert_fail_fast(urls(&format!("127.0.0.1:{port}"))).await;
    listener.abort();
}

#[tokio::test]
async fn dead_servers_fail_at_connect_within_one_request_timeout() {
    let (first, a) = silent_listener().await;
    let (second, b) = silent_listener().await;
    let closed = closed_port().await;
    assert_fail_fast(urls(&format!(
        "127.0.0.1:{first},127.0.0.1:{closed},127.0.0.1:{second}"
    )))
    .await;
    a.abort();
    b.abort();
}
