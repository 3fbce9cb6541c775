//! A PostgreSQL primary with one streaming replica ([`PostgresReplicated`]), for
//! failover tests: catch-up waits and promotion.

use std::time::{Duration, Instant};

use super::super::{free_ports, with_port_retries, HarnessError};
use super::{Postgres, PostgresOptions, PostgresServer, ServerKind};

/// Bound on [`PostgresReplicated::wait_replica_caught_up`] and
/// [`PostgresReplicated::promote_replica`].
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two polls of the replica.
const POLL: Duration = Duration::from_millis(50);

/// A primary and one streaming replica (`pg_basebackup -R -X stream`, hot standby), each
/// a [`PostgresServer`] in a temp dir of its own, on its own port. Both killed on drop.
#[derive(Debug)]
pub struct PostgresReplicated {
    // Field order is drop order: the replica goes first, then its primary.
    replica: PostgresServer,
    primary: PostgresServer,
}

impl PostgresReplicated {
    /// Starts a primary and a replica of it with default options; returns once the
    /// replica is ready (accepts read-only queries).
    ///
    /// # Errors
    /// As [`PostgresServer::start`].
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(PostgresOptions::default()).await
    }

    /// Starts both servers with `options`.
    ///
    /// # Errors
    /// As [`PostgresServer::start`].
    pub async fn start_with(options: PostgresOptions) -> Result<Self, HarnessError> {
        let install = Postgres::find()?;
        let primary = PostgresServer::start_with(options.clone()).await?;
        let replica_options = PostgresOptions {
            replica_of: Some(primary.port()),
            ..options
        };
        let replica = with_port_retries(Postgres::NAME, || async {
            PostgresServer::start_on(&install, &replica_options, free_ports(1)?).await
        })
        .await?;
        Ok(Self { replica, primary })
    }

    /// The primary (the server the replica was copied from).
    pub fn primary(&self) -> &PostgresServer {
        &self.primary
    }

    /// The replica (a standby until [`promote_replica`](Self::promote_replica)).
    pub fn replica(&self) -> &PostgresServer {
        &self.replica
    }

    /// Waits until the replica has replayed the primary's WAL up to the primary's
    /// current position (read now), for at most 30 s.
    ///
    /// # Errors
    /// If the primary does not answer, or the replica does not catch up in time.
    pub async fn wait_replica_caught_up(&self) -> Result<(), HarnessError> {
        let lsn = self
            .primary
            .query_value("SELECT pg_current_wal_lsn()")
            .await?
            .unwrap_or_default();
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        self.poll_replica(&format!("replay up to {lsn}"), &sql)
            .await
    }

    /// Promotes the replica (`SELECT pg_promote()`) and waits until it is out of
    /// recovery (`pg_is_in_recovery()` false), for at most 30 s. The primary is left
    /// as it is: kill or pause it first for a failover.
    ///
    /// # Errors
    /// If the replica does not answer or is still in recovery after 30 s.
    pub async fn promote_replica(&self) -> Result<(), HarnessError> {
        let wait = REPLICATION_TIMEOUT.as_secs();
        self.replica
            .query(&format!("SELECT pg_promote(true, {wait})"))
            .await
            .or_else(|e| {
                // A promotion that outlasts the query timeout goes on: poll below.
                tracing::debug!(error = %e, "pg_promote");
                Ok::<_, HarnessError>(Vec::new())
            })?;
        self.poll_replica("leave recovery", "SELECT NOT pg_is_in_recovery()")
            .await
    }

    /// Polls `sql` on the replica until it answers `t`, for at most 30 s.
    async fn poll_replica(&self, what: &str, sql: &str) -> Result<(), HarnessError> {
        let started = Instant::now();
        loop {
            let last = match self.replica.query_value(sql).await {
                Ok(Some(v)) if v == "t" => return Ok(()),
                Ok(v) => format!("{sql} answered {v:?}"),
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= REPLICATION_TIMEOUT {
                return Err(HarnessError::Cluster {
                    cluster: format!("postgres replica {}", self.replica.addr()),
                    detail: format!("did not {what} within {REPLICATION_TIMEOUT:?}; last: {last}"),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
