//! What a backend provides to run the suite: independent clients and a few hooks that
//! reach behind the library (steal a lock, cut a client off, list what is left).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::plumbing::Backoff;
use lock_core::{
    DistributedLock, DistributedLockExt, LockGuard, LockName, LockOptions, OwnerToken,
};
use tokio::time::{sleep, Instant};

/// What the server keeps of one hold, read behind the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerLease {
    /// The factory cannot read it (the check is skipped).
    Unknown,
    /// The server has no such hold.
    Absent,
    /// The server keeps the hold at least this long from the moment it answered
    /// (where a hold lives as long as its client keeps a session alive, the longest the
    /// server keeps a silent session).
    Left(Duration),
}

/// Cuts a client off from its server as a crash or a partition would: afterwards the
/// client sends nothing that arrives and releases nothing, so its holds end only by
/// the server-side TTL (or session timeout).
#[async_trait]
pub trait Crash: Send + Sync {
    /// Cuts the client off.
    async fn crash(&self);
}

/// Makes clients of one backend for the suite.
///
/// Each client is independent (its own connection or session), so contention in the
/// suite crosses connections as it does between processes.
#[async_trait]
pub trait Factory: Send + Sync {
    /// A label for messages (`memory`, `redis 127.0.0.1:6379`, …).
    fn label(&self) -> String;

    /// A URL that reaches this backend with default options. Its query string, if it has
    /// one, says only where the factory's locks live (a key prefix, the CA of a TLS
    /// deployment); options go after it with [`with_query`].
    fn url(&self) -> String;

    /// The shortest TTL the timing rules use on this backend (small enough for fast tests,
    /// large enough for the backend's minimum lease).
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// A new independent client.
    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock>;

    /// A new independent client that [`Crash::crash`] can cut off.
    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>);

    /// Removes the lock `name` on the server behind its holder's back (as an operator,
    /// an early expiry or a clock jump would). The next waiter may then take it.
    async fn steal(&self, name: &LockName);

    /// Anything left on the server for `names` (held keys, queued nodes, waiter entries,
    /// leases), described for a failure message. Empty when nothing is left.
    async fn leftovers(&self, names: &[LockName]) -> Vec<String>;

    /// Turns the waiter queue on or off for the clients made after this call, where the
    /// backend offers the choice; returns whether it does (by default it does not).
    fn set_queue(&self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// What the server keeps of the hold of `owner` on `name`, read behind the library
    /// (the lease [`oracle`](crate::oracle) compares it with what the guard promises).
    /// By default [`ServerLease::Unknown`]: the oracle skips the backend.
    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        let _ = (name, owner);
        ServerLease::Unknown
    }

    /// The resolution of [`Factory::server_lease`]'s readings (1 ms on Redis, a second
    /// on etcd, whose lease TTLs are whole seconds).
    fn lease_resolution(&self) -> Duration {
        Duration::from_millis(50)
    }
}

/// What the suite macros accept from a factory expression: a factory, or `None` when
/// its server could not be started because a binary is missing and strict mode is off
/// (the lab's harness has said so loudly: `harness::or_skip`).
pub trait StartedFactory {
    /// The factory type.
    type Factory;
    /// The factory, or `None` to skip the test.
    fn started(self) -> Option<Self::Factory>;
}

impl<F: Factory> StartedFactory for F {
    type Factory = F;
    fn started(self) -> Option<F> {
        Some(self)
    }
}

impl<F: Factory> StartedFactory for Option<F> {
    type Factory = F;
    fn started(self) -> Option<F> {
        self
    }
}

/// `url` with `query` (`key=value&...`) added to its query string: after `?`, or after `&`
/// when it has one already.
pub fn with_query(url: &str, query: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{query}")
}

/// Default options with `ttl`: the options most tests give their clients.
pub fn with_ttl(ttl: Duration) -> LockOptions {
    let mut options = LockOptions::default();
    options.ttl = ttl;
    options
}

/// How long [`connect_patiently`] keeps trying.
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// Connects a test client with `connect`, retrying retryable errors for up to
/// [`CONNECT_PATIENCE`]: connects fail fast, and a service still recovering from a fault
/// (an ensemble electing a leader after it was stopped) refuses new clients for a while.
/// Panics with the last error after that, or at once on an error that is not retryable.
pub async fn connect_patiently<T, F, Fut>(what: &str, mut connect: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = lock_core::Result<T>>,
{
    let give_up = Instant::now() + CONNECT_PATIENCE;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match connect().await {
            Ok(client) => return client,
            Err(err) if err.is_retryable() && Instant::now() < give_up => {
                tracing::debug!(what, error = %err, "connect failed; retrying");
                sleep(backoff.next_pause()).await;
            }
            Err(err) => panic!("{what}: {err:?}"),
        }
    }
}

/// Acquires `name` on `client`, retrying retryable errors (a server restarting, a failover
/// in progress) for up to `patience`; each attempt waits for the lock for as long as is
/// left. Panics with the last error after that, or at once on an error that is not
/// retryable.
pub async fn lock_patiently(
    client: &dyn DistributedLock,
    name: &LockName,
    patience: Duration,
) -> LockGuard {
    let give_up = Instant::now() + patience;
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        match client.lock_timeout(name.as_str(), left).await {
            Ok(guard) => return guard,
            Err(err) if err.is_retryable() && Instant::now() < give_up => {
                sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("acquire of {name}: {err:?}"),
        }
    }
}
