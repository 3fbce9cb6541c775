//! The fenced resource's TCP face, for holders in other processes: [`FenceServer`] serves
//! a [`FencedResource`] on a loopback port, [`FenceClient`] speaks its line protocol.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use lock_core::FencingToken;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{FencedResource, SectionHandle, StaleToken};

/// The resource on a loopback TCP port, for holders in other processes.
///
/// Line protocol: `BEGIN <token>` → `OK` or `STALE <highest>`; `READ` → `VALUE <n>`;
/// `WRITE <n>` → `OK` or `STALE <highest>`; `END` → `OK`. One section per connection
/// at a time.
#[derive(Debug)]
pub struct FenceServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl FenceServer {
    /// Serves `resource` on a free 127.0.0.1 port.
    ///
    /// # Errors
    /// If the port cannot be bound.
    pub async fn start(resource: FencedResource) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, resource.clone()));
            }
        });
        Ok(FenceServer { addr, task })
    }

    /// The address holders connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for FenceServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Bound on one exchange with a [`FenceServer`].
const FENCE_TIMEOUT: Duration = Duration::from_secs(10);

/// A holder's connection to a [`FenceServer`]: one section at a time, every exchange
/// bounded by 10 s.
#[derive(Debug)]
pub struct FenceClient {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl FenceClient {
    /// Connects to the server at `addr`.
    ///
    /// # Errors
    /// If it cannot connect within the bound.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = tokio::time::timeout(FENCE_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        Ok(FenceClient {
            lines: BufReader::new(reader).lines(),
            writer,
        })
    }

    /// Opens a section with `token`; `Ok(Err(_))` when the resource turns it away.
    ///
    /// # Errors
    /// On a broken or silent connection.
    pub async fn begin(&mut self, token: u64) -> std::io::Result<Result<(), StaleToken>> {
        let reply = self.exchange(&format!("BEGIN {token}")).await?;
        stale_or_ok(token, &reply)
    }

    /// The counter's value in the open section.
    ///
    /// # Errors
    /// On a broken or silent connection, or a reply that is not a value.
    pub async fn read(&mut self) -> std::io::Result<u64> {
        let reply = self.exchange("READ").await?;
        reply
            .strip_prefix("VALUE ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| unexpected(&reply))
    }

    /// Writes `value` in the open section opened with `token`; `Ok(Err(_))` when the
    /// resource turns it away.
    ///
    /// # Errors
    /// On a broken or silent connection.
    pub async fn write(
        &mut self,
        token: u64,
        value: u64,
    ) -> std::io::Result<Result<(), StaleToken>> {
        let reply = self.exchange(&format!("WRITE {value}")).await?;
        stale_or_ok(token, &reply)
    }

    /// Closes the open section.
    ///
    /// # Errors
    /// On a broken or silent connection.
    pub async fn end(&mut self) -> std::io::Result<()> {
        let reply = self.exchange("END").await?;
        stale_or_ok(0, &reply).map(drop)
    }

    async fn exchange(&mut self, request: &str) -> std::io::Result<String> {
        let exchange = async {
            self.writer
                .write_all(format!("{request}\n").as_bytes())
                .await?;
            self.lines
                .next_line()
                .await?
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
        };
        tokio::time::timeout(FENCE_TIMEOUT, exchange)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }
}

fn stale_or_ok(offered: u64, reply: &str) -> std::io::Result<Result<(), StaleToken>> {
    if reply == "OK" {
        return Ok(Ok(()));
    }
    match reply.strip_prefix("STALE ").and_then(|n| n.parse().ok()) {
        Some(highest) => Ok(Err(StaleToken { offered, highest })),
        None => Err(unexpected(reply)),
    }
}

fn unexpected(reply: &str) -> std::io::Error {
    std::io::Error::other(format!("unexpected fence reply {reply:?}"))
}

async fn serve(stream: TcpStream, resource: FencedResource) {
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader).lines();
    let mut open: Option<SectionHandle> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        let reply = match (
            words.next(),
            words.next().and_then(|w| w.parse::<u64>().ok()),
        ) {
            (Some("BEGIN"), Some(token)) => match resource.begin(FencingToken(token)) {
                Ok(section) => {
                    open = Some(section);
                    "OK".to_owned()
                }
                Err(stale) => format!("STALE {}", stale.highest),
            },
            (Some("READ"), _) => match &open {
                Some(section) => format!("VALUE {}", section.read()),
                None => "ERR no section".to_owned(),
            },
            (Some("WRITE"), Some(value)) => match &open {
                Some(section) => match section.write(value) {
                    Ok(()) => "OK".to_owned(),
                    Err(stale) => format!("STALE {}", stale.highest),
                },
                None => "ERR no section".to_owned(),
            },
            (Some("END"), _) => {
                if let Some(section) = open.take() {
                    section.end();
                }
                "OK".to_owned()
            }
            _ => "ERR unknown command".to_owned(),
        };
        if writer
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}
