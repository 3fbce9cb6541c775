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
//! queue in one round trip; the grant and the commit in a second.

use std::time::Duration;

use lock_core::raw::backend::HoldKind;
use lock_core::{Error, LockName, Result};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;

use crate::connection::{PgClient, Waiter};
use crate::error::unexpected;
use crate::layout::{kind_columns, millis, Entry, ENTRY_COLUMNS};

/// One acquisition's place in a name's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) owner: &'a str,
    pub(crate) kind: &'a HoldKind,
    pub(crate) ttl: Duration,
    /// The lowest fencing token to grant ([`AcquireRequest::fence_at_least`]).
    pub(crate) floor: i64,
    /// The client's id, kept on the entry (an inspection's session).
    pub(crate) client: &'a str,
}

/// What one decision found.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Granted with this fencing token; the entry's lease runs from `decided_at`.
    Granted {
        seq: i64,
        fence: i64,
        decided_at: Instant,
    },
    /// Not granted; our entry waits (it was left in place). `blocked_for`: the shortest
    /// time left to a live entry ahead, after which it expires unless renewed.
    Waiting {
        seq: i64,
        blocked_for: Duration,
        /// The entries whose leaving (or change of kind) may grant it.
        watch: Vec<i64>,
    },
    /// Not granted, and the single attempt left nothing behind.
    Refused,
    /// Our entry is gone (expired while we could not refresh it, or broken).
    Gone,
}

/// The SQL of the queue's statements for one schema.
fn statements(client: &PgClient) -> Statements {
    let s = &client.schema;
    Statements {
        lock: format!(
            "INSERT INTO {s}.names (name) VALUES ($1) \
             ON CONFLICT (name) DO UPDATE SET fence = {s}.names.fence RETURNING fence"
        ),
        purge: format!(
            "WITH gone AS (DELETE FROM {s}.entries \
                 WHERE name = $1 AND expires_at < clock_timestamp() RETURNING seq) \
             SELECT pg_notify($2, '-' || seq || ':' || $1) FROM gone"
        ),
        insert: format!(
            "INSERT INTO {s}.entries \
                 (name, owner, kind, permits, count, value, client, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, \
                 clock_timestamp() + $8::float8 * interval '1 millisecond') \
             RETURNING seq"
        ),
        refresh: format!(
            "UPDATE {s}.entries \
             SET expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond' \
             WHERE seq = $1 AND owner = $3 RETURNING seq"
        ),
        queue: format!("SELECT {ENTRY_COLUMNS} FROM {s}.entries WHERE name = $1 ORDER BY seq"),
        grant: format!(
            "WITH counter AS (UPDATE {s}.names SET fence = greatest(fence + 1, $3) \
                 WHERE name = $1 RETURNING fence) \
             UPDATE {s}.entries AS e SET granted = true, fence = counter.fence, \
                 expires_at = clock_timestamp() + $4::float8 * interval '1 millisecond' \
             FROM counter WHERE e.seq = $2 RETURNING e.fence"
        ),
        notify: "SELECT pg_notify($1, '+:' || $2)".to_owned(),
    }
}

struct Statements {
    lock: String,
    purge: String,
    insert: String,
    refresh: String,
    queue: String,
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
    let (kind, permits, count) = kind_columns(place.kind)?;
    let value: Option<&[u8]> = match place.kind {
        HoldKind::Candidate { value } => Some(value),
        _ => None,
    };
    let sql = statements(client);
    let name = place.name.as_str();
    let channel: &str = &client.channel;
    let ttl_ms = millis(place.ttl) as f64;
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
            let insert_params: [&(dyn ToSql + Sync); 8] = [
                &name,
                &place.owner,
                &kind,
                &permits,
                &count,
                &value,
                &place.client,
                &ttl_ms,
            ];
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
                    })
                }
                Ok(Decision::Granted) => {
                    let grant_params: [&(dyn ToSql + Sync); 4] =
                        [&name, &seq, &place.floor, &ttl_ms];
                    let notice: [&(dyn ToSql + Sync); 2] = [&channel, &name];
                    let (granted, notified, committed) = futures::join!(
                        c.query_opt(&grant, &grant_params),
                        c.execute(&notify, &notice),
                        c.batch_execute("COMMIT"),
                    );
                    committed?;
                    conn.committed();
                    let (granted, _) = (granted?, notified?);
                    let fence: i64 = match granted {
                        Some(row) => row.try_get(0)?,
                        None => return Err(unexpected(what, "a grant that found no entry").into()),
                    };
                    Ok(Turn::Granted {
                        seq,
                        fence,
                        decided_at,
                    })
                }
            }
        })
        .await
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
    // An exclusive entry is granted only with nobody ahead: until its predecessor
    // leaves, nothing else ahead changes that. A shared one may be granted by any
    // entry ahead leaving or turning shared.
    let watch = if kind.is_shared() || *kind == HoldKind::Upgradeable {
        ahead.iter().map(|e| e.seq).collect()
    } else {
        ahead.last().map(|e| e.seq).into_iter().collect()
    };
    Ok(Decision::Wait { blocked_for, watch })
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

/// Waits until the entry that [`Turn::Waiting`] left is granted: decides again at each
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
                blocked_for, watch, ..
            } => {
                waiter.watch(watch.iter().copied());
                next_check(*blocked_for, recheck, place.ttl)
            }
            Turn::Granted { .. } => return Ok(turn),
            Turn::Refused | Turn::Gone => RETRY_PAUSE,
        };
        let _ = tokio::time::timeout(pause, waiter.woken()).await;
        let step = match &turn {
            Turn::Waiting { seq, .. } => Step::Recheck { seq: *seq },
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
