//! The fault proxy, against a tiny local echo server.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::proxy::{FaultProxy, ProxyMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a read waits before the test calls the reply lost.
const SILENCE: Duration = Duration::from_millis(400);
/// Generous bound for anything that should happen.
const SOON: Duration = Duration::from_secs(5);

/// An echo server on 127.0.0.1:0; aborted on drop.
struct Echo {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Echo {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let addr = listener.local_addr().expect("echo addr");
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut s, _)) = listener.accept().await {
                conns.spawn(async move {
                    let mut buf = [0_u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    tokio::time::timeout(SOON, TcpStream::connect(proxy.addr()))
        .await
        .expect("connect in time")
        .expect("connect to proxy")
}

/// Writes `msg` and reads exactly `msg.len()` bytes back, or fails after `wait`.
async fn roundtrip(stream: &mut TcpStream, msg: &[u8], wait: Duration) -> std::io::Result<Vec<u8>> {
    stream.write_all(msg).await?;
    let mut buf = vec![0_u8; msg.len()];
    tokio::time::timeout(wait, stream.read_exact(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(ErrorKind::TimedOut, "no reply"))??;
    Ok(buf)
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < SOON, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads until the stream reports a reset or EOF; fails if it stays open.
async fn expect_reset_or_eof(stream: &mut TcpStream) {
    let mut buf = [0_u8; 64];
    match tokio::time::timeout(SOON, stream.read(&mut buf)).await {
        Ok(Ok(0)) => {}
        Ok(Err(e)) => assert!(
            matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ),
            "unexpected error kind: {e:?}"
        ),
        Ok(Ok(n)) => panic!("expected reset or EOF, read {n} bytes"),
        Err(_) => panic!("connection stayed open"),
    }
}

#[tokio::test]
async fn pass_forwards_both_ways_and_counts_connections() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert_eq!(proxy.target(), echo.addr);
    let mut a = connect(&proxy).await;
    let mut b = connect(&proxy).await;
    assert_eq!(
        roundtrip(&mut a, b"hello", SOON).await.expect("echo a"),
        b"hello"
    );
    assert_eq!(
        roundtrip(&mut b, b"world", SOON).await.expect("echo b"),
        b"world"
    );
    assert_eq!(proxy.connections(), 2);
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.client_reads(), 2, "one read per small request");
    assert_eq!(proxy.client_bytes(), 10);
    // Large payloads survive chunking.
    let big: Vec<u8> = (0..200_000_u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(roundtrip(&mut a, &big, SOON).await.expect("echo big"), big);
    drop(a);
    eventually("one connection closed", || proxy.connections() == 1).await;
}

#[tokio::test]
async fn delay_adds_latency_to_open_connections() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    let mut s = connect(&proxy).await;
    roundtrip(&mut s, b"warm", SOON).await.expect("echo");
    let base = Duration::from_millis(150);
    proxy.set_mode(ProxyMode::Delay {
        base,
        jitter: Duration::from_millis(30),
    });
    let started = Instant::now();
    assert_eq!(
        roundtrip(&mut s, b"slow", SOON)
            .await
            .expect("delayed echo"),
        b"slow"
    );
    assert!(
        started.elapsed() >= base,
        "round trip took only {:?}",
        started.elapsed()
    );
    // Order is preserved across many delayed chunks.
    let mut expected = Vec::new();
    for i in 0..20_u8 {
        s.write_all(&[i]).await.expect("write");
        expected.push(i);
    }
    let mut got = vec![0_u8; expected.len()];
    tokio::time::timeout(SOON, s.read_exact(&mut got))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(got, expected);
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(
        roundtrip(&mut s, b"fast", SOON).await.expect("echo"),
        b"fast"
    );
}

#[tokio::test]
async fn blackhole_swallows_traffic_until_pass_restores_new_connections() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    let mut old = connect(&proxy).await;
    roundtrip(&mut old, b"before", SOON).await.expect("echo");
    proxy.set_mode(ProxyMode::Blackhole);
    let err = roundtrip(&mut old, b"lost", SILENCE)
        .await
        .expect_err("no reply in blackhole");
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    // New connections are accepted but answered by nothing.
    let mut during = connect(&proxy).await;
    let err = roundtrip(&mut during, b"lost", SILENCE)
        .await
        .expect_err("no reply in blackhole");
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    proxy.set_mode(ProxyMode::Pass);
    let mut fresh = connect(&proxy).await;
    assert_eq!(
        roundtrip(&mut fresh, b"healed", SOON)
            .await
            .expect("echo after heal"),
        b"healed"
    );
}

#[tokio::test]
async fn reset_mode_resets_open_and_new_connections() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    let mut open = connect(&proxy).await;
    roundtrip(&mut open, b"hi", SOON).await.expect("echo");
    proxy.set_mode(ProxyMode::Reset);
    expect_reset_or_eof(&mut open).await;
    let mut new = connect(&proxy).await;
    expect_reset_or_eof(&mut new).await;
    eventually("connections gone", || proxy.connections() == 0).await;
    proxy.set_mode(ProxyMode::Pass);
    let mut fresh = connect(&proxy).await;
    assert_eq!(
        roundtrip(&mut fresh, b"back", SOON).await.expect("echo"),
        b"back"
    );
}

#[tokio::test]
async fn reset_all_resets_current_connections_only() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    let mut open = connect(&proxy).await;
    roundtrip(&mut open, b"hi", SOON).await.expect("echo");
    proxy.reset_all();
    let mut buf = [0_u8; 8];
    let got = tokio::time::timeout(SOON, open.read(&mut buf))
        .await
        .expect("reset in time");
    match got {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e:?}"),
        Ok(n) => assert_eq!(n, 0, "expected reset or EOF"),
    }
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    let mut fresh = connect(&proxy).await;
    assert_eq!(
        roundtrip(&mut fresh, b"new", SOON).await.expect("echo"),
        b"new"
    );
}

#[tokio::test]
async fn drop_next_reply_drops_exactly_one_reply() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    let mut s = connect(&proxy).await;
    assert_eq!(roundtrip(&mut s, b"one", SOON).await.expect("echo"), b"one");
    proxy.set_mode(ProxyMode::DropNextReply);
    let err = roundtrip(&mut s, b"two", SILENCE)
        .await
        .expect_err("reply dropped");
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(proxy.mode(), ProxyMode::Pass, "back to pass after one drop");
    // The next reply is the next request's, not the dropped one.
    assert_eq!(
        roundtrip(&mut s, b"three", SOON).await.expect("echo"),
        b"three"
    );
    assert_eq!(
        roundtrip(&mut s, b"four", SOON).await.expect("echo"),
        b"four"
    );
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let echo = Echo::start().await;
    let proxy = FaultProxy::start(echo.addr).await.expect("proxy");
    let addr = proxy.addr();
    let mut s = connect(&proxy).await;
    roundtrip(&mut s, b"hi", SOON).await.expect("echo");
    drop(proxy);
    expect_reset_or_eof(&mut s).await;
    let refused = tokio::time::timeout(SOON, async {
        loop {
            match TcpStream::connect(addr).await {
                Err(e) => return e,
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("listener closed in time");
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
}
