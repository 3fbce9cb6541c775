//! The conformance factory for `postgres://`: a PostgreSQL server from the harness, the
//! factory's own (for faults on the server) or shared by the factories of a test binary
//! ([`PostgresFactory::shared`]), each in a schema of its own, and killed when the last
//! of them drops.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{connect_patiently, Crash, Factory, ServerLease};
use harness::shared::{namespace, Shared};
use harness::{or_skip, Deployment, Postgres, PostgresOptions, PostgresServer};
use lab::chaos::{ChaosTarget, Link, ServerControl, Topology};
use lock_core::{DistributedLock, LockName, LockOptions, OwnerToken};
use lock_postgres::{PostgresConfig, PostgresLock};

/// The server the shared factories of a test binary use.
static SINGLE: Shared<Servers> = Shared::new();

/// The servers behind a factory.
pub type Servers = Deployment<Postgres>;

/// Debug logs of the backend and the core into the test's captured output (shown when a
/// test fails); `RUST_LOG` overrides the filter.
pub fn trace() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("lock_postgres=debug,lock_core=debug")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Starts a server; `None` (after a loud notice) when PostgreSQL is not installed and
/// strict mode is off.
pub async fn single() -> Option<PostgresServer> {
    or_skip(PostgresServer::start().await)
}

/// Options with `ttl`.
pub use conformance::with_ttl;

/// A config for `addrs` in `schema` with `options`.
pub fn config(addrs: &[SocketAddr], schema: &str, options: LockOptions) -> PostgresConfig {
    plain_config(addrs, schema, options)
}

fn plain_config(addrs: &[SocketAddr], schema: &str, options: LockOptions) -> PostgresConfig {
    let mut config = PostgresConfig::new(addrs.iter().map(ToString::to_string))
        .with_schema(schema)
        .with_options(options);
    config.username = Some("postgres".into());
    config.dbname = Some("postgres".into());
    // The schema tells a factory's connections from other tests' on a shared server.
    config.application_name = format!("distlock {schema}");
    config
}

/// A lock client of `addrs` in `schema`, taking advisory locks too if `advisory`.
pub async fn client(
    addrs: &[SocketAddr],
    schema: &str,
    options: LockOptions,
    advisory: bool,
) -> Arc<PostgresLock> {
    let mut config = config(addrs, schema, options);
    config.advisory_locks = advisory;
    let client = connect_patiently("postgres lock client connects", || {
        PostgresLock::connect(config.clone())
    });
    Arc::new(client.await)
}

/// Clients of one PostgreSQL deployment, in a schema of the factory's own.
pub struct PostgresFactory {
    /// The server, this factory's own or shared with other factories.
    pub servers: Arc<Servers>,
    schema: String,
    /// Its clients also take advisory locks (`advisory_locks=on`).
    advisory: bool,
    proxies: Mutex<Vec<Link>>,
    clients: Mutex<Vec<Weak<PostgresLock>>>,
}

impl PostgresFactory {
    /// A factory over a fresh server of its own.
    pub async fn start() -> Option<Self> {
        Self::start_with(PostgresOptions::default()).await
    }

    /// A factory over a fresh server of its own, started with `options` (a movable wall
    /// clock for the clock jumps).
    pub async fn start_with(options: PostgresOptions) -> Option<Self> {
        let server = or_skip(PostgresServer::start_with(options).await)?;
        Some(Self::over(Arc::new(Deployment::Single(Box::new(server)))).await)
    }

    /// A factory over the server the factories of this test binary share, started now
    /// if none runs, in a schema of its own.
    pub async fn shared() -> Option<Self> {
        let servers = SINGLE
            .get_or_start(|| async { Some(Deployment::Single(Box::new(single().await?))) })
            .await?;
        Some(Self::over(servers).await)
    }

    async fn over(servers: Arc<Servers>) -> Self {
        lock_core::raw::driver::register::<lock_postgres::PostgresBackend>();
        PostgresFactory {
            servers,
            schema: format!("t_{}", namespace()),
            advisory: false,
            proxies: Mutex::new(Vec::new()),
            clients: Mutex::new(Vec::new()),
        }
    }

    /// The same factory whose clients also take advisory locks (`advisory_locks=on`).
    pub fn with_advisory_locks(mut self) -> Self {
        self.advisory = true;
        self
    }

    /// The schema of this factory's lock tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// A fresh connection for reaching behind the library's back (a fresh one each
    /// time: a fault scenario restarts the server), tried for up to 10 s.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.servers.members()[0].connect().await {
                Ok(client) => return client,
                Err(err) if tokio::time::Instant::now() < give_up => {
                    tracing::debug!(error = %err, "admin connection failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => panic!("admin connection to postgres: {err}"),
            }
        }
    }

    /// A lock client of this factory, as the library's own type.
    pub async fn typed_client(&self, options: LockOptions) -> Arc<PostgresLock> {
        let client = client(&self.servers.addrs(), &self.schema, options, self.advisory).await;
        self.track(&client);
        client
    }

    /// Ends every server connection of this factory's clients (their statement pools,
    /// listening and holding connections), as an operator would with
    /// `pg_terminate_backend`; how many it ended.
    pub async fn terminate_clients(&self) -> i64 {
        let mut names = vec![format!("distlock {}", self.schema)];
        names.extend(
            self.clients
                .lock()
                .expect("clients")
                .iter()
                .filter_map(Weak::upgrade)
                .map(|client| format!("distlock:{}", client.backend().client_id())),
        );
        let row = self
            .admin()
            .await
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = ANY($1) AND pid <> pg_backend_pid()",
                &[&names],
            )
            .await
            .expect("terminate the clients' connections");
        row.get(0)
    }

    fn track(&self, client: &Arc<PostgresLock>) {
        self.clients
            .lock()
            .expect("clients")
            .push(Arc::downgrade(client));
    }

    /// Whether the factory's tables exist yet (no client connected: they do not).
    async fn has_tables(&self) -> bool {
        let row = self
            .admin()
            .await
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&format!("\"{}\".entries", self.schema)],
            )
            .await
            .expect("look up the entries table");
        row.get(0)
    }
}

#[async_trait]
impl Factory for PostgresFactory {
    fn label(&self) -> String {
        format!(
            "postgres {} schema {}",
            self.servers.hosts().join(","),
            self.schema
        )
    }

    fn url(&self) -> String {
        format!(
            "postgres://postgres@{}/postgres?schema={}{}",
            self.servers.hosts().join(","),
            self.schema,
            if self.advisory {
                "&advisory_locks=on"
            } else {
                ""
            }
        )
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        self.typed_client(options).await
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let (client, link) = self.linked_client(options).await;
        (client, Box::new(link))
    }

    /// Deletes the oldest holder's entry: the next in line takes over.
    async fn steal(&self, name: &LockName) {
        let sql = format!(
            "DELETE FROM \"{s}\".entries WHERE seq = (SELECT seq FROM \"{s}\".entries \
             WHERE name = $1 AND granted ORDER BY seq LIMIT 1)",
            s = self.schema
        );
        self.admin()
            .await
            .execute(&sql, &[&name.as_str()])
            .await
            .expect("steal: delete the holder's entry");
    }

    /// The time left to the entry carrying `owner`, by the server's clock.
    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        if !self.has_tables().await {
            return ServerLease::Absent;
        }
        let sql = format!(
            "SELECT (extract(epoch FROM (expires_at - clock_timestamp())) * 1000)::float8 \
             FROM \"{}\".entries WHERE name = $1 AND owner = $2",
            self.schema
        );
        let row = self
            .admin()
            .await
            .query_opt(&sql, &[&name.as_str(), &owner.as_str()])
            .await
            .expect("read an entry's expiry");
        match row.map(|row| row.get::<_, f64>(0)) {
            Some(ms) if ms > 0.0 => ServerLease::Left(Duration::from_secs_f64(ms / 1000.0)),
            _ => ServerLease::Absent,
        }
    }

    fn lease_resolution(&self) -> Duration {
        Duration::from_millis(5)
    }

    /// Entries of `names`, live or not yet purged.
    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        if !self.has_tables().await {
            return Vec::new();
        }
        let sql = format!(
            "SELECT name, seq, kind, granted, owner FROM \"{}\".entries \
             WHERE name = ANY($1) ORDER BY name, seq",
            self.schema
        );
        let names: Vec<&str> = names.iter().map(LockName::as_str).collect();
        let rows = self
            .admin()
            .await
            .query(&sql, &[&names])
            .await
            .expect("read the entries left");
        rows.iter()
            .map(|row| {
                let (name, seq, kind, granted, owner): (String, i64, String, bool, String) =
                    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
                let state = if granted { "holder" } else { "waiter" };
                format!("{name:?}: {kind} {state} entry {seq} of {owner}")
            })
            .collect()
    }
}

#[async_trait]
impl ChaosTarget for PostgresFactory {
    fn topology(&self) -> Topology {
        Topology::Single { durable: true }
    }

    fn wall_clock_leases(&self) -> Option<&'static str> {
        Some(
            "PostgreSQL times leases by its wall clock (`now()`): a step ahead past the TTL \
             ends the hold on the server at once, while the holder's guard, timed on the \
             client's monotonic clock, vouches for it until its next renewal finds it gone",
        )
    }

    async fn linked_client(&self, options: LockOptions) -> (Arc<dyn DistributedLock>, Link) {
        let (link, addrs) = Link::proxied(&self.servers.addrs()).await;
        let client = client(&addrs, &self.schema, options, self.advisory).await;
        self.track(&client);
        self.proxies.lock().expect("proxies").push(link.clone());
        (client, link)
    }

    fn servers(&self) -> Vec<&dyn ServerControl> {
        self.servers.controls()
    }

    async fn leader(&self) -> Option<usize> {
        None
    }
}

impl std::fmt::Debug for PostgresFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresFactory")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}
