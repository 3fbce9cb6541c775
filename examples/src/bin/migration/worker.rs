//! One process of the fleet: what a service in the middle of a migration runs. It knows
//! only its lock URL (old, dual or new); each cycle takes the lock, writes a fenced
//! counter with the guard's fencing token, and releases. It stops after the current
//! cycle once its standard input closes, and prints what it did.

use std::net::SocketAddr;
use std::time::Duration;

use distlock::DistributedLockExt;
use std::io::Read;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{sleep, timeout};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bound on every wait of a worker (connect, acquire, a fence exchange, release).
const WAIT_LIMIT: Duration = Duration::from_secs(20);
/// Bound on the cycles of one worker, whatever happens.
const MAX_CYCLES: u64 = 1_000_000;
/// Pause between a release and the next acquire, so that the others get their turns.
const PAUSE: Duration = Duration::from_millis(2);

/// The line a worker prints once its client is connected.
pub(crate) const READY: &str = "READY";
/// The prefix of the line a worker prints when it stops.
pub(crate) const DONE: &str = "DONE";

/// Takes `name` through `url` in a loop, writing the fenced counter at `fence`, until
/// standard input closes.
pub(crate) async fn run(url: &str, name: &str, fence: SocketAddr) -> Result<(), BoxError> {
    let locks = timeout(WAIT_LIMIT, distlock::connect(url)).await??;
    let mut fence = Fence::connect(fence).await?;
    let stop = stop_on_stdin_close();
    println!("{READY}");
    let (mut cycles, mut stale, mut tokens) = (0u64, 0u64, None::<(u64, u64)>);
    while !*stop.borrow() && cycles < MAX_CYCLES {
        let guard = locks.lock_timeout(name, WAIT_LIMIT).await?;
        let token = guard.fencing_token().0;
        // The resource accepts a section only with a token at least as high as any it has
        // seen: a lower one would be a holder that should not be inside.
        if fence.section(token).await? {
            cycles += 1;
            tokens = Some(tokens.map_or((token, token), |(first, _)| (first, token)));
        } else {
            stale += 1;
        }
        timeout(WAIT_LIMIT, guard.release()).await??;
        sleep(PAUSE).await;
    }
    let (first, last) = tokens.unwrap_or_default();
    println!("{DONE} {cycles} {stale} {first} {last}");
    Ok(())
}

/// A watch that turns true when standard input reaches its end (the parent closed it).
/// The read blocks, so it runs on a thread of its own, off the runtime.
fn stop_on_stdin_close() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = tx.send(true);
    });
    rx
}

/// The fenced counter's line protocol (`conformance::FenceServer`).
struct Fence {
    lines: Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
}

impl Fence {
    async fn connect(addr: SocketAddr) -> Result<Self, BoxError> {
        let (reader, writer) = timeout(WAIT_LIMIT, TcpStream::connect(addr))
            .await??
            .into_split();
        Ok(Fence {
            lines: BufReader::new(reader).lines(),
            writer,
        })
    }

    async fn ask(&mut self, request: &str) -> Result<String, BoxError> {
        self.writer
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        let reply = timeout(WAIT_LIMIT, self.lines.next_line()).await??;
        reply.ok_or_else(|| "the fence closed the connection".into())
    }

    /// One critical section with `token`: begin, read, write the value + 1, end. False
    /// when the resource turned the token away as stale.
    async fn section(&mut self, token: u64) -> Result<bool, BoxError> {
        if self.ask(&format!("BEGIN {token}")).await? != "OK" {
            return Ok(false);
        }
        let value: u64 = self
            .ask("READ")
            .await?
            .strip_prefix("VALUE ")
            .ok_or("unexpected reply to READ")?
            .parse()?;
        let written = self.ask(&format!("WRITE {}", value + 1)).await? == "OK";
        self.ask("END").await?;
        Ok(written)
    }
}
