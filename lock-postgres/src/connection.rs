//! Talking to PostgreSQL: a pool of connections for statements ([`PgClient`]), every
//! call bounded by the request timeout on both ends (the client drops it; the server
//! cancels a statement, a lock wait or an idle transaction that outlives it). The
//! connection that `LISTEN`s is [`crate::listener`]'s.
//!
//! The pool is deadpool's; statements are prepared once per connection and cached, so a
//! statement costs one round trip, and the statements of one step are pipelined.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use lock_core::raw::plumbing::Backoff;
use lock_core::{Error, Result};
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::types::ToSql;

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
