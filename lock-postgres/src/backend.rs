//! [`PostgresBackend`]: opening a client (fails fast when the server does not answer,
//! creates the tables on first use), its capabilities, and the acquire / renew / release
//! orchestration over the queue ([`crate::queue`]) and the hold statements
//! ([`crate::hold`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lock_core::raw::{
    backend::{
        AcquireRequest, Acquired, Amended, Amendment, Backend, BackendRelease, ChangeFeed,
        RenewItem, RenewOutcome, SemaphoreResize, SessionStatus,
    },
    driver::Connect,
    plumbing::{Background, Cleanup, CleanupOnDrop},
    url::LockUrl,
};
use lock_core::{
    Capabilities, Error, FencingSource, FencingToken, LockName, LockOptions, Occupancy,
    Participant, Result,
};
use tokio::time::Instant;

use crate::advisory::Advisory;
use crate::config::PostgresConfig;
use crate::connection::PgClient;
use crate::error::BACKEND;
use crate::handover;
use crate::hold::{self, PostgresHold};
use crate::listener::Listener;
use crate::operator;
use crate::queue::{self, decide_turn, fence_of, Place, Step, Turn};

/// The protocol half of a PostgreSQL lock client (see the crate docs).
pub struct PostgresBackend {
    client: PgClient,
    listener: Listener,
    /// This client's id, kept on its entries (an inspection's session).
    id: String,
    label: String,
    ttl: Duration,
    recheck: Duration,
    mark_ttl: Duration,
    /// The cleanups of abandoned acquires, which closing waits for.
    background: Background,
    /// The sweep of dead entries ([`operator::sweep_forever`]).
    sweeper: tokio::task::JoinHandle<()>,
    closed: AtomicBool,
    /// The holding connection of advisory locks, with `advisory_locks=on`.
    advisory: Option<Arc<Advisory>>,
    /// The queue's statements, formatted once.
    queue_sql: queue::Statements,
    /// The release's statements ([`crate::handover`]), formatted once.
    handover_sql: handover::Statements,
    /// The deletes of the entries of ended holding sessions ([`hold::end_with_sessions`]).
    session_holds: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        self.sweeper.abort();
        if let Some(task) = &self.session_holds {
            task.abort();
        }
    }
}

/// Opened with [`lock_core::Error::InvalidConfig`] for a bad configuration or refused
/// credentials; [`lock_core::Error::Connection`] when no server answers within the
/// request timeout.
#[async_trait]
impl Connect for PostgresBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = PostgresConfig;

    fn config_from_url(url: &LockUrl) -> Result<PostgresConfig> {
        PostgresConfig::from_url(url)
    }

    fn validate(config: &PostgresConfig) -> Result<()> {
        config.validate()
    }

    fn lock_options(config: &PostgresConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: PostgresConfig) -> Result<PostgresBackend> {
        let tls = crate::tls::connector(&config).await?;
        let client = PgClient::new(&config, tls.clone())?;
        client.setup().await?;
        let id = uuid::Uuid::new_v4().to_string();
        let advisory = if config.advisory_locks {
            let advisory = Advisory::new(
                crate::connection::pg_config(&config),
                tls.clone(),
                &id,
                config.options.request_timeout,
            );
            advisory.epoch().await?;
            Some(Arc::new(advisory))
        } else {
            None
        };
        let sweeper = tokio::spawn(operator::sweep_forever(
            client.clone(),
            operator::sweep_period(config.options.ttl),
        ));
        let session_holds = advisory.as_ref().map(|advisory| {
            tokio::spawn(hold::end_with_sessions(
                client.clone(),
                id.clone(),
                advisory.session(),
            ))
        });
        Ok(PostgresBackend {
            queue_sql: queue::statements(&client),
            handover_sql: handover::statements(&client),
            session_holds,
            sweeper,
            closed: AtomicBool::new(false),
            listener: Listener::start(&config, tls),
            client,
            id,
            advisory,
            label: config.label(),
            ttl: config.options.ttl,
            recheck: config.options.recheck,
            mark_ttl: config.mark_ttl,
            background: Background::new(),
        })
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("server", &self.label)
            .field("client", &self.id)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

impl PostgresBackend {
    /// This client's id, as inspections show it (a participant's session).
    pub fn client_id(&self) -> &str {
        &self.id
    }
}

/// The entry of an acquire in progress. If the acquire future is dropped, the entry is
/// deleted in a background task (by its owner token, unique to the attempt), again
/// while the delete fails in a retryable way; its expiry ends it otherwise. A decision
/// sent before the drop may still commit after the first delete, so the delete is
/// repeated until none can any more: the server ends a statement or a lock wait at the
/// request timeout (`statement_timeout`, `lock_timeout`).
struct PendingEntry {
    client: PgClient,
    name: String,
    owner: String,
}

/// A cancelled acquire's delete that keeps failing is given up after this long.
const CLEANUP_GIVE_UP: Duration = Duration::from_secs(60);

/// Pauses between the deletes of a cancelled acquire's entry whose decision may be in
/// flight (the last one comes once none can be).
const IN_FLIGHT_DELETES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_millis(1500),
];

impl Cleanup for PendingEntry {
    async fn cleanup(self) {
        let until = Instant::now() + self.client.in_flight_bound();
        self.delete_until_answered().await;
        let mut at = Instant::now();
        for pause in IN_FLIGHT_DELETES {
            at += pause;
            if at >= until {
                break;
            }
            tokio::time::sleep_until(at).await;
            self.delete_until_answered().await;
        }
        tokio::time::sleep_until(until).await;
        self.delete_until_answered().await;
    }
}

impl PendingEntry {
    /// Deletes the entry, again with backoff while the delete fails in a retryable way,
    /// until a delete is answered or [`CLEANUP_GIVE_UP`].
    async fn delete_until_answered(&self) {
        let sql = format!(
            "WITH gone AS (DELETE FROM {s}.entries WHERE name = $1 AND owner = $2 \
                 RETURNING seq) \
             SELECT pg_notify($3, '-' || seq || ':' || $1) FROM gone",
            s = self.client.schema
        );
        let channel: &str = &self.client.channel;
        let deleted = self
            .client
            .execute_patiently(
                "removing a cancelled acquire's entry",
                &sql,
                &[&self.name, &self.owner, &channel],
                CLEANUP_GIVE_UP,
                Error::is_retryable,
            )
            .await;
        if let Err(err) = deleted {
            tracing::warn!(name = self.name, error = %err, "removing the entry of a cancelled acquire failed; its expiry ends it");
        }
    }
}

/// What every client of this backend offers (known without a server).
pub const CAPABILITIES: Capabilities = Capabilities::new(BACKEND)
    .fair(true)
    .per_lock_ttl(true)
    .min_ttl(Duration::from_millis(100))
    .push_wakeup(true)
    .durable(true)
    .fencing(FencingSource::Counter)
    .fence_at_least(true)
    .election(true)
    .semaphore(true)
    .semaphore_many(true)
    .semaphore_resize(true)
    .rwlock(true)
    .upgradeable(true);

#[async_trait]
impl Backend for PostgresBackend {
    type Hold = PostgresHold;

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<PostgresHold>>> {
        let owner = request.token.as_str();
        let floor = request
            .fence_at_least
            .map_or(0, |floor| i64::try_from(floor.0).unwrap_or(i64::MAX));
        let place = Place {
            name: request.name,
            owner,
            kind: request.kind,
            ttl: request.ttl,
            floor,
            client: &self.id,
            advisory: self.advisory.as_ref(),
            schema: &self.client.schema,
            sql: &self.queue_sql,
            grant_lease: self
                .advisory
                .is_none()
                .then(|| handover::grant_lease(request.ttl, self.recheck)),
        };
        // Subscribed before the first decision, so that no change after it is missed.
        let waiter = request
            .wait
            .then(|| self.listener.wait_on(request.name.as_str()));
        let pending = CleanupOnDrop::new(PendingEntry {
            client: self.client.clone(),
            name: request.name.as_str().to_owned(),
            owner: owner.to_owned(),
        })
        .tracked_by(&self.background);
        let first = if request.wait && place.grant_lease.is_some() {
            handover::enqueue(&self.client, &self.handover_sql, &place).await?
        } else {
            decide_turn(&self.client, &place, Step::Enqueue { wait: request.wait }).await?
        };
        let turn = match (first, &waiter) {
            (Turn::Refused, _) => {
                drop(pending.disarm());
                return Ok(None);
            }
            (turn @ (Turn::Waiting { .. } | Turn::Ready { .. }), Some(waiter)) => {
                queue::wait_turn(&self.client, waiter, &place, turn, self.recheck).await?
            }
            (turn, _) => turn,
        };
        let Turn::Granted {
            seq,
            fence,
            decided_at,
            lease,
            session,
            advisory,
        } = turn
        else {
            return Err(crate::error::unexpected("acquiring", format!("{turn:?}")));
        };
        drop(pending.disarm());
        let held: hold::HeldAdvisory = Arc::new(Mutex::new(advisory));
        if let (Some(_), Some(side)) = (advisory, &self.advisory) {
            tokio::spawn(hold::give_back_when_gone(
                self.client.clone(),
                self.listener.wait_on(request.name.as_str()),
                seq,
                owner.to_owned(),
                Arc::downgrade(&held),
                Arc::downgrade(side),
            ));
        }
        Ok(Some(Acquired {
            hold: PostgresHold {
                name: request.name.as_str().to_owned(),
                seq,
                owner: owner.to_owned(),
                kind: Mutex::new(request.kind.clone()),
                advisory: held,
            },
            fencing_token: FencingToken(fence_of(fence)?),
            requested_at: decided_at,
            lease,
            session,
        }))
    }

    /// One statement for every hold of the client (see `hold::renew`).
    async fn renew(&self, items: &[RenewItem<'_, PostgresHold>]) -> Result<Vec<RenewOutcome>> {
        let holds: Vec<(&PostgresHold, Duration)> =
            items.iter().map(|item| (item.hold, item.ttl)).collect();
        let outcomes = hold::renew(&self.client, &holds).await?;
        for (item, outcome) in items.iter().zip(&outcomes) {
            if matches!(outcome, RenewOutcome::Lost(_)) {
                item.hold.give_back(self.advisory.as_deref()).await;
            }
        }
        Ok(outcomes)
    }

    async fn release(&self, hold: &PostgresHold) -> Result<BackendRelease> {
        let released = hold::release(&self.client, &self.handover_sql, &self.listener, hold).await;
        if released.is_ok() {
            hold.give_back(self.advisory.as_deref()).await;
        }
        released
    }

    fn session(&self) -> Option<tokio::sync::watch::Receiver<SessionStatus>> {
        self.advisory.as_ref().map(|advisory| advisory.session())
    }

    /// The live entries of the name in queue order and its counter as the token floor
    /// (see *Operating* in the crate docs).
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        operator::inspect(&self.client, name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        operator::list(&self.client, prefix).await
    }

    /// Deletes the oldest holder's entry and leaves a mark for its renewal.
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        operator::force_release(&self.client, name, self.ttl, self.mark_ttl).await
    }

    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        operator::resize(&self.client, name, resize).await
    }

    async fn amend(&self, hold: &PostgresHold, amendment: Amendment<'_>) -> Result<Amended> {
        match amendment {
            Amendment::Proclaim(value) => hold::proclaim(&self.client, hold, value).await,
            Amendment::Downgrade => {
                hold::downgrade(&self.client, hold, self.advisory.as_ref()).await
            }
            Amendment::Upgrade => hold::upgrade(&self.client, hold, self.advisory.as_ref()).await,
            other => Err(other.unsupported(BACKEND)),
        }
    }

    /// Every notification of the name (a grant, a release, an expiry seen, a proclaim),
    /// from the client's listening connection.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let changes = self.listener.observe(name.as_str());
        let stream = futures::stream::unfold(changes, |mut changes| async move {
            changes.changed().await.ok().map(|()| ((), changes))
        });
        Ok(ChangeFeed::from_stream(stream.boxed()))
    }

    /// Waits (at most the request timeout) for the cleanups of abandoned acquires,
    /// removes whatever entry of this client is left, and ends its connections.
    async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.sweeper.abort();
        self.background.settle(self.client.request_timeout()).await;
        let sql = format!(
            "WITH gone AS (DELETE FROM {s}.entries WHERE client = $1 RETURNING name, seq) \
             SELECT pg_notify($2, '-' || seq || ':' || name) FROM gone",
            s = self.client.schema
        );
        let channel: &str = &self.client.channel;
        let result = self
            .client
            .run("closing the client", async |conn| {
                let statement = conn.statement(&sql).await?;
                conn.client()
                    .execute(&statement, &[&self.id, &channel])
                    .await?;
                Ok(())
            })
            .await;
        self.listener.stop();
        if let Some(task) = &self.session_holds {
            task.abort();
        }
        if let Some(advisory) = &self.advisory {
            advisory.close().await;
        }
        self.client.close();
        result
    }
}
