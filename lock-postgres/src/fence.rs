//! A fenced resource on PostgreSQL ([`PostgresFence`]): a row per resource in a table the
//! user names, its newest token and value changed by one conditional upsert.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lock_core::fence::{FenceOutcome, Fenced, FencedStore};
use lock_core::raw::url::LockUrl;
use lock_core::{Error, FencingToken, Result};
use tokio_postgres::types::ToSql;

use crate::config::PostgresConfig;
use crate::connection::PgClient;
use crate::error::BACKEND;
use crate::layout::quote_ident;

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN` - 1).
const MAX_IDENT_BYTES: usize = 63;

/// A fenced resource on PostgreSQL: the row `resource` of `table` (in the configuration's
/// schema), with columns `resource text PRIMARY KEY, token bigint, value bytea`
/// ([`PostgresFence::create_table`] makes it).
///
/// A write is one statement, `INSERT … ON CONFLICT (resource) DO UPDATE … WHERE
/// token <= $token`: the server takes the row lock, compares and writes as one step (a
/// concurrent writer waits for the row, then compares against what committed), and the
/// token commits with the value in the same transaction, as durable as the server makes
/// its commits (`synchronous_commit`; a failover to an asynchronous standby can lose the
/// newest token with its value). Tokens above `i64::MAX` do not fit a `bigint` and are
/// refused with [`Error::Unsupported`].
///
/// Built from the same configuration or URL as a lock client (`postgres://`, with its TLS
/// and credentials); the pool's waits, every statement (client and server side:
/// `statement_timeout`) are bounded by the request timeout.
#[derive(Clone)]
pub struct PostgresFence {
    shared: Arc<Shared>,
    resource: Arc<str>,
}

struct Shared {
    client: PgClient,
    /// `"schema"`.
    schema: String,
    /// `"schema"."table"`.
    table: String,
    /// Statements, written once for this table.
    write: String,
    newest: String,
    read: String,
}

impl fmt::Debug for PostgresFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresFence")
            .field("table", &self.shared.table)
            .field("resource", &self.resource)
            .finish()
    }
}

impl PostgresFence {
    /// The row `resource` of `table` on the server `url` names (a lock URL; `?schema=`
    /// names the table's schema), once the server answers.
    ///
    /// # Errors
    /// As [`PostgresFence::open`], and [`Error::InvalidConfig`] for a malformed URL.
    pub async fn connect(url: &str, table: &str, resource: &str) -> Result<Self> {
        let config = PostgresConfig::from_url(&LockUrl::parse(url)?)?;
        Self::open(&config, table, resource).await
    }

    /// The row `resource` of `table` in the schema of `config` (a lock client's own),
    /// once the server answers. The table must exist: see [`PostgresFence::create_table`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid configuration, an empty or too long table
    /// name, or a resource name that is empty or holds a NUL; the server's error when it
    /// does not answer within the request timeout.
    pub async fn open(config: &PostgresConfig, table: &str, resource: &str) -> Result<Self> {
        config.validate()?;
        if table.is_empty() || table.len() > MAX_IDENT_BYTES {
            return Err(Error::config(format!(
                "a fenced table's name needs 1 to {MAX_IDENT_BYTES} bytes"
            )));
        }
        let resource = checked_resource(resource)?;
        let tls = crate::tls::connector(config).await?;
        let client = PgClient::new(config, tls)?;
        let schema = quote_ident(&config.schema);
        let table = format!("{schema}.{}", quote_ident(table));
        let shared = Shared {
            write: format!(
                "INSERT INTO {table} AS r (resource, token, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, \
                 value = EXCLUDED.value WHERE r.token <= EXCLUDED.token RETURNING r.token"
            ),
            newest: format!("SELECT token FROM {table} WHERE resource = $1"),
            read: format!("SELECT token, value FROM {table} WHERE resource = $1"),
            schema,
            table,
            client,
        };
        shared
            .client
            .run("connecting", async |conn| {
                conn.client().simple_query("SELECT 1").await?;
                Ok(())
            })
            .await?;
        Ok(PostgresFence {
            shared: Arc::new(shared),
            resource,
        })
    }

    /// Creates the schema and the table if missing (serialised between clients by a
    /// transaction-scoped advisory lock: concurrent `CREATE … IF NOT EXISTS` may fail).
    ///
    /// # Errors
    /// The server's error (a missing privilege, a table of that name with other columns
    /// is found at the first write instead).
    pub async fn create_table(&self) -> Result<()> {
        let Shared { schema, table, .. } = &*self.shared;
        let ddl = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; CREATE TABLE IF NOT EXISTS {table} \
             (resource text PRIMARY KEY, token bigint NOT NULL, value bytea NOT NULL)"
        );
        let key = format!("distlock fenced table {table}");
        self.shared
            .client
            .run("creating a fenced table", async |conn| {
                conn.begin();
                let c = conn.client();
                c.batch_execute("BEGIN").await?;
                c.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    &[&key],
                )
                .await?;
                c.batch_execute(&ddl).await?;
                conn.commit().await?;
                Ok(())
            })
            .await
    }

    /// Another row, `resource`, of the same table on the same pool.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a resource name that is empty or holds a NUL.
    pub fn resource(&self, resource: &str) -> Result<Self> {
        Ok(PostgresFence {
            shared: self.shared.clone(),
            resource: checked_resource(resource)?,
        })
    }

    /// The resource's name (its row's key).
    pub fn name(&self) -> &str {
        &self.resource
    }
}

fn checked_resource(resource: &str) -> Result<Arc<str>> {
    if resource.is_empty() || resource.contains('\0') {
        return Err(Error::config(
            "a fenced resource needs a non-empty name without NUL",
        ));
    }
    Ok(resource.into())
}

/// A token as a `bigint`.
fn bigint(token: FencingToken) -> Result<i64> {
    i64::try_from(token.get()).map_err(|_| {
        Error::unsupported(BACKEND, "a fencing token above 2^63 - 1 (a bigint column)")
    })
}

/// A `bigint` token read back.
fn token_of(stored: i64) -> Result<FencingToken> {
    u64::try_from(stored)
        .map(FencingToken)
        .map_err(|_| Error::Protocol {
            backend: BACKEND,
            message: format!("a fenced row holds the negative token {stored}"),
            source: None,
        })
}

#[async_trait]
impl FencedStore for PostgresFence {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        let offered = bigint(token)?;
        let shared = &self.shared;
        let resource: &str = &self.resource;
        let newest = shared
            .client
            .run("fenced write", async |conn| {
                let write = conn.statement(&shared.write).await?;
                let params: [&(dyn ToSql + Sync); 3] = [&resource, &offered, &value];
                if conn.client().query_opt(&write, &params).await?.is_some() {
                    return Ok(None);
                }
                // Refused: the row that refused it has committed (the upsert waited for
                // it), so this later statement sees it or a newer one.
                let newest = conn.statement(&shared.newest).await?;
                let row = conn.client().query_one(&newest, &[&resource]).await?;
                Ok(Some(row.get::<_, i64>(0)))
            })
            .await?;
        Ok(match newest {
            None => FenceOutcome::Written,
            Some(newest) => FenceOutcome::Stale {
                newest: token_of(newest)?,
            },
        })
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        let shared = &self.shared;
        let resource: &str = &self.resource;
        let row = shared
            .client
            .run("fenced read", async |conn| {
                let read = conn.statement(&shared.read).await?;
                Ok(conn.client().query_opt(&read, &[&resource]).await?)
            })
            .await?;
        row.map(|row| {
            Ok(Fenced {
                token: token_of(row.get(0))?,
                value: row.get(1),
            })
        })
        .transpose()
    }
}
