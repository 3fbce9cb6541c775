//! Talking to PostgreSQL: a pool of connections for statements ([`PgClient`]), every
//! call bounded by the request timeout on both ends (the client drops it; the server
//! cancels a statement, a lock wait or an idle transaction that outlives it), and one
//! more connection that `LISTEN`s on the schema's channel and wakes the subscribers of
//! the name each notification carries ([`Listener`]).
//!
//! The pool is deadpool's; statements are prepared once per connection and cached, so a
//! statement costs one round trip, and the statements of one step are pipelined.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures::StreamExt;
use lock_core::raw::plumbing::Backoff;
use lock_core::{Error, Result};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::types::ToSql;
use tokio_postgres::AsyncMessage;

use crate::config::{PostgresConfig, SslMode, DEFAULT_PORT};
use crate::error::{from_client, BACKEND};
use crate::layout::quote_ident;
use crate::tls::Connector;

/// The client side of the database: a pool, the request timeout, the schema.
#[derive(Clone)]
pub(crate) struct PgClient {
    pool: Pool,
    timeout: Duration,
    /// The quoted schema name, to put before table names.
    pub(crate) schema: Arc<str>,
    /// The `LISTEN` channel (the schema's name, unquoted, as `pg_notify` takes it).
    pub(crate) channel: Arc<str>,
}

impl std::fmt::Debug for PgClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClient")
            .field("schema", &self.schema)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The client library's configuration of `config`, with the server-side bounds.
pub(crate) fn pg_config(config: &PostgresConfig) -> tokio_postgres::Config {
    let timeout = config.options.request_timeout;
    let mut pg = tokio_postgres::Config::new();
    for address in &config.hosts {
        let (host, port) = split_host_port(address);
        pg.host(host).port(port);
    }
    pg.user(config.user());
    if let Some(password) = &config.password {
        pg.password(password);
    }
    pg.ssl_mode(match config.sslmode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    pg.dbname(config.dbname.as_deref().unwrap_or(config.user()))
        .application_name(&config.application_name)
        .connect_timeout(config.connect_timeout.unwrap_or(timeout))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .target_session_attrs(if config.read_write {
            TargetSessionAttrs::ReadWrite
        } else {
            TargetSessionAttrs::Any
        });
    // A statement, a lock wait or an idle transaction left by a client that stopped
    // mid-way never outlives the request timeout on the server either.
    let ms = timeout.as_millis();
    pg.options(format!(
        "-c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={ms}"
    ));
    pg
}

/// `host` and port of `host:port` (`[v6]:port`), the default port when none is given.
fn split_host_port(address: &str) -> (&str, u16) {
    let (host, port) = match address.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && port.chars().all(|c| c.is_ascii_digit()) => {
            (host, port.parse().unwrap_or(DEFAULT_PORT))
        }
        _ => (address, DEFAULT_PORT),
    };
    (host.trim_start_matches('[').trim_end_matches(']'), port)
}

impl PgClient {
    /// A pool for `config` whose connections use `tls` (no connection yet: see
    /// [`PgClient::setup`]).
    pub(crate) fn new(config: &PostgresConfig, tls: Connector) -> Result<PgClient> {
        let manager = Manager::from_config(
            pg_config(config),
            tls.make(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let timeout = config.options.request_timeout;
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|err| Error::config(format!("postgres pool: {err}")))?;
        Ok(PgClient {
            pool,
            timeout,
            schema: quote_ident(&config.schema).into(),
            channel: config.schema.clone().into(),
        })
    }

    /// The request timeout.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// How long after it is dropped a step sent on a connection may still commit: the
    /// server ends each statement and lock wait at the request timeout, and a step's
    /// only wait is its first (the name's lock); a margin for the rest.
    pub(crate) fn in_flight_bound(&self) -> Duration {
        self.timeout + Duration::from_millis(250)
    }

    /// Creates the schema and its tables if missing (serialised between clients by a
    /// transaction-scoped advisory lock: concurrent `CREATE … IF NOT EXISTS` may fail).
    pub(crate) async fn setup(&self) -> Result<()> {
        let ddl = crate::layout::schema_ddl(self.channel.as_ref());
        let key = format!("distlock schema {}", self.channel);
        self.run("creating the lock tables", async |conn| {
            conn.begin();
            let c = conn.client();
            let key: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
            let (begun, locked) = futures::join!(
                c.batch_execute("BEGIN"),
                c.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    &key
                ),
            );
            begun?;
            locked?;
            c.batch_execute(&ddl).await?;
            conn.commit().await?;
            Ok(())
        })
        .await
    }

    /// Runs `work` on a pooled connection within the request timeout (the wait for a
    /// connection included), mapping its errors as doing `what`. A connection left in a
    /// transaction (`work` failed or was dropped mid-way) is closed, not pooled again:
    /// the server rolls the transaction back.
    pub(crate) async fn run<T, F>(&self, what: &str, work: F) -> Result<T>
    where
        F: AsyncFnOnce(&mut Conn) -> std::result::Result<T, Failure>,
    {
        self.within(what, async {
            let object = self.pool.get().await.map_err(|err| pool_error(what, err))?;
            let mut conn = Conn {
                object: Some(object),
                in_tx: false,
            };
            match work(&mut conn).await {
                Ok(value) => Ok(value),
                Err(Failure::Db(err)) => Err(from_client(what, err)),
                Err(Failure::Lock(err)) => Err(err),
            }
        })
        .await
    }

    /// Runs `sql` with `params` as [`PgClient::run`] does, again with backoff (50 ms to
    /// 1 s) while it fails in a way `again` accepts and the next try starts within
    /// `give_up`; the rows it touched, or the last error.
    pub(crate) async fn execute_patiently(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        give_up: Duration,
        again: fn(&Error) -> bool,
    ) -> Result<u64> {
        let give_up = tokio::time::Instant::now() + give_up;
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let result = self
                .run(what, async |conn| {
                    let statement = conn.statement(sql).await?;
                    Ok(conn.client().execute(&statement, params).await?)
                })
                .await;
            let pause = backoff.next_pause();
            match result {
                Err(err) if again(&err) && tokio::time::Instant::now() + pause < give_up => {
                    tracing::debug!(what, error = %err, "failed; again");
                    tokio::time::sleep(pause).await;
                }
                other => return other,
            }
        }
    }

    /// `future` within the request timeout.
    pub(crate) async fn within<T>(
        &self,
        what: &str,
        future: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, future).await {
            Ok(result) => result,
            Err(_) => Err(Error::no_answer(BACKEND, what, self.timeout)),
        }
    }

    /// Ends the pool's connections.
    pub(crate) fn close(&self) {
        self.pool.close();
    }
}

/// What a step on a connection may fail with: the server's error, or the protocol's.
#[derive(Debug)]
pub(crate) enum Failure {
    Db(tokio_postgres::Error),
    Lock(Error),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(err: tokio_postgres::Error) -> Self {
        Failure::Db(err)
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure::Lock(err)
    }
}

/// A pooled connection lent to one step. Dropped inside a transaction (the step failed
/// or its future was dropped), it is taken out of the pool and closed.
pub(crate) struct Conn {
    object: Option<Object>,
    in_tx: bool,
}

impl Conn {
    fn object(&self) -> &Object {
        self.object
            .as_ref()
            .expect("a lent connection is present until dropped")
    }

    /// The connection.
    pub(crate) fn client(&self) -> &tokio_postgres::Client {
        self.object()
    }

    /// `sql`, prepared once per connection.
    pub(crate) async fn statement(
        &self,
        sql: &str,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        self.object().prepare_cached(sql).await
    }

    /// Marks the connection as in a transaction: the caller sends `BEGIN` (pipelined
    /// with the transaction's first statements).
    pub(crate) fn begin(&mut self) {
        self.in_tx = true;
    }

    /// Sends `COMMIT` (of an aborted transaction: a rollback).
    pub(crate) async fn commit(&mut self) -> std::result::Result<(), tokio_postgres::Error> {
        self.client().batch_execute("COMMIT").await?;
        self.in_tx = false;
        Ok(())
    }

    /// Marks a transaction ended by a `COMMIT` the caller pipelined and saw answered.
    pub(crate) fn committed(&mut self) {
        self.in_tx = false;
    }

    /// Sends `ROLLBACK`.
    pub(crate) async fn rollback(&mut self) -> std::result::Result<(), tokio_postgres::Error> {
        self.client().batch_execute("ROLLBACK").await?;
        self.in_tx = false;
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            if self.in_tx {
                drop(Object::take(object));
            }
        }
    }
}

fn pool_error(what: &str, err: deadpool_postgres::PoolError) -> Error {
    match err {
        deadpool_postgres::PoolError::Backend(err) => from_client(what, err),
        deadpool_postgres::PoolError::Closed => Error::closed(BACKEND, what.to_owned()),
        other => Error::connection(BACKEND, format!("{what}: no connection"), other.to_string()),
    }
}

/// One connection that listens on the schema's channel, reconnecting with backoff, and
/// whom it wakes. A notification's payload is `-<seq>:<name>` when entry `seq` of `name`
/// left the queue or changed its kind (`0`: any entry), `+:<name>` for any other change
/// (a grant, a proclaim). Observers of a name are woken by every change; a waiter only
/// when an entry it waits for ([`Waiter::watch`]) left or changed, so that a release
/// wakes the waiter it may grant, not every waiter of the name. After a reconnect (which
/// may have missed notifications) everyone is woken.
#[derive(Debug)]
pub(crate) struct Listener {
    subscribers: Arc<Mutex<Subscribers>>,
    task: JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Subscribers {
    observers: HashMap<String, watch::Sender<u64>>,
    waiters: HashMap<String, Vec<Weak<Waiting>>>,
}

/// What one waiter waits for, and how it is woken.
#[derive(Debug, Default)]
struct Waiting {
    watched: Mutex<Watched>,
    woken: Notify,
}

/// The entries a waiter watches, and those that left since it last chose them (so that
/// one leaving between its read of the queue and its choice still wakes it).
#[derive(Debug, Default)]
struct Watched {
    seqs: Vec<i64>,
    left_since: Vec<i64>,
    /// More left than are kept: the next choice wakes the waiter at once.
    overflow: bool,
}

/// How many left entries a waiter keeps between two choices.
const LEFT_KEPT: usize = 256;

/// One waiter's subscription to the changes of a name (see [`Listener`]).
#[derive(Debug)]
pub(crate) struct Waiter {
    waiting: Arc<Waiting>,
}

impl Waiter {
    /// Wakes this waiter when one of `seqs` leaves or changes (from now on).
    pub(crate) fn watch(&self, seqs: impl IntoIterator<Item = i64>) {
        let mut watched = lock(&self.waiting.watched);
        watched.seqs.clear();
        watched.seqs.extend(seqs);
        let missed = watched.overflow
            || watched
                .left_since
                .iter()
                .any(|seq| watched.seqs.contains(seq));
        watched.left_since.clear();
        watched.overflow = false;
        if missed {
            self.waiting.woken.notify_one();
        }
    }

    /// Resolves at the next wake-up (at once if one came since the last).
    pub(crate) async fn woken(&self) {
        self.waiting.woken.notified().await;
    }
}

impl Listener {
    /// Starts listening for `config`, over `tls`.
    pub(crate) fn start(config: &PostgresConfig, tls: Connector) -> Listener {
        let subscribers: Arc<Mutex<Subscribers>> = Arc::default();
        let task = tokio::spawn(listen(
            pg_config(config),
            tls,
            config.schema.clone(),
            Arc::clone(&subscribers),
        ));
        Listener { subscribers, task }
    }

    /// A counter bumped at each change of `name` from now on.
    pub(crate) fn observe(&self, name: &str) -> watch::Receiver<u64> {
        let mut subscribers = lock(&self.subscribers);
        let observers = &mut subscribers.observers;
        observers.retain(|_, sender| sender.receiver_count() > 0);
        match observers.get(name) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                observers.insert(name.to_owned(), sender);
                receiver
            }
        }
    }

    /// A waiter on `name`, watching nothing yet.
    pub(crate) fn wait_on(&self, name: &str) -> Waiter {
        let waiting = Arc::new(Waiting::default());
        let mut subscribers = lock(&self.subscribers);
        let waiters = subscribers.waiters.entry(name.to_owned()).or_default();
        waiters.retain(|w| w.strong_count() > 0);
        waiters.push(Arc::downgrade(&waiting));
        subscribers.waiters.retain(|_, w| !w.is_empty());
        Waiter { waiting }
    }
}

impl Listener {
    /// Stops listening, waking everyone (nothing will wake them any more).
    pub(crate) fn stop(&self) {
        self.task.abort();
        wake(&self.subscribers, None);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wakes whom a notification with `payload` concerns (`None`: everyone).
fn wake(subscribers: &Mutex<Subscribers>, payload: Option<&str>) {
    let subscribers = lock(subscribers);
    let bump = |sender: &watch::Sender<u64>| sender.send_modify(|n| *n = n.wrapping_add(1));
    let wake_waiter = |waiting: &Weak<Waiting>, seq: Option<i64>| {
        if let Some(waiting) = waiting.upgrade() {
            let concerned = match seq {
                None | Some(0) => true,
                Some(seq) => {
                    let mut watched = lock(&waiting.watched);
                    if watched.left_since.len() < LEFT_KEPT {
                        watched.left_since.push(seq);
                    } else {
                        watched.overflow = true;
                    }
                    watched.seqs.contains(&seq)
                }
            };
            if concerned {
                waiting.woken.notify_one();
            }
        }
    };
    let Some(payload) = payload else {
        subscribers.observers.values().for_each(bump);
        for waiting in subscribers.waiters.values().flatten() {
            wake_waiter(waiting, None);
        }
        return;
    };
    let Some((head, name)) = payload.split_once(':') else {
        return;
    };
    subscribers.observers.get(name).into_iter().for_each(bump);
    if let Some(seq) = head
        .strip_prefix('-')
        .and_then(|seq| seq.parse::<i64>().ok())
    {
        for waiting in subscribers.waiters.get(name).into_iter().flatten() {
            wake_waiter(waiting, Some(seq));
        }
    }
}

/// The listening loop: connect, `LISTEN`, wake everyone (changes may have been missed
/// while not listening), forward notifications until the connection ends; again after a
/// pause. Ends when the task is aborted (the client dropped).
async fn listen(
    config: tokio_postgres::Config,
    tls: Connector,
    channel: String,
    subscribers: Arc<Mutex<Subscribers>>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match config.connect(tls.make()).await {
            Ok((client, mut connection)) => {
                let mut messages =
                    futures::stream::poll_fn(move |cx| connection.poll_message(cx)).fuse();
                let statement = format!("LISTEN {}", quote_ident(&channel));
                let listening = {
                    let listen = client.batch_execute(&statement);
                    let mut listen = std::pin::pin!(listen);
                    loop {
                        tokio::select! {
                            done = &mut listen => break done.is_ok(),
                            message = messages.next() => match message {
                                Some(Ok(_)) => {}
                                Some(Err(_)) | None => break false,
                            },
                        }
                    }
                };
                if listening {
                    backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
                    wake(&subscribers, None);
                    while let Some(Ok(message)) = messages.next().await {
                        if let AsyncMessage::Notification(n) = message {
                            if n.channel() == channel {
                                wake(&subscribers, Some(n.payload()));
                            }
                        }
                    }
                    tracing::debug!(channel, "the listening connection ended; reconnecting");
                }
                drop(client);
            }
            Err(err) => tracing::debug!(channel, error = %err, "listening connection failed"),
        }
        tokio::time::sleep(backoff.next_pause()).await;
    }
}
