//! Readiness probes: Redis `PING`, ZooKeeper four-letter words, etcd HTTP over raw TCP;
//! a PostgreSQL `SELECT 1`.
//!
//! Every function here is bounded by the timeout it is given.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response a probe reads.
const MAX_RESPONSE: u64 = 1 << 20;

/// How a server proves it is ready.
#[derive(Debug, Clone)]
pub(crate) enum Probe {
    /// `PING` answered by `+PONG`.
    RedisPing(SocketAddr),
    /// `srvr` shows `Mode: standalone` (standalone) or `Mode: leader|follower` (member).
    ZkMode { addr: SocketAddr, standalone: bool },
    /// `GET /health` says `"health":"true"`.
    EtcdHealth(SocketAddr),
    /// A PostgreSQL session (user and database `postgres`) answers `SELECT 1`: over TCP,
    /// or over the Unix socket in `socket` (a server that takes only TLS over TCP).
    Postgres {
        addr: SocketAddr,
        socket: Option<PathBuf>,
    },
}

impl Probe {
    /// The port probed.
    pub(crate) fn port(&self) -> u16 {
        match self {
            Self::RedisPing(addr)
            | Self::ZkMode { addr, .. }
            | Self::EtcdHealth(addr)
            | Self::Postgres { addr, .. } => addr.port(),
        }
    }

    /// One probe attempt, bounded by `timeout`; `Err` describes what was seen.
    pub(crate) async fn check(&self, timeout: Duration) -> Result<(), String> {
        match self {
            Self::RedisPing(addr) => {
                let reply = redis_command(*addr, &["PING"], timeout)
                    .await
                    .map_err(|e| format!("PING: {e}"))?;
                if reply.starts_with("+PONG") {
                    Ok(())
                } else {
                    Err(format!("PING answered {:?}", reply.trim_end()))
                }
            }
            Self::ZkMode { addr, standalone } => {
                let out = four_letter(*addr, "srvr", timeout)
                    .await
                    .map_err(|e| format!("srvr: {e}"))?;
                let mode = zk_mode_line(&out);
                let ok = matches!(
                    (mode, standalone),
                    (Some("standalone"), true) | (Some("leader" | "follower"), false)
                );
                if ok {
                    Ok(())
                } else {
                    Err(format!("srvr answered {:?}", out.trim_end()))
                }
            }
            Self::EtcdHealth(addr) => {
                let (status, body) = http(*addr, "GET", "/health", None, timeout)
                    .await
                    .map_err(|e| format!("GET /health: {e}"))?;
                if status == 200 && json_str_field(&body, "health") == Some("true") {
                    Ok(())
                } else {
                    Err(format!(
                        "GET /health answered {status} {:?}",
                        body.trim_end()
                    ))
                }
            }
            Self::Postgres { addr, socket } => {
                let rows = crate::postgres::sql::simple_query(
                    *addr,
                    socket.as_deref(),
                    "SELECT 1",
                    timeout,
                )
                .await
                .map_err(|e| format!("SELECT 1: {e}"))?;
                if rows == [vec![Some("1".to_owned())]] {
                    Ok(())
                } else {
                    Err(format!("SELECT 1 answered {rows:?}"))
                }
            }
        }
    }
}

/// How far to read a response.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// Up to and including the first `\r\n`.
    Line,
    /// Until the server closes the connection.
    Eof,
}

/// Connects, sends `request`, reads the response; all within `timeout`.
async fn exchange(
    addr: SocketAddr,
    request: &[u8],
    until: Until,
    timeout: Duration,
) -> std::io::Result<String> {
    let work = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request).await?;
        let mut buf = Vec::new();
        match until {
            Until::Eof => {
                (&mut stream)
                    .take(MAX_RESPONSE)
                    .read_to_end(&mut buf)
                    .await?;
            }
            Until::Line => {
                let mut chunk = [0_u8; 512];
                while !buf.windows(2).any(|w| w == b"\r\n") && (buf.len() as u64) < MAX_RESPONSE {
                    let n = stream.read(&mut chunk).await?;
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "probe timed out"))?
}

/// Sends one Redis command and returns the first line of the reply (`+OK`, `:1`, `-ERR …`).
pub(crate) async fn redis_command(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> std::io::Result<String> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    exchange(addr, request.as_bytes(), Until::Line, timeout).await
}

/// A Redis reply, as far as the harness reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+…`, `:…` or a bulk string.
    Text(String),
    /// `-…`.
    Error(String),
    /// A null bulk string or array.
    Nil,
    /// `*…`.
    Array(Vec<Reply>),
}

impl Reply {
    /// The text of a simple, integer or bulk reply.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Self::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// Parses one reply from the start of `buf`: the reply and the bytes it took, `None` while
/// incomplete.
fn parse_reply(buf: &[u8]) -> Option<(Reply, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&buf[1..end]).into_owned();
    let after = end + 2;
    match buf.first()? {
        b'+' | b':' => Some((Reply::Text(line), after)),
        b'-' => Some((Reply::Error(line), after)),
        b'$' => match usize::try_from(line.parse::<i64>().ok()?) {
            Err(_) => Some((Reply::Nil, after)),
            Ok(len) if buf.len() >= after + len + 2 => {
                let text = String::from_utf8_lossy(&buf[after..after + len]).into_owned();
                Some((Reply::Text(text), after + len + 2))
            }
            Ok(_) => None,
        },
        b'*' => match usize::try_from(line.parse::<i64>().ok()?) {
            Err(_) => Some((Reply::Nil, after)),
            Ok(n) => {
                let (mut items, mut at) = (Vec::with_capacity(n), after);
                for _ in 0..n {
                    let (item, used) = parse_reply(&buf[at..])?;
                    items.push(item);
                    at += used;
                }
                Some((Reply::Array(items), at))
            }
        },
        _ => Some((Reply::Error(format!("unreadable reply {line:?}")), after)),
    }
}

/// Sends one Redis command and reads its whole reply (bulk strings and arrays too).
pub(crate) async fn redis_reply(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> std::io::Result<Reply> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    let work = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut buf = Vec::new();
        let mut chunk = [0_u8; 4096];
        loop {
            if let Some((reply, _)) = parse_reply(&buf) {
                return Ok(reply);
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 || buf.len() as u64 > MAX_RESPONSE {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "incomplete reply",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "probe timed out"))?
}

/// `field` of the `key: value` lines that `command section` (`INFO replication`,
/// `CLUSTER INFO`...) answers on `addr`; `None` when it cannot be read.
pub(crate) async fn info_field(
    addr: SocketAddr,
    command: &str,
    section: &str,
    field: &str,
    timeout: Duration,
) -> Option<String> {
    let reply = redis_reply(addr, &[command, section], timeout).await.ok()?;
    let prefix = format!("{field}:");
    reply
        .text()?
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|value| value.trim().to_owned())
}

/// Sends a ZooKeeper four-letter word and returns the whole answer.
pub(crate) async fn four_letter(
    addr: SocketAddr,
    word: &str,
    timeout: Duration,
) -> std::io::Result<String> {
    exchange(addr, word.as_bytes(), Until::Eof, timeout).await
}

/// The value of the `Mode:` line of a `srvr`/`stat` answer.
pub(crate) fn zk_mode_line(out: &str) -> Option<&str> {
    out.lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(str::trim)
}

/// A minimal HTTP/1.0 request (so the answer is never chunked); returns status and body.
pub(crate) async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let raw = exchange(addr, request.as_bytes(), Until::Eof, timeout).await?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "not an HTTP response: {:?}",
                    head.lines().next().unwrap_or("")
                ),
            )
        })?;
    Ok((status, body.to_owned()))
}

/// The string value of the first `"field": "value"` pair in a compact JSON text.
pub(crate) fn json_str_field<'a>(json: &'a str, field: &str) -> Option<&'a str> {
    let key = format!("\"{field}\"");
    let mut rest = json;
    while let Some(at) = rest.find(&key) {
        let after = rest[at + key.len()..].trim_start();
        if let Some(value) = after.strip_prefix(':') {
            let value = value.trim_start().strip_prefix('"')?;
            return value.find('"').map(|end| &value[..end]);
        }
        rest = &rest[at + key.len()..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields() {
        let body = r#"{"header":{"cluster_id":"1","member_id":"42"},"leader":"42","x": "y"}"#;
        assert_eq!(json_str_field(body, "member_id"), Some("42"));
        assert_eq!(json_str_field(body, "leader"), Some("42"));
        assert_eq!(json_str_field(body, "x"), Some("y"));
        assert_eq!(json_str_field(body, "nope"), None);
    }

    #[test]
    fn redis_replies() {
        let raw = b"*2\r\n$9\r\n127.0.0.1\r\n$4\r\n6379\r\n";
        let (reply, used) = parse_reply(raw).expect("complete");
        assert_eq!(used, raw.len());
        let text = |s: &str| Reply::Text(s.to_owned());
        assert_eq!(reply, Reply::Array(vec![text("127.0.0.1"), text("6379")]));
        assert!(parse_reply(&raw[..raw.len() - 3]).is_none());
        assert_eq!(parse_reply(b"*-1\r\n").expect("nil").0, Reply::Nil);
        assert_eq!(parse_reply(b"+OK 3\r\n").expect("ok").0, text("OK 3"));
    }

    #[test]
    fn zk_mode() {
        assert_eq!(
            zk_mode_line("Zxid: 0x0\nMode: follower\nNode count: 5\n"),
            Some("follower")
        );
        assert_eq!(
            zk_mode_line("This ZooKeeper instance is not currently serving"),
            None
        );
    }
}
