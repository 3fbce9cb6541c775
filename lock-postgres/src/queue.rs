//! Waiting in a lock's queue on Postgres: putting our entry, deciding by
//! [`HoldKind::granted_behind`] over the live entries ahead whether it is granted, and
//! waiting for a notification of the name (or the expiry of what blocks it, or the
//! re-check period) to decide again, pushing our entry's expiry forward meanwhile.
//!
//! Each decision is one transaction that first locks the name's `names` row, so the
//! decisions on one name are serial: an entry with a lower `seq` is never committed
//! after one with a higher `seq` was read, and a grant and its fencing token (the
//! row's counter, incremented in the same transaction) can never be given twice. Its
//! statements are pipelined: lock, purge the dead, insert or refresh ours, read the
//! queue in one round trip; the grant and the commit in a second. (A waiting acquire of a
//! client without advisory locks enqueues in one round trip instead, and a release may
//! grant the head of the queue: [`crate::handover`].)

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::backend::HoldKind;
use lock_core::{Error, LockName, Result};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;

use crate::advisory::{
    holders_params, holders_sql, madelson_key, Advisory, AdvisoryKey, Mode, Taken, FOREIGN_POLL,
};
use crate::connection::{Conn, Failure, PgClient};
use crate::error::unexpected;
use crate::layout::{kind_columns, millis, Entry, ENTRY_COLUMNS};
use crate::listener::Waiter;

/// One acquisition's place in a name's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) owner: &'a str,
    pub(crate) kind: &'a HoldKind,
    pub(crate) ttl: Duration,
    /// The lowest fencing token to grant ([`lock_core::raw::backend::AcquireRequest::fence_at_least`]).
    pub(crate) floor: i64,
    /// The client's id, kept on the entry (an inspection's session).
    pub(crate) client: &'a str,
    /// The client's advisory side, when it takes advisory locks.
    pub(crate) advisory: Option<&'a Arc<Advisory>>,
    /// The quoted schema.
    pub(crate) schema: &'a str,
    /// The queue's statements ([`statements`]).
    pub(crate) sql: &'a Statements,
    /// The first lease of a grant a release may make to the entry while it waits
    /// ([`crate::handover`]); `None` where the client takes advisory locks (it decides
    /// its own grants).
    pub(crate) grant_lease: Option<Duration>,
}

impl<'a> Place<'a> {
    /// The columns of the entry this place inserts.
    pub(crate) fn new_entry(&self) -> Result<NewEntry<'a>> {
        let (kind, permits, count) = kind_columns(self.kind)?;
        Ok(NewEntry {
            name: self.name.as_str(),
            owner: self.owner,
            kind,
            permits,
            count,
            value: match self.kind {
                HoldKind::Candidate { value } => Some(value),
                _ => None,
            },
            client: self.client,
            ttl_ms: millis(self.ttl) as f64,
            grant_ms: self.grant_lease.map(|lease| millis(lease) as f64),
            floor: self.floor,
        })
    }
}

/// The columns of a new entry ([`Place::new_entry`]).
pub(crate) struct NewEntry<'a> {
    name: &'a str,
    owner: &'a str,
    kind: &'static str,
    permits: Option<i32>,
    count: Option<i32>,
    value: Option<&'a [u8]>,
    client: &'a str,
    pub(crate) ttl_ms: f64,
    grant_ms: Option<f64>,
    floor: i64,
}

impl NewEntry<'_> {
    /// The parameters of an insert: `$1` to `$10`, name, owner, kind, permits, count,
    /// value, client, TTL and first lease of a grant on release in milliseconds, floor.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 10] {
        [
            &self.name,
            &self.owner,
            &self.kind,
            &self.permits,
            &self.count,
            &self.value,
            &self.client,
            &self.ttl_ms,
            &self.grant_ms,
            &self.floor,
        ]
    }
}

/// What one decision found.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Granted with this fencing token; the entry's lease (`lease`) runs from
    /// `decided_at`.
    Granted {
        seq: i64,
        fence: i64,
        decided_at: Instant,
        lease: Duration,
        /// The holding session's epoch (0 without advisory locks).
        session: u64,
        /// The advisory lock taken with it, and the session epoch holding it.
        advisory: Option<(AdvisoryKey, Mode, u64)>,
    },
    /// Not granted; our entry waits (it was left in place). `blocked_for`: the shortest
    /// time left to a live entry ahead, after which it expires unless renewed.
    Waiting {
        seq: i64,
        blocked_for: Duration,
        /// The entries whose leaving (or change of kind) may grant it.
        watch: Vec<i64>,
        /// When the decision was sent: a grant on release comes after it.
        decided_at: Instant,
    },
    /// Queued, and granted by [`decide`] over what is ahead: decide again at once (the
    /// grant is made under the name's lock).
    Ready { seq: i64 },
    /// Not granted, and the single attempt left nothing behind.
    Refused,
    /// Our entry is gone (expired while we could not refresh it, or broken).
    Gone,
}

/// The part of a purge (a `WITH` list after `gone (…, client, granted)`) that marks, for
/// [`end_stale_holders`], which clients' holds expired: their holding connections may be
/// ended. `name` is the name's SQL (`$1`, or `name` for a purge of every name).
pub(crate) fn expired_marks(schema: &str, name: &str) -> String {
    format!(
        "expired AS (INSERT INTO {schema}.marks (name, owner, until) \
             SELECT DISTINCT {name}, 'expired:' || client, \
                 clock_timestamp() + interval '1 minute' \
             FROM gone WHERE granted \
             ON CONFLICT (name, owner) DO UPDATE SET until = excluded.until)"
    )
}

/// The SQL of the queue's statements for one schema, built once per client.
pub(crate) fn statements(client: &PgClient) -> Statements {
    let s = &client.schema;
    let expired = expired_marks(s, "$1");
    Statements {
        lock: format!(
            "INSERT INTO {s}.names (name) VALUES ($1) \
             ON CONFLICT (name) DO UPDATE SET fence = {s}.names.fence RETURNING fence"
        ),
        purge: format!(
            "WITH gone AS (DELETE FROM {s}.entries \
                 WHERE name = $1 AND expires_at < clock_timestamp() \
                 RETURNING seq, client, granted), \
             {expired} \
             SELECT pg_notify($2, '-' || seq || ':' || $1) FROM gone"
        ),
        insert: format!(
            "INSERT INTO {s}.entries \
                 (name, owner, kind, permits, count, value, client, expires_at, \
                 grant_ms, fence_floor) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, \
                 clock_timestamp() + $8::float8 * interval '1 millisecond', $9, $10) \
             RETURNING seq, granted, fence"
        ),
        refresh: format!(
            "UPDATE {s}.entries \
             SET expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond' \
             WHERE seq = $1 AND owner = $3 RETURNING seq, granted, fence"
        ),
        queue: format!("SELECT {ENTRY_COLUMNS} FROM {s}.entries WHERE name = $1 ORDER BY seq"),
        grant: format!(
            "WITH counter AS (UPDATE {s}.names SET fence = greatest(fence + 1, $3) \
                 WHERE name = $1 RETURNING fence) \
             UPDATE {s}.entries AS e SET granted = true, fence = counter.fence, \
                 expires_at = clock_timestamp() + $4::float8 * interval '1 millisecond', \
                 session = $5 \
             FROM counter WHERE e.seq = $2 RETURNING e.fence"
        ),
        notify: "SELECT pg_notify($1, '+:' || $2)".to_owned(),
    }
}

#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) lock: String,
    pub(crate) purge: String,
    insert: String,
    refresh: String,
    pub(crate) queue: String,
    grant: String,
    notify: String,
}

/// Which decision to take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    /// Put our entry and decide; a single attempt (`wait == false`) that is not granted,
    /// and a conflict, roll back: nothing of it is ever seen.
    Enqueue { wait: bool },
    /// Decide again for our entry `seq`, pushing its expiry forward.
    Recheck { seq: i64 },
}

/// Takes one decision for `place` (see the module docs).
pub(crate) async fn decide_turn(client: &PgClient, place: &Place<'_>, step: Step) -> Result<Turn> {
    let entry = place.new_entry()?;
    let sql = place.sql;
    let name = place.name.as_str();
    let channel: &str = &client.channel;
    let ttl_ms = entry.ttl_ms;
    let what = match step {
        Step::Enqueue { .. } => "queueing for a lock",
        Step::Recheck { .. } => "re-checking a lock's queue",
    };
    client
        .run(what, async |conn| {
            let (lock, purge, own, queue, notify, grant) = futures::join!(
                conn.statement(&sql.lock),
                conn.statement(&sql.purge),
                conn.statement(match step {
                    Step::Enqueue { .. } => &sql.insert,
                    Step::Recheck { .. } => &sql.refresh,
                }),
                conn.statement(&sql.queue),
                conn.statement(&sql.notify),
                conn.statement(&sql.grant),
            );
            let (lock, purge, own, queue, notify, grant) =
                (lock?, purge?, own?, queue?, notify?, grant?);
            conn.begin();
            let c = conn.client();
            let decided_at = Instant::now();
            let insert_params = entry.params();
            let refresh_params: [&(dyn ToSql + Sync); 3];
            let own_params: &[&(dyn ToSql + Sync)] = match &step {
                Step::Enqueue { .. } => &insert_params,
                Step::Recheck { seq } => {
                    refresh_params = [seq, &ttl_ms, &place.owner];
                    &refresh_params
                }
            };
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let purge_params: [&(dyn ToSql + Sync); 2] = [&name, &channel];
            let (begun, locked, purged, own, rows) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_one(&lock, &by_name),
                c.query(&purge, &purge_params),
                c.query_opt(&own, own_params),
                c.query(&queue, &by_name),
            );
            let (_, _, _, own, rows) = (begun?, locked?, purged?, own?, rows?);
            let Some(own) = own else {
                conn.commit().await?;
                return Ok(Turn::Gone);
            };
            let seq: i64 = own.try_get(0)?;
            // Granted by a release meanwhile (a client without advisory locks): the entry,
            // just refreshed, holds with the token it was granted.
            if own.try_get(1)? && place.grant_lease.is_some() {
                conn.commit().await?;
                return Ok(Turn::Granted {
                    seq,
                    fence: own.try_get(2)?,
                    decided_at,
                    lease: place.ttl,
                    session: 0,
                    advisory: None,
                });
            }
            let decision =
                entries(&rows).and_then(|queue| decide(place.name, place.kind, seq, &queue));
            match decision {
                Err(err) => {
                    conn.rollback().await?;
                    Err(err.into())
                }
                Ok(Decision::Wait { blocked_for, watch }) => {
                    if let Step::Enqueue { wait: false } = step {
                        conn.rollback().await?;
                        return Ok(Turn::Refused);
                    }
                    conn.commit().await?;
                    Ok(Turn::Waiting {
                        seq,
                        blocked_for,
                        watch,
                        decided_at,
                    })
                }
                Ok(Decision::Granted) => {
                    // The name's advisory lock too, where the client takes them: another
                    // session holding it (an application of its own, or a hung holder,
                    // which is ended) keeps the entry waiting.
                    let advisory = match (place.advisory, Mode::of(place.kind)) {
                        (Some(advisory), Some(mode)) => {
                            let key = madelson_key(name);
                            match advisory.try_lock(key, mode).await {
                                Ok(Some(epoch)) => Some(Taken {
                                    advisory: Some(Arc::clone(advisory)),
                                    key,
                                    mode,
                                    epoch,
                                }),
                                Ok(None) => {
                                    end_stale_holders(c, place, key).await?;
                                    if let Step::Enqueue { wait: false } = step {
                                        conn.rollback().await?;
                                        return Ok(Turn::Refused);
                                    }
                                    conn.commit().await?;
                                    return Ok(Turn::Waiting {
                                        seq,
                                        blocked_for: FOREIGN_POLL,
                                        watch: Vec::new(),
                                        decided_at,
                                    });
                                }
                                Err(err) => {
                                    conn.rollback().await?;
                                    return Err(err.into());
                                }
                            }
                        }
                        _ => None,
                    };
                    // With advisory locks every hold is the holding session's: its end
                    // ends the hold, and the client deletes the session's entries.
                    let session: i64 = match (&advisory, place.advisory) {
                        (Some(taken), _) => epoch_column(taken.epoch),
                        (None, Some(side)) => match side.epoch().await {
                            Ok(epoch) => epoch_column(epoch),
                            Err(err) => {
                                conn.rollback().await?;
                                return Err(err.into());
                            }
                        },
                        (None, None) => 0,
                    };
                    let granted = grant_turn(
                        conn,
                        &grant,
                        &notify,
                        [&name, &seq, &place.floor, &ttl_ms, &session],
                        &channel,
                        what,
                    )
                    .await;
                    // Dropped or failed before here, `advisory` gives the lock back.
                    let fence = granted?;
                    Ok(Turn::Granted {
                        seq,
                        fence,
                        decided_at,
                        lease: place.ttl,
                        session: u64::try_from(session).unwrap_or(0),
                        advisory: advisory.map(Taken::keep),
                    })
                }
            }
        })
        .await
}

/// A session epoch as the `session` column keeps it.
fn epoch_column(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(i64::MAX)
}

/// Grants our entry (the next fencing token) and commits, pipelined; the token.
async fn grant_turn(
    conn: &mut Conn,
    grant: &tokio_postgres::Statement,
    notify: &tokio_postgres::Statement,
    grant_params: [&(dyn ToSql + Sync); 5],
    channel: &&str,
    what: &str,
) -> std::result::Result<i64, Failure> {
    let c = conn.client();
    let notice: [&(dyn ToSql + Sync); 2] = [channel, grant_params[0]];
    let (granted, notified, committed) = futures::join!(
        c.query_opt(grant, &grant_params),
        c.execute(notify, &notice),
        c.batch_execute("COMMIT"),
    );
    committed?;
    conn.committed();
    let (granted, _) = (granted?, notified?);
    match granted {
        Some(row) => Ok(row.try_get(0)?),
        None => Err(unexpected(what, "a grant that found no entry").into()),
    }
}

/// Ends the holding connections of distlock clients that hold `key` without a live
/// grant of the name (their lease ran out while their process hangs), within the
/// decision's transaction; an application's own session is left alone.
async fn end_stale_holders(
    c: &tokio_postgres::Client,
    place: &Place<'_>,
    key: AdvisoryKey,
) -> std::result::Result<(), Failure> {
    let (classid, objid, subid) = holders_params(key);
    let holders = c.query(holders_sql(), &[&classid, &objid, &subid]).await?;
    for holder in holders {
        let (pid, application): (i32, String) = (holder.try_get(0)?, holder.try_get(1)?);
        let Some(client) = application.strip_prefix("distlock:") else {
            continue;
        };
        if client == place.client {
            continue;
        }
        // Its hold expired (marked by the purge that removed it), and it holds no other.
        let stale = format!(
            "SELECT 1 FROM {s}.marks WHERE name = $1 AND owner = 'expired:' || $2 \
                 AND until >= clock_timestamp() \
             AND NOT EXISTS (SELECT 1 FROM {s}.entries WHERE name = $1 AND client = $2 \
                 AND granted AND expires_at >= clock_timestamp())",
            s = place.schema
        );
        if c.query_opt(&stale, &[&place.name.as_str(), &client])
            .await?
            .is_some()
        {
            tracing::info!(name = %place.name, pid, client, "ending the holding connection of a holder whose lease ran out");
            c.execute("SELECT pg_terminate_backend($1)", &[&pid])
                .await?;
        }
    }
    Ok(())
}

fn entries(rows: &[tokio_postgres::Row]) -> Result<Vec<Entry>> {
    rows.iter().map(Entry::from_row).collect()
}

/// Decides for `seq` of `kind` over `queue` (the name's entries in order): a conflict
/// with a kind beside it, granted, or the shortest life left to a live entry ahead.
pub(crate) fn decide(
    name: &LockName,
    kind: &HoldKind,
    seq: i64,
    queue: &[Entry],
) -> Result<Decision> {
    let live = || queue.iter().filter(|e| !e.dead && e.seq != seq);
    for other in live() {
        kind.check_beside(&other.kind, name)?;
    }
    let ahead: Vec<&Entry> = live().filter(|e| e.seq < seq).collect();
    if kind.granted_behind(ahead.iter().map(|e| &e.kind)) {
        return Ok(Decision::Granted);
    }
    let blocked_for = ahead.iter().map(|e| e.left).min().unwrap_or(Duration::ZERO);
    // An exclusive entry waits for its predecessor alone; a shared one may be granted by
    // any entry ahead leaving or turning shared.
    let watch = if waits_for_last(kind) {
        ahead.last().map(|e| e.seq).into_iter().collect()
    } else {
        ahead.iter().map(|e| e.seq).collect()
    };
    Ok(Decision::Wait { blocked_for, watch })
}

/// Whether `kind` is granted only with nobody live ahead (it waits for the last).
pub(crate) fn waits_for_last(kind: &HoldKind) -> bool {
    !(kind.is_shared() || *kind == HoldKind::Upgradeable)
}

/// See [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Granted,
    Wait {
        blocked_for: Duration,
        watch: Vec<i64>,
    },
}

/// How long a waiter waits before deciding again without a notification: until the
/// first entry ahead could expire, the re-check period, or a third of its own TTL (its
/// entry's refresh), whichever comes first; a little after the expiry, so that it has
/// passed on the server too.
pub(crate) fn next_check(blocked_for: Duration, recheck: Duration, ttl: Duration) -> Duration {
    (blocked_for + Duration::from_millis(5))
        .min(recheck)
        .min(ttl / 3)
        .max(Duration::from_millis(5))
}

/// Pause before a waiter decides again after a failed decision.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Waits until the entry that [`Turn::Waiting`] left is granted: takes a grant on
/// release that `waiter` saw ([`crate::handover::handed`]), or decides again at each
/// wake-up of `waiter` or after [`next_check`]; queues again (at the back) if the entry
/// went (it expired while this client could not refresh it). Returns the granting turn.
pub(crate) async fn wait_turn(
    client: &PgClient,
    waiter: &Waiter,
    place: &Place<'_>,
    first: Turn,
    recheck: Duration,
) -> Result<Turn> {
    let mut turn = first;
    loop {
        let pause = match &turn {
            Turn::Waiting {
                seq,
                blocked_for,
                watch,
                ..
            } => {
                waiter.watch(*seq, watch.iter().copied());
                next_check(*blocked_for, recheck, place.ttl)
            }
            Turn::Granted { .. } => return Ok(turn),
            Turn::Ready { .. } => Duration::ZERO,
            Turn::Refused | Turn::Gone => RETRY_PAUSE,
        };
        if !pause.is_zero() {
            let _ = tokio::time::timeout(pause, waiter.woken()).await;
        }
        if let (
            Turn::Waiting {
                seq, decided_at, ..
            },
            Some(lease),
        ) = (&turn, place.grant_lease)
        {
            if let Some(fence) = crate::handover::handed(waiter, *decided_at, lease) {
                return Ok(Turn::Granted {
                    seq: *seq,
                    fence,
                    decided_at: *decided_at,
                    lease,
                    session: 0,
                    advisory: None,
                });
            }
        }
        let step = match &turn {
            Turn::Waiting { seq, .. } | Turn::Ready { seq } => Step::Recheck { seq: *seq },
            _ => Step::Enqueue { wait: true },
        };
        match decide_turn(client, place, step).await {
            Ok(Turn::Gone) => {
                tracing::debug!(name = %place.name, "a waiter's entry went; queueing again");
                turn = Turn::Gone;
            }
            Ok(next) => turn = next,
            Err(err) if err.is_retryable() => {
                tracing::debug!(name = %place.name, error = %err, "re-checking a queue failed");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Refuses a queue position given by the server that this client cannot use.
pub(crate) fn fence_of(fence: i64) -> Result<u64> {
    u64::try_from(fence).map_err(|_| Error::Protocol {
        backend: crate::error::BACKEND,
        message: format!("fencing counter {fence} below zero"),
        source: None,
    })
}
