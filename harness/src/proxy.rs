//! A loopback TCP proxy that injects network faults between a client and a server.
//!
//! [`FaultProxy`] listens on `127.0.0.1:0` and forwards every accepted connection to a
//! target address. Its [`ProxyMode`] can be switched at any time with
//! [`set_mode`](FaultProxy::set_mode); the mode is checked for every chunk read, so a
//! change applies to open connections as well as to new ones.
//!
//! ```no_run
//! use std::time::Duration;
//! use harness::proxy::{FaultProxy, ProxyMode};
//!
//! # async fn example(server: std::net::SocketAddr) -> std::io::Result<()> {
//! let proxy = FaultProxy::start(server).await?;
//! let url = format!("redis://{}", proxy.addr()); // the client talks to the proxy
//! proxy.set_mode(ProxyMode::Blackhole);           // partition
//! proxy.set_mode(ProxyMode::Pass);                // heal
//! # let _ = url;
//! # Ok(())
//! # }
//! ```
//!
//! [`SourceRouter`] sits in front of several proxies and hands each connection to one of
//! them by its source address, so that the traffic of one process (e.g. a replica that
//! binds its outgoing connections to `127.0.0.2`) can be faulted apart from the rest.
//!
//! # Drop
//! Dropping the proxy stops accepting and ends every connection task; open connections
//! are closed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Size of one forwarded chunk (one `read`).
const CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction (bounds memory when delaying).
const IN_FLIGHT: usize = 64;
/// Bound on connecting to the target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Forward everything unchanged.
    #[default]
    Pass,
    /// Forward every chunk, in both directions, `base` plus a uniformly random share of
    /// `jitter` after it was read. Order is preserved.
    Delay {
        /// Minimum added delay per chunk.
        base: Duration,
        /// Upper bound of the random extra delay.
        jitter: Duration,
    },
    /// Accept connections and read from both sides, but forward nothing (nor a close):
    /// a network partition. Data read meanwhile is discarded.
    Blackhole,
    /// Reset (RST) every open connection, on both sides, and every new one on accept.
    Reset,
    /// Drop the next chunk flowing server -> client (one reply when requests are not
    /// pipelined), then return to [`Pass`](ProxyMode::Pass).
    DropNextReply,
}

/// State shared by the proxy handle and its tasks.
#[derive(Debug)]
struct Shared {
    mode: watch::Sender<ProxyMode>,
    resets: watch::Sender<u64>,
    drop_armed: AtomicBool,
    open: AtomicUsize,
    accepted: AtomicU64,
    client_reads: AtomicU64,
    client_bytes: AtomicU64,
}

impl Shared {
    fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

/// A TCP proxy on 127.0.0.1 with switchable faults. See the [module docs](self).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
    /// Dropping it ends every task.
    _shutdown: watch::Sender<()>,
}

impl FaultProxy {
    /// Listens on a free 127.0.0.1 port and forwards to `target`, in
    /// [`Pass`](ProxyMode::Pass) mode. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// If the listening socket cannot be bound.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            mode: watch::Sender::new(ProxyMode::Pass),
            resets: watch::Sender::new(0),
            drop_armed: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            client_reads: AtomicU64::new(0),
            client_bytes: AtomicU64::new(0),
        });
        let (shutdown, shutdown_rx) = watch::channel(());
        let accept_task = tokio::spawn(accept_loop(listener, target, shared.clone(), shutdown_rx));
        Ok(Self {
            addr,
            target,
            shared,
            accept_task,
            _shutdown: shutdown,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.mode()
    }

    /// Switches the mode, for open connections too. [`Reset`](ProxyMode::Reset) resets
    /// every open connection at once; [`DropNextReply`](ProxyMode::DropNextReply) arms a
    /// single drop.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.shared
            .drop_armed
            .store(mode == ProxyMode::DropNextReply, Ordering::SeqCst);
        self.shared.mode.send_replace(mode);
        if mode == ProxyMode::Reset {
            // Also as an event: a quick switch back must not let a connection miss it.
            self.reset_all();
        }
    }

    /// Resets (RST) every connection open now, without changing the mode.
    pub fn reset_all(&self) {
        self.shared.resets.send_modify(|n| *n += 1);
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since start.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Reads from clients since start: about one per request for request/response
    /// protocols that do not pipeline (a pipelined burst may count once).
    pub fn client_reads(&self) -> u64 {
        self.shared.client_reads.load(Ordering::SeqCst)
    }

    /// Bytes read from clients since start.
    pub fn client_bytes(&self) -> u64 {
        self.shared.client_bytes.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    connections.spawn(connection(client, target, shared.clone(), shutdown.clone()));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "fault proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts an open connection for its lifetime.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open.fetch_add(1, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a connection ended.
enum End {
    /// Both directions closed cleanly.
    Closed,
    /// Reset requested, or an error on one side: reset both sides.
    Reset,
    /// The proxy was dropped.
    Shutdown,
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<()>,
) {
    let _open = OpenGuard::new(&shared);
    let mut mode = shared.mode.subscribe();
    let mut resets = shared.resets.subscribe();
    if *mode.borrow_and_update() == ProxyMode::Reset {
        abort(&client);
        return;
    }
    let upstream = tokio::select! {
        _ = shutdown.changed() => return,
        r = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)) => r,
    };
    let upstream = match upstream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, %target, "fault proxy: target refused");
            abort(&client);
            return;
        }
        Err(_) => {
            abort(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_r, mut client_w) = client.into_split();
    let (mut upstream_r, mut upstream_w) = upstream.into_split();
    let end = tokio::select! {
        end = pump(&mut client_r, &mut client_w, &mut upstream_r, &mut upstream_w, &shared) => end,
        () = reset_requested(&mut mode, &mut resets) => End::Reset,
        _ = shutdown.changed() => End::Shutdown,
    };
    if let End::Reset = end {
        abort(client_r.as_ref());
        abort(upstream_r.as_ref());
    }
    // Dropping the halves closes both sockets (with RST when lingering is off).
}

/// Makes the socket's close send RST instead of FIN (`SO_LINGER` 0).
///
/// `set_linger` is deprecated because a non-zero linger blocks the thread on drop; a zero
/// linger never blocks. (`set_zero_linger` says the same but needs tokio 1.50.)
#[allow(deprecated)]
fn abort(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Resolves when the mode becomes `Reset` or `reset_all` is called.
async fn reset_requested(mode: &mut watch::Receiver<ProxyMode>, resets: &mut watch::Receiver<u64>) {
    loop {
        if *mode.borrow_and_update() == ProxyMode::Reset {
            return;
        }
        tokio::select! {
            r = mode.changed() => if r.is_err() { std::future::pending::<()>().await },
            r = resets.changed() => match r {
                Ok(()) => return,
                Err(_) => std::future::pending::<()>().await,
            },
        }
    }
}

/// Which way a chunk flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ClientToServer,
    ServerToClient,
}

async fn pump(
    client_r: &mut OwnedReadHalf,
    client_w: &mut OwnedWriteHalf,
    upstream_r: &mut OwnedReadHalf,
    upstream_w: &mut OwnedWriteHalf,
    shared: &Shared,
) -> End {
    let up = forward(client_r, upstream_w, Direction::ClientToServer, shared);
    let down = forward(upstream_r, client_w, Direction::ServerToClient, shared);
    match tokio::try_join!(up, down) {
        Ok(_) => End::Closed,
        Err(e) => {
            tracing::debug!(error = %e, "fault proxy: connection failed, resetting both sides");
            End::Reset
        }
    }
}

/// One chunk on its way, with the instant it may be written.
struct Chunk {
    data: Vec<u8>,
    due: Instant,
}

/// Forwards one direction until EOF (then half-closes the writer) or an error.
async fn forward(
    reader: &mut OwnedReadHalf,
    writer: &mut OwnedWriteHalf,
    direction: Direction,
    shared: &Shared,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Chunk>(IN_FLIGHT);
    let read_side = async move {
        let mut buf = vec![0_u8; CHUNK];
        loop {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                hold_while_blackholed(shared).await;
                return Ok::<(), std::io::Error>(());
            }
            if direction == Direction::ClientToServer {
                shared.client_reads.fetch_add(1, Ordering::Relaxed);
                shared.client_bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            let now = Instant::now();
            let due = match shared.mode() {
                ProxyMode::Pass | ProxyMode::Reset => now,
                ProxyMode::Delay { base, jitter } => now + base + random_share(jitter),
                ProxyMode::Blackhole => continue,
                ProxyMode::DropNextReply => {
                    if direction == Direction::ServerToClient
                        && shared.drop_armed.swap(false, Ordering::SeqCst)
                    {
                        shared.mode.send_if_modified(|m| {
                            let armed = *m == ProxyMode::DropNextReply;
                            if armed {
                                *m = ProxyMode::Pass;
                            }
                            armed
                        });
                        continue;
                    }
                    now
                }
            };
            let chunk = Chunk {
                data: buf[..n].to_vec(),
                due,
            };
            if tx.send(chunk).await.is_err() {
                return Ok(());
            }
        }
    };
    let write_side = async {
        while let Some(chunk) = rx.recv().await {
            tokio::time::sleep_until(chunk.due).await;
            if shared.mode() == ProxyMode::Blackhole {
                continue;
            }
            writer.write_all(&chunk.data).await?;
        }
        writer.shutdown().await
    };
    tokio::try_join!(read_side, write_side).map(|_| ())
}

/// Waits while the mode is `Blackhole` (a partition forwards no close either).
async fn hold_while_blackholed(shared: &Shared) {
    let mut mode = shared.mode.subscribe();
    while *mode.borrow_and_update() == ProxyMode::Blackhole {
        if mode.changed().await.is_err() {
            return;
        }
    }
}

/// A uniformly random duration in `[0, max]`.
fn random_share(max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    max.mul_f64(rand::rng().random_range(0.0..=1.0))
}

/// Listens on a free 127.0.0.1 port and passes every connection on, unchanged, to the
/// address its source IP is routed to (or to a default): the faults are left to the
/// [`FaultProxy`]s it routes to. See the [module docs](self).
///
/// # Drop
/// As [`FaultProxy`]: stops accepting and closes every open connection.
#[derive(Debug)]
pub struct SourceRouter {
    addr: SocketAddr,
    accept_task: JoinHandle<()>,
}

impl SourceRouter {
    /// Routes connections from each source IP of `routes` to its address, and the others
    /// to `default`. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// If the listening socket cannot be bound.
    pub async fn start(
        routes: Vec<(IpAddr, SocketAddr)>,
        default: SocketAddr,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let accept_task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, peer)) => {
                            let target = routes
                                .iter()
                                .find(|(source, _)| *source == peer.ip())
                                .map_or(default, |(_, target)| *target);
                            connections.spawn(splice(client, target));
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "source router: accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Self { addr, accept_task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for SourceRouter {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// Copies both ways between `client` and a new connection to `target` until either
/// closes; an error on one side resets the other.
async fn splice(mut client: TcpStream, target: SocketAddr) {
    let upstream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await;
    let Ok(Ok(mut upstream)) = upstream else {
        abort(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if tokio::io::copy_bidirectional(&mut client, &mut upstream)
        .await
        .is_err()
    {
        abort(&client);
        abort(&upstream);
    }
}
