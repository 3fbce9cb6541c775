//! The raw floor of PostgreSQL.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::OnceCell;
use tokio::time::{timeout, Instant};

use super::{no_push, RawFloor, RawHold, PUSH_LIMIT, RAW_TTL};
use crate::error::BoxError;

/// The scratch table of the PostgreSQL floor (in the server's `public` schema).
const PG_FLOOR_TABLE: &str = "lockbench_floor";
/// The channel the PostgreSQL floor's release notifies and its raw waiter listens on.
const PG_FLOOR_CHANNEL: &str = "lockbench_floor";

/// PostgreSQL: what a lock does on the server, cut down to one row per name with no
/// queue, no fencing counter and no transaction of several statements. The acquire is one
/// round trip of a prepared single-row upsert, `INSERT … ON CONFLICT (name) DO UPDATE …
/// WHERE <the row's lease has passed> RETURNING token` (put-if-absent-or-expired, with a
/// lease on the server's clock: the analogue of Redis's `SET NX PX` and etcd's
/// put-if-absent with a lease), in its own implicit transaction; the release one round
/// trip of a prepared compare-and-`DELETE` (the analogue of the compare-and-delete
/// script). The library's grant is a pipelined transaction that also locks the name's
/// row, clears expired entries, reads the queue and raises the fencing counter (two round
/// trips), so the ratio shows what those cost. Its hand-off: the release also sends a
/// `NOTIFY` (one statement, `pg_notify` on the deleted row), which a raw waiter (a
/// connection of its own, opened at the first hand-off) `LISTEN`s for before it upserts
/// again, as the library's waiters are woken.
pub(super) struct PgFloor {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    release_and_notify: tokio_postgres::Statement,
    conninfo: String,
    waiter: OnceCell<PgWaiter>,
}

/// The PostgreSQL floor's raw waiter: its connection, `LISTEN`ing, and the notifications'
/// payloads as they arrive.
struct PgWaiter {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    payloads: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

impl PgFloor {
    pub(super) async fn connect(conninfo: &str) -> Result<Self, BoxError> {
        let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
        // The connection ends with the client (or with the measurement's runtime).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {PG_FLOOR_TABLE} (
                     name text PRIMARY KEY,
                     token text NOT NULL,
                     expires_at timestamptz NOT NULL
                 )"
            ))
            .await?;
        let acquire = Self::prepare_acquire(&client).await?;
        let release = client
            .prepare(&format!(
                "DELETE FROM {PG_FLOOR_TABLE} WHERE name = $1 AND token = $2"
            ))
            .await?;
        let release_and_notify = client
            .prepare(&format!(
                "WITH gone AS (DELETE FROM {PG_FLOOR_TABLE} WHERE name = $1 AND token = $2 \
                 RETURNING name) SELECT pg_notify('{PG_FLOOR_CHANNEL}', name) FROM gone"
            ))
            .await?;
        Ok(PgFloor {
            client,
            acquire,
            release,
            release_and_notify,
            conninfo: conninfo.to_owned(),
            waiter: OnceCell::new(),
        })
    }

    async fn prepare_acquire(
        client: &tokio_postgres::Client,
    ) -> Result<tokio_postgres::Statement, BoxError> {
        let ttl_ms = RAW_TTL.as_millis();
        Ok(client
            .prepare(&format!(
                "INSERT INTO {PG_FLOOR_TABLE} AS f (name, token, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + interval '{ttl_ms} milliseconds') \
                 ON CONFLICT (name) DO UPDATE \
                 SET token = excluded.token, expires_at = excluded.expires_at \
                 WHERE f.expires_at <= clock_timestamp() \
                 RETURNING token"
            ))
            .await?)
    }

    /// The upsert of `name` on `client`: the hold, or `None` when the row is held.
    async fn try_acquire(
        client: &tokio_postgres::Client,
        acquire: &tokio_postgres::Statement,
        name: &str,
    ) -> Result<Option<RawHold>, BoxError> {
        let token = uuid::Uuid::new_v4().to_string();
        let row = client.query_opt(acquire, &[&name, &token]).await?;
        Ok(row.map(|_| RawHold::new(name.to_owned(), token)))
    }

    /// The raw waiter's connection, listening on [`PG_FLOOR_CHANNEL`].
    async fn open_waiter(conninfo: &str) -> Result<PgWaiter, BoxError> {
        use tokio_postgres::AsyncMessage;
        let (client, mut connection) =
            tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
        let (sender, payloads) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if sender.send(n.payload().to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {PG_FLOOR_CHANNEL}"))
            .await?;
        let acquire = Self::prepare_acquire(&client).await?;
        Ok(PgWaiter {
            client,
            acquire,
            payloads: tokio::sync::Mutex::new(payloads),
        })
    }
}

#[async_trait]
impl RawFloor for PgFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        Self::try_acquire(&self.client, &self.acquire, name)
            .await?
            .ok_or_else(|| "raw upsert found the row held".into())
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let deleted = self
            .client
            .execute(&self.release, &[&hold.name, &hold.token])
            .await?;
        if deleted != 1 {
            return Err("raw release found the row gone".into());
        }
        Ok(())
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let waiter = self
            .waiter
            .get_or_try_init(|| Self::open_waiter(&self.conninfo))
            .await?;
        let mut payloads = waiter.payloads.lock().await;
        let hold = self.acquire(name).await?;
        if Self::try_acquire(&waiter.client, &waiter.acquire, name)
            .await?
            .is_some()
        {
            return Err("raw waiter took a held row".into());
        }
        let started = Instant::now();
        let notified = self
            .client
            .query(&self.release_and_notify, &[&hold.name, &hold.token])
            .await?;
        if notified.len() != 1 {
            return Err("raw release found the row gone".into());
        }
        let next = loop {
            let payload = timeout(PUSH_LIMIT, payloads.recv())
                .await
                .map_err(|_| no_push("notification"))?
                .ok_or_else(|| no_push("notification"))?;
            if payload != name {
                continue;
            }
            if let Some(next) = Self::try_acquire(&waiter.client, &waiter.acquire, name).await? {
                break next;
            }
        };
        let took = started.elapsed();
        self.release(next).await?;
        Ok(Some(took))
    }
}
