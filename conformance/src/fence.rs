//! A fenced resource: the storage a lock protects, as a checker sees it.
//!
//! A holder opens a critical section with its fencing token ([`FencedResource::begin`]),
//! reads the counter, writes it back incremented ([`SectionHandle::write`]) and closes the
//! section. The resource accepts a begin or a write only with a token at least as high as
//! every token it has seen, like storage that checks fencing tokens, and records every
//! section on the monotonic clock. [`FencedResource::check`] then reports overlapping
//! sections, stale writes that were accepted, lost updates and takeover gaps.
//!
//! A section *claims* the lock while its holder is entitled to be inside. A holder that
//! watches its guard ([`FencedResource::hold_section`]) claims it for as long as the guard
//! vouches for the lock (not lost, before its validity deadline), whether or not the fence
//! accepts its write: a newer holder that begins meanwhile turns the older write away, and
//! that is an overlap at the lock even though the resource stayed consistent. A blind
//! section (a paused process that writes without looking, [`SectionHandle::write`]) claims
//! the lock only through an accepted write. Two sections overlap when both claim the lock
//! at the same time.
//!
//! Holders in other processes reach the same resource over loopback TCP through
//! [`FenceServer`], with [`FenceClient`].
//!
//! (Over 500 lines with its unit tests, about 150: the resource, its checker and its TCP
//! face with its client share one ledger and one line protocol, and are read together.)

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lock_core::{FencingToken, LockGuard};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// The fencing token it was opened with.
    pub token: u64,
    /// When it was opened.
    pub start: Instant,
    /// When its write was accepted, if it was.
    pub written: Option<Instant>,
    /// When it was closed (`None` while open or abandoned).
    pub end: Option<Instant>,
    /// For a holder that watched its guard: until when the guard vouched for the lock
    /// during the section (at most `end`). `None` for a blind section.
    pub held_until: Option<Instant>,
}

impl Section {
    /// Until when the section claims the lock, if it does at all: a watched section while
    /// its guard vouched, a blind one through an accepted write until it closed (or `now`
    /// while open).
    fn claim_until(&self, now: Instant) -> Option<Instant> {
        let until = match self.held_until {
            Some(held) => held,
            None => self.written.map(|_| self.end.unwrap_or(now))?,
        };
        (until >= self.start).then_some(until)
    }
}

/// A begin or write rejected because its token is lower than one already seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}: the resource has seen {highest}")]
pub struct StaleToken {
    /// The token offered.
    pub offered: u64,
    /// The highest token seen so far.
    pub highest: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    highest: Option<u64>,
    sections: Vec<Section>,
    counter: u64,
    writes: u64,
    rejected_begins: usize,
    rejected_writes: usize,
}

impl Ledger {
    fn check_token(&self, token: u64) -> Result<(), StaleToken> {
        match self.highest {
            Some(highest) if token < highest => Err(StaleToken {
                offered: token,
                highest,
            }),
            _ => Ok(()),
        }
    }
}

/// The resource a lock protects, shared by every contender of a test.
#[derive(Debug, Clone, Default)]
pub struct FencedResource {
    ledger: Arc<Mutex<Ledger>>,
}

/// An open critical section.
#[derive(Debug)]
#[must_use = "end the section to record when it finished"]
pub struct SectionHandle {
    ledger: Arc<Mutex<Ledger>>,
    index: usize,
    token: u64,
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

impl SectionHandle {
    /// The counter's current value.
    pub fn read(&self) -> u64 {
        lock(&self.ledger).counter
    }

    /// Writes `value` if this section's token is still the highest seen (a holder that
    /// read, paused and lost its lock to a newer token is turned away here).
    ///
    /// # Errors
    /// [`StaleToken`] when a higher token was seen since the section began.
    pub fn write(&self, value: u64) -> Result<(), StaleToken> {
        let mut ledger = lock(&self.ledger);
        if let Err(stale) = ledger.check_token(self.token) {
            ledger.rejected_writes += 1;
            return Err(stale);
        }
        ledger.counter = value;
        ledger.writes += 1;
        let now = Instant::now();
        if let Some(section) = ledger.sections.get_mut(self.index) {
            section.written = Some(now);
        }
        Ok(())
    }

    /// Records the end of the section.
    pub fn end(self) {
        self.close(None);
    }

    /// Writes `value` as the holder of `guard` and ends the section: the write is made
    /// only if the guard still vouches for the lock (not lost, before its validity
    /// deadline); the section claims the lock until then, or until the guard stopped
    /// vouching. Returns whether a write was made and accepted.
    pub fn finish(self, value: u64, guard: &LockGuard) -> bool {
        let now = Instant::now();
        let vouches = !guard.state().is_lost() && now < guard.valid_until();
        let accepted = vouches && self.write(value).is_ok();
        let held_until = if vouches {
            Instant::now()
        } else {
            now.min(guard.valid_until())
        };
        self.close(Some(held_until));
        accepted
    }

    fn close(self, held_until: Option<Instant>) {
        let mut ledger = lock(&self.ledger);
        if let Some(section) = ledger.sections.get_mut(self.index) {
            let end = Instant::now();
            section.end = Some(end);
            section.held_until = held_until.map(|held| held.min(end));
        }
    }
}

impl FencedResource {
    /// A fresh resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens a critical section with `token`, or rejects a stale token.
    ///
    /// # Errors
    /// [`StaleToken`] if a higher token was seen before.
    pub fn begin(&self, token: FencingToken) -> Result<SectionHandle, StaleToken> {
        let mut ledger = lock(&self.ledger);
        if let Err(stale) = ledger.check_token(token.get()) {
            ledger.rejected_begins += 1;
            return Err(stale);
        }
        ledger.highest = Some(token.get());
        ledger.sections.push(Section {
            token: token.get(),
            start: Instant::now(),
            written: None,
            end: None,
            held_until: None,
        });
        Ok(SectionHandle {
            ledger: Arc::clone(&self.ledger),
            index: ledger.sections.len() - 1,
            token: token.get(),
        })
    }

    /// One full blind critical section: begin, read, `work`, write the incremented value,
    /// end. Returns whether the write was accepted.
    ///
    /// # Errors
    /// [`StaleToken`] when the begin is rejected.
    pub async fn increment<F: std::future::Future<Output = ()>>(
        &self,
        token: FencingToken,
        work: F,
    ) -> Result<bool, StaleToken> {
        let section = self.begin(token)?;
        let seen = section.read();
        work.await;
        let accepted = section.write(seen + 1).is_ok();
        section.end();
        Ok(accepted)
    }

    /// One full critical section of the holder of `guard`: begin with its fencing token,
    /// read, `work` (cut short if the lock is lost), then [`SectionHandle::finish`] with
    /// the incremented value. Returns whether the write was made and accepted.
    ///
    /// # Errors
    /// [`StaleToken`] when the begin is rejected.
    pub async fn hold_section<F: std::future::Future<Output = ()>>(
        &self,
        guard: &LockGuard,
        work: F,
    ) -> Result<bool, StaleToken> {
        let section = self.begin(guard.fencing_token())?;
        let seen = section.read();
        let mut watch = guard.watch();
        tokio::select! {
            () = work => {}
            _ = watch.lost() => {}
        }
        Ok(section.finish(seen + 1, guard))
    }

    /// Every section so far, in the order they began.
    pub fn sections(&self) -> Vec<Section> {
        lock(&self.ledger).sections.clone()
    }

    /// Checks the history and reports what it found.
    pub fn check(&self) -> FenceReport {
        let ledger = lock(&self.ledger);
        let mut sections = ledger.sections.clone();
        sections.sort_by_key(|s| s.start);
        let accepted: Vec<&Section> = sections.iter().filter(|s| s.written.is_some()).collect();
        let now = Instant::now();
        let claiming: Vec<(&Section, Instant)> = sections
            .iter()
            .filter_map(|s| Some((s, s.claim_until(now)?)))
            .collect();
        let mut overlaps = Vec::new();
        let mut tokens_backwards = Vec::new();
        let mut gaps = Vec::new();
        for (i, (a, a_until)) in claiming.iter().enumerate() {
            for (b, _) in &claiming[i + 1..] {
                // Sorted by start: b began after a; they overlap if b began while a
                // still claimed the lock.
                if b.start < *a_until {
                    overlaps.push((**a, **b));
                } else {
                    break;
                }
            }
        }
        for pair in accepted.windows(2) {
            if pair[1].token < pair[0].token {
                tokens_backwards.push((pair[0].token, pair[1].token));
            }
            if let Some(end) = pair[0].end {
                gaps.push(pair[1].start.saturating_duration_since(end));
            }
        }
        FenceReport {
            sections: sections.len(),
            accepted_writes: ledger.writes,
            counter: ledger.counter,
            rejected_begins: ledger.rejected_begins,
            rejected_writes: ledger.rejected_writes,
            overlaps,
            tokens_backwards,
            open_sections: sections.iter().filter(|s| s.end.is_none()).count(),
            gaps,
        }
    }
}

/// What [`FencedResource::check`] found.
#[derive(Debug, Clone)]
pub struct FenceReport {
    /// Critical sections opened.
    pub sections: usize,
    /// Writes accepted.
    pub accepted_writes: u64,
    /// Final counter value: equals `accepted_writes` unless updates were lost.
    pub counter: u64,
    /// Begins rejected for a stale token.
    pub rejected_begins: usize,
    /// Writes rejected for a stale token (a holder that lost its lock and came back).
    /// No stale write is ever accepted: the fence checks every write.
    pub rejected_writes: usize,
    /// Pairs of sections that claimed the lock at the same time (see the module docs).
    pub overlaps: Vec<(Section, Section)>,
    /// Consecutive accepted sections whose token went down.
    pub tokens_backwards: Vec<(u64, u64)>,
    /// Sections never closed (a crashed or cancelled holder).
    pub open_sections: usize,
    /// Time from the end of one accepted section to the start of the next.
    pub gaps: Vec<Duration>,
}

impl FenceReport {
    /// Updates lost by overlapping read-modify-write cycles.
    pub fn lost_updates(&self) -> u64 {
        self.accepted_writes.saturating_sub(self.counter)
    }

    /// No overlapping accepted sections, no lost update, no token going backwards.
    pub fn is_safe(&self) -> bool {
        self.overlaps.is_empty() && self.tokens_backwards.is_empty() && self.lost_updates() == 0
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::memory::{MemoryBackend, MemorySpace};
    use lock_core::{AcquireOptions, DistributedLock, LockName, LockOptions};

    /// A guard on a private memory space, after `before` earlier holds of the same name
    /// (so its fencing token is `before + 1`).
    async fn guard(before: usize, acquire: AcquireOptions) -> LockGuard {
        let space = MemorySpace::named(&format!("fence-{}", uuid::Uuid::new_v4().simple()));
        let client = MemoryBackend::client(space, LockOptions::default()).unwrap();
        let name = LockName::new("fenced").unwrap();
        for _ in 0..before {
            let earlier = client.acquire(&name, &AcquireOptions::try_once()).await;
            earlier.unwrap().unwrap().release().await.unwrap();
        }
        client.acquire(&name, &acquire).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn a_holder_turned_away_while_its_guard_vouched_is_an_overlap() {
        let resource = FencedResource::new();
        let older = guard(0, AcquireOptions::try_once()).await;
        let newer = guard(1, AcquireOptions::try_once()).await;
        assert!(newer.fencing_token() > older.fencing_token());
        let section = resource.begin(older.fencing_token()).unwrap();
        let seen = section.read();
        // A newer holder gets in while the older guard still vouches for the lock.
        let sleep = tokio::time::sleep(Duration::from_millis(2));
        assert!(resource.hold_section(&newer, sleep).await.unwrap());
        assert!(!section.finish(seen + 1, &older), "the fence turns it away");
        let report = resource.check();
        assert_eq!(report.rejected_writes, 1);
        assert_eq!(report.counter, 1, "the resource stayed consistent");
        assert_eq!(report.overlaps.len(), 1, "{report:?}");
        assert!(!report.is_safe());
    }

    #[tokio::test]
    async fn a_holder_whose_guard_stopped_vouching_first_does_not_overlap() {
        let resource = FencedResource::new();
        let ttl = Duration::from_millis(20);
        let older = guard(0, AcquireOptions::try_once().with_ttl(ttl).manual()).await;
        let newer = guard(1, AcquireOptions::try_once()).await;
        let section = resource.begin(older.fencing_token()).unwrap();
        let seen = section.read();
        tokio::time::sleep_until(older.valid_until()).await;
        let sleep = tokio::time::sleep(Duration::from_millis(2));
        assert!(resource.hold_section(&newer, sleep).await.unwrap());
        assert!(
            !section.finish(seen + 1, &older),
            "no write past the deadline"
        );
        let report = resource.check();
        assert_eq!(report.rejected_writes, 0, "{report:?}");
        assert!(report.is_safe(), "{report:?}");
    }

    #[tokio::test]
    async fn overlapping_accepted_writes_are_reported() {
        let resource = FencedResource::new();
        let a = resource.begin(FencingToken(1)).unwrap();
        let b = resource.begin(FencingToken(1)).unwrap();
        a.write(a.read() + 1).unwrap();
        b.write(b.read() + 1).unwrap();
        b.end();
        a.end();
        let report = resource.check();
        assert_eq!(report.overlaps.len(), 1);
        assert!(!report.is_safe());
    }

    #[tokio::test]
    async fn a_stale_writer_is_rejected_and_the_history_stays_safe() {
        let resource = FencedResource::new();
        let paused = resource.begin(FencingToken(1)).unwrap();
        let seen = paused.read();
        // The paused holder lost its lock; the next holder runs a whole section.
        assert!(resource.increment(FencingToken(2), async {}).await.unwrap());
        assert_eq!(paused.write(seen + 1).unwrap_err().highest, 2);
        paused.end();
        assert!(resource.begin(FencingToken(1)).is_err());
        let report = resource.check();
        assert!(report.is_safe(), "{report:?}");
        assert_eq!(report.rejected_writes, 1);
        assert_eq!(report.rejected_begins, 1);
        assert_eq!(report.counter, 1);
    }

    #[tokio::test]
    async fn sequential_sections_are_safe() {
        let resource = FencedResource::new();
        for token in [3, 3, 5] {
            assert!(resource
                .increment(FencingToken(token), async {})
                .await
                .unwrap());
        }
        let report = resource.check();
        assert!(report.is_safe(), "{report:?}");
        assert_eq!(report.counter, 3);
        assert_eq!(report.gaps.len(), 2);
    }

    #[tokio::test]
    async fn the_client_speaks_the_line_protocol() {
        let resource = FencedResource::new();
        let server = FenceServer::start(resource.clone()).await.unwrap();
        let mut client = FenceClient::connect(server.addr()).await.unwrap();
        client.begin(4).await.unwrap().unwrap();
        let seen = client.read().await.unwrap();
        client.write(4, seen + 1).await.unwrap().unwrap();
        client.end().await.unwrap();
        let stale = client.begin(3).await.unwrap().unwrap_err();
        assert_eq!((stale.offered, stale.highest), (3, 4));
        assert_eq!(resource.check().counter, 1);
    }

    #[tokio::test]
    async fn the_tcp_front_speaks_the_line_protocol() {
        let resource = FencedResource::new();
        let server = FenceServer::start(resource.clone()).await.unwrap();
        let stream = TcpStream::connect(server.addr()).await.unwrap();
        let (reader, mut writer) = stream.into_split();
        let mut lines = BufReader::new(reader).lines();
        for (send, expect) in [
            ("BEGIN 4", "OK"),
            ("READ", "VALUE 0"),
            ("WRITE 1", "OK"),
            ("END", "OK"),
            ("BEGIN 3", "STALE 4"),
        ] {
            writer
                .write_all(format!("{send}\n").as_bytes())
                .await
                .unwrap();
            assert_eq!(lines.next_line().await.unwrap().unwrap(), expect);
        }
        assert_eq!(resource.check().counter, 1);
    }
}
