//! Grants on release: the transaction that removes a hold's entry also grants, under the
//! name's lock, the entry at the head of the queue when nothing live is ahead of it (the
//! one case of [`HoldKind::granted_behind`] the server applies itself: every kind is
//! granted behind nobody) and that takes a grant from another client (its entry has a
//! `grant_ms`), with the next fencing token, and tells it (`*<seq>.<fence>:<name>`) so
//! that it holds without a decision of its own: a hand-over costs the release (one round
//! trip) and one notification. A grantee waiting in the releasing process hears of its
//! grant from the release itself, as soon as it committed, without the notification's
//! trip through the server ([`Listener::granted_here`]).
//!
//! Every other waiter the leaving may grant (a reader behind the head, permits beside
//! remaining holders) is woken by the leaving, as every watcher is, and decides itself
//! ([`crate::queue`]). So does a waiter that takes an advisory lock with its grant (its
//! entry has no `grant_ms`: another client cannot take that lock for it), and the
//! waiters of clients of an older layout.
//!
//! [`HoldKind::granted_behind`]: lock_core::raw::backend::HoldKind::granted_behind
//!
//! A grant on release gives the entry a short first lease (`grant_ms`,
//! [`grant_lease`]): a waiter that died while queued holds the name at most that long.

use std::time::Duration;

use lock_core::Result;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;

use crate::connection::PgClient;
use crate::hold::PostgresHold;
use crate::layout::{Entry, ENTRY_COLUMNS};
use crate::listener::{Listener, Waiter};
use crate::queue::{decide, expired_marks, Decision, Place, Turn};

/// Shortest first lease of a grant on release ([`grant_lease`]).
const MIN_GRANT: Duration = Duration::from_secs(1);

/// The first lease of a hold a release grants to a waiter of `ttl`: two rechecks, at least
/// a second (room for its first renewal on a busy machine), at most the TTL. The waiter
/// renews it to the TTL a third of the way into it.
pub(crate) fn grant_lease(ttl: Duration, recheck: Duration) -> Duration {
    recheck.saturating_mul(2).max(MIN_GRANT).min(ttl)
}

/// Where the enqueue's own columns start in its rows (after the queue's
/// [`ENTRY_COLUMNS`]).
const OWN_COLUMNS: usize = 12;

/// The hand-over's statements for one schema, built once per client.
#[derive(Debug)]
pub(crate) struct Statements {
    lock: String,
    release: String,
    leave: String,
    left: String,
    enqueue: String,
}

/// The SQL of [`Statements`] for `client`'s schema.
pub(crate) fn statements(client: &PgClient) -> Statements {
    let s = &client.schema;
    let expired = expired_marks(s, "$1");
    Statements {
        lock: format!("SELECT fence FROM {s}.names WHERE name = $1 FOR UPDATE"),
        release: format!(
            "DELETE FROM {s}.entries WHERE seq = $1 AND owner = $2 \
             RETURNING expires_at >= clock_timestamp()"
        ),
        leave: format!(
            "WITH released AS (DELETE FROM {s}.entries WHERE seq = $3 AND owner = $4 \
                 RETURNING expires_at >= clock_timestamp() AS live), \
             head AS (SELECT seq, granted, grant_ms, fence_floor FROM {s}.entries \
                 WHERE name = $1 AND seq <> $3 AND expires_at >= clock_timestamp() \
                 ORDER BY seq LIMIT 1), \
             taker AS (SELECT seq, fence_floor FROM head \
                 WHERE NOT granted AND grant_ms IS NOT NULL), \
             counter AS (UPDATE {s}.names \
                 SET fence = greatest(fence + 1, (SELECT fence_floor FROM taker)) \
                 WHERE name = $1 AND EXISTS (SELECT 1 FROM taker) RETURNING fence), \
             granted AS (UPDATE {s}.entries AS e SET granted = true, fence = counter.fence, \
                 expires_at = clock_timestamp() + e.grant_ms * interval '1 millisecond' \
                 FROM counter, taker WHERE e.seq = taker.seq RETURNING e.seq, e.fence), \
             notices AS (SELECT pg_notify($2, '*' || seq || '.' || fence || ':' || $1) \
                     FROM granted \
                 UNION ALL SELECT pg_notify($2, '-' || $3::int8 || ':' || $1)) \
             SELECT (SELECT live FROM released), granted.seq, granted.fence, \
                 (SELECT count(*) FROM notices) \
             FROM (SELECT 1) AS one LEFT JOIN granted ON true"
        ),
        left: "SELECT pg_notify($1, '-' || $2::int8 || ':' || $3)".to_owned(),
        enqueue: format!(
            "WITH gone AS (DELETE FROM {s}.entries \
                 WHERE name = $1 AND expires_at < clock_timestamp() \
                 RETURNING seq, client, granted), \
             {expired}, \
             ahead AS (SELECT 1 FROM {s}.entries \
                 WHERE name = $1 AND expires_at >= clock_timestamp() LIMIT 1), \
             counter AS (UPDATE {s}.names SET fence = greatest(fence + 1, $10) \
                 WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM ahead) RETURNING fence), \
             own AS (INSERT INTO {s}.entries (name, owner, kind, permits, count, value, \
                 client, expires_at, grant_ms, fence_floor, granted, fence) \
             SELECT $1::text, $2::text, $3::text, $4::int4, $5::int4, $6::bytea, $7::text, \
                 clock_timestamp() + $8::float8 * interval '1 millisecond', $9::float8, \
                 $10::int8, counter.fence IS NOT NULL, counter.fence \
             FROM (SELECT 1) AS one LEFT JOIN counter ON true \
             RETURNING seq, granted, fence), \
             notices AS (SELECT pg_notify($11, '-' || seq || ':' || $1) FROM gone \
                 UNION ALL SELECT pg_notify($11, '+:' || $1) FROM own WHERE granted) \
             SELECT queue.*, own.seq, own.granted, own.fence, \
                 (SELECT count(*) FROM notices) \
             FROM own LEFT JOIN LATERAL (SELECT {ENTRY_COLUMNS} FROM {s}.entries \
                 WHERE name = $1 AND NOT own.granted AND ($12 OR kind <> $3 \
                     OR seq = (SELECT seq FROM {s}.entries WHERE name = $1 \
                         AND expires_at >= clock_timestamp() ORDER BY seq DESC LIMIT 1) \
                     OR seq = (SELECT seq FROM {s}.entries WHERE name = $1 \
                         AND expires_at >= clock_timestamp() ORDER BY expires_at LIMIT 1))) \
                 AS queue ON true \
             ORDER BY queue.seq"
        ),
    }
}

/// Queues `place` (a waiting acquire of a client that takes grants on release), granted
/// at once if nothing live is ahead, in one transaction under the name's lock sent in
/// one round trip: the lock, then one statement that purges the dead, inserts our entry
/// (granting itself), notifies the purge and the grant and, not granted, reads what of
/// the queue decides for it; and the commit. Not granted, the entry waits:
/// [`Turn::Ready`] if [`decide`] grants it over what is ahead (a reader behind readers),
/// [`Turn::Waiting`] otherwise. A kind that cannot queue beside another is refused, its
/// entry deleted.
pub(crate) async fn enqueue(
    client: &PgClient,
    sql: &Statements,
    place: &Place<'_>,
) -> Result<Turn> {
    let entry = place.new_entry()?;
    let name = place.name.as_str();
    let channel: &str = &client.channel;
    // An exclusive kind waits for the last live entry ahead, until the first could
    // expire: the queue read returns those two and the entries of other kinds (a
    // conflict), enough for [`decide`]; a shared kind reads the whole queue.
    let whole_queue = !crate::queue::waits_for_last(place.kind);
    let decided_at = Instant::now();
    let rows = client
        .run("queueing for a lock", async |conn| {
            let (lock, enqueue) = futures::join!(
                conn.statement(&place.sql.lock),
                conn.statement(&sql.enqueue),
            );
            let (lock, enqueue) = (lock?, enqueue?);
            conn.begin();
            let c = conn.client();
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let [p1, p2, p3, p4, p5, p6, p7, p8, p9, p10] = entry.params();
            let inserting: [&(dyn ToSql + Sync); 12] = [
                p1,
                p2,
                p3,
                p4,
                p5,
                p6,
                p7,
                p8,
                p9,
                p10,
                &channel,
                &whole_queue,
            ];
            let (begun, locked, rows, committed) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_one(&lock, &by_name),
                c.query(&enqueue, &inserting),
                c.batch_execute("COMMIT"),
            );
            committed?;
            conn.committed();
            let (_, _, rows) = (begun?, locked?, rows?);
            Ok(rows)
        })
        .await?;
    let own = rows
        .first()
        .ok_or_else(|| crate::error::unexpected("queueing for a lock", "no entry inserted"))?;
    let read = |e: tokio_postgres::Error| crate::error::unexpected("queueing for a lock", e);
    let seq: i64 = own.try_get(OWN_COLUMNS).map_err(read)?;
    let granted: bool = own.try_get(OWN_COLUMNS + 1).map_err(read)?;
    let fence: Option<i64> = own.try_get(OWN_COLUMNS + 2).map_err(read)?;
    if let (true, Some(fence)) = (granted, fence) {
        return Ok(Turn::Granted {
            seq,
            fence,
            decided_at,
            lease: place.ttl,
            session: 0,
            advisory: None,
        });
    }
    let mut queue: Vec<Entry> = Vec::with_capacity(rows.len());
    for row in &rows {
        // No queue row (a queue read empty): nothing is ahead.
        if row.try_get::<_, Option<i64>>(0).map_err(read)?.is_some() {
            queue.push(Entry::from_row(row)?);
        }
    }
    match decide(place.name, place.kind, seq, &queue) {
        Ok(Decision::Granted) => Ok(Turn::Ready { seq }),
        Ok(Decision::Wait { blocked_for, watch }) => Ok(Turn::Waiting {
            seq,
            blocked_for,
            watch,
            decided_at,
        }),
        Err(err) => {
            withdraw(client, sql, name, seq, place.owner).await?;
            Err(err)
        }
    }
}

/// Deletes entry `seq` of `owner` (an enqueue refused after its commit), telling its
/// watchers.
async fn withdraw(
    client: &PgClient,
    sql: &Statements,
    name: &str,
    seq: i64,
    owner: &str,
) -> Result<()> {
    let channel: &str = &client.channel;
    client
        .run("withdrawing a refused entry", async |conn| {
            let (release, left) =
                futures::join!(conn.statement(&sql.release), conn.statement(&sql.left));
            let (release, left) = (release?, left?);
            let c = conn.client();
            let by_owner: [&(dyn ToSql + Sync); 2] = [&seq, &owner];
            let leaving: [&(dyn ToSql + Sync); 3] = [&channel, &seq, &name];
            let (deleted, notified) =
                futures::join!(c.query_opt(&release, &by_owner), c.execute(&left, &leaving));
            deleted?;
            notified?;
            Ok(())
        })
        .await
}

/// Deletes the hold's entry if it is still ours and grants the entry at the head of the
/// queue if nothing live is ahead of it (see the module docs), in one transaction under
/// the name's lock sent in one round trip: the lock, one statement (the delete, the
/// grant, the notification of the entry's leaving after the grant's, so that a grantee
/// that watched the entry finds its grant when woken) and the commit. Once committed, a grantee
/// waiting in this process is woken through `listener` at once. Whether the entry was
/// live; `None` if it was not ours.
pub(crate) async fn release(
    client: &PgClient,
    sql: &Statements,
    listener: &Listener,
    hold: &PostgresHold,
) -> Result<Option<bool>> {
    let channel: &str = &client.channel;
    let by_name: [&(dyn ToSql + Sync); 1] = [&hold.name];
    let leaving: [&(dyn ToSql + Sync); 4] = [&hold.name, &channel, &hold.seq, &hold.owner];
    let (live, handed) = client
        .run("releasing a lock", async |conn| {
            let (lock, leave) =
                futures::join!(conn.statement(&sql.lock), conn.statement(&sql.leave));
            let (lock, leave) = (lock?, leave?);
            conn.begin();
            let c = conn.client();
            let (begun, locked, left, committed) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&lock, &by_name),
                c.query_one(&leave, &leaving),
                c.batch_execute("COMMIT"),
            );
            committed?;
            conn.committed();
            let (_, _, left) = (begun?, locked?, left?);
            let live: Option<bool> = left.try_get(0)?;
            let seq: Option<i64> = left.try_get(1)?;
            let fence: Option<i64> = left.try_get(2)?;
            Ok((live, seq.zip(fence)))
        })
        .await?;
    if let Some((seq, fence)) = handed {
        listener.granted_here(&hold.name, seq, fence);
    }
    Ok(live)
}

/// A grant on release that `waiter` saw for its entry, if it can be taken without asking
/// the server: its lease (`lease`, from `decided_at`, the send time of the last decision
/// that left the entry waiting, which came before the grant) has more than half left.
pub(crate) fn handed(
    waiter: &Waiter,
    decided_at: tokio::time::Instant,
    lease: Duration,
) -> Option<i64> {
    let fence = waiter.grant()?;
    (tokio::time::Instant::now() < decided_at + lease / 2).then_some(fence)
}
