//! Grants on release: the transaction that removes a hold's entry also grants, under the
//! name's lock, the entry at the head of the queue when nothing live is ahead of it (the
//! one case of [`HoldKind::granted_behind`] the server applies itself: every kind is
//! granted behind nobody) and that takes a grant from another client (its entry has a
//! `grant_ms`), with the next fencing token, and tells it (`*<seq>.<fence>:<name>`) so
//! that it holds without a decision of its own: a hand-over costs the release (one round
//! trip) and one notification.
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
use crate::layout::Entry;
use crate::listener::Waiter;
use crate::queue::{decide, Decision, Place, Turn};

/// Shortest first lease of a grant on release ([`grant_lease`]).
const MIN_GRANT: Duration = Duration::from_secs(1);

/// The first lease of a hold a release grants to a waiter of `ttl`: two rechecks, at least
/// a second (room for its first renewal on a busy machine), at most the TTL. The waiter
/// renews it to the TTL a third of the way into it.
pub(crate) fn grant_lease(ttl: Duration, recheck: Duration) -> Duration {
    recheck.saturating_mul(2).max(MIN_GRANT).min(ttl)
}

/// The hand-over's statements for one schema, built once per client.
#[derive(Debug)]
pub(crate) struct Statements {
    lock: String,
    release: String,
    hand: String,
    left: String,
    enqueue: String,
    notice: String,
}

/// The SQL of [`Statements`] for `client`'s schema.
pub(crate) fn statements(client: &PgClient) -> Statements {
    let s = &client.schema;
    Statements {
        lock: format!("SELECT fence FROM {s}.names WHERE name = $1 FOR UPDATE"),
        release: format!(
            "DELETE FROM {s}.entries WHERE seq = $1 AND owner = $2 \
             RETURNING expires_at >= clock_timestamp()"
        ),
        hand: format!(
            "WITH head AS (SELECT seq, granted, grant_ms, fence_floor FROM {s}.entries \
                 WHERE name = $1 AND expires_at >= clock_timestamp() ORDER BY seq LIMIT 1), \
             taker AS (SELECT seq, fence_floor FROM head \
                 WHERE NOT granted AND grant_ms IS NOT NULL), \
             counter AS (UPDATE {s}.names \
                 SET fence = greatest(fence + 1, (SELECT fence_floor FROM taker)) \
                 WHERE name = $1 AND EXISTS (SELECT 1 FROM taker) RETURNING fence), \
             granted AS (UPDATE {s}.entries AS e SET granted = true, fence = counter.fence, \
                 expires_at = clock_timestamp() + e.grant_ms * interval '1 millisecond' \
                 FROM counter, taker WHERE e.seq = taker.seq RETURNING e.seq, e.fence) \
             SELECT pg_notify($2, '*' || seq || '.' || fence || ':' || $1) FROM granted"
        ),
        left: "SELECT pg_notify($1, '-' || $2::int8 || ':' || $3)".to_owned(),
        enqueue: format!(
            "WITH ahead AS (SELECT 1 FROM {s}.entries \
                 WHERE name = $1 AND expires_at >= clock_timestamp() LIMIT 1), \
             counter AS (UPDATE {s}.names SET fence = greatest(fence + 1, $10) \
                 WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM ahead) RETURNING fence) \
             INSERT INTO {s}.entries (name, owner, kind, permits, count, value, client, \
                 expires_at, grant_ms, fence_floor, granted, fence) \
             SELECT $1::text, $2::text, $3::text, $4::int4, $5::int4, $6::bytea, $7::text, \
                 clock_timestamp() + $8::float8 * interval '1 millisecond', $9::float8, \
                 $10::int8, counter.fence IS NOT NULL, counter.fence \
             FROM (SELECT 1) AS one LEFT JOIN counter ON true \
             RETURNING seq, granted, fence"
        ),
        notice: format!(
            "SELECT pg_notify($2, '+:' || $1) FROM {s}.entries \
             WHERE name = $1 AND owner = $3 AND granted"
        ),
    }
}

/// Queues `place` (a waiting acquire of a client that takes grants on release), granted
/// at once if nothing live is ahead, in one transaction under the name's lock sent in
/// one round trip: the lock, the purge of the dead, the insert (granting itself), the
/// notification of a grant, the read of the queue and the commit. Not granted, the entry
/// waits: [`Turn::Ready`] if [`decide`] grants it over what is ahead (a reader behind
/// readers), [`Turn::Waiting`] otherwise. A kind that cannot queue beside another is
/// refused, its entry deleted.
pub(crate) async fn enqueue(
    client: &PgClient,
    sql: &Statements,
    place: &Place<'_>,
) -> Result<Turn> {
    let entry = place.new_entry()?;
    let queue_sql = place.sql;
    let name = place.name.as_str();
    let channel: &str = &client.channel;
    let decided_at = Instant::now();
    let (own, rows) = client
        .run("queueing for a lock", async |conn| {
            let (lock, purge, enqueue, notice, queue) = futures::join!(
                conn.statement(&queue_sql.lock),
                conn.statement(&queue_sql.purge),
                conn.statement(&sql.enqueue),
                conn.statement(&sql.notice),
                conn.statement(&queue_sql.queue),
            );
            let (lock, purge, enqueue, notice, queue) = (lock?, purge?, enqueue?, notice?, queue?);
            conn.begin();
            let c = conn.client();
            let inserting = entry.params();
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let purging: [&(dyn ToSql + Sync); 2] = [&name, &channel];
            let noticing: [&(dyn ToSql + Sync); 3] = [&name, &channel, &place.owner];
            let (begun, locked, purged, own, noticed, rows, committed) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_one(&lock, &by_name),
                c.query(&purge, &purging),
                c.query_one(&enqueue, &inserting),
                c.query(&notice, &noticing),
                c.query(&queue, &by_name),
                c.batch_execute("COMMIT"),
            );
            committed?;
            conn.committed();
            let (_, _, _, own, _, rows) = (begun?, locked?, purged?, own?, noticed?, rows?);
            let own: (i64, bool, Option<i64>) = (own.try_get(0)?, own.try_get(1)?, own.try_get(2)?);
            Ok((own, rows))
        })
        .await?;
    let (seq, granted, fence) = own;
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
    let queue: Vec<Entry> = rows.iter().map(Entry::from_row).collect::<Result<_>>()?;
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
/// the name's lock sent in one round trip: the lock, the delete, the grant, the
/// notification of the entry's leaving (after the grant's, so that a grantee that
/// watched the entry finds its grant when woken) and the commit. Whether the entry was
/// live; `None` if it was not ours.
pub(crate) async fn release(
    client: &PgClient,
    sql: &Statements,
    hold: &PostgresHold,
) -> Result<Option<bool>> {
    let channel: &str = &client.channel;
    let by_name: [&(dyn ToSql + Sync); 1] = [&hold.name];
    let by_owner: [&(dyn ToSql + Sync); 2] = [&hold.seq, &hold.owner];
    let handing: [&(dyn ToSql + Sync); 2] = [&hold.name, &channel];
    let leaving: [&(dyn ToSql + Sync); 3] = [&channel, &hold.seq, &hold.name];
    client
        .run("releasing a lock", async |conn| {
            let (lock, release, hand, left) = futures::join!(
                conn.statement(&sql.lock),
                conn.statement(&sql.release),
                conn.statement(&sql.hand),
                conn.statement(&sql.left),
            );
            let (lock, release, hand, left) = (lock?, release?, hand?, left?);
            conn.begin();
            let c = conn.client();
            let (begun, locked, live, handed, notified, committed) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&lock, &by_name),
                c.query_opt(&release, &by_owner),
                c.query(&hand, &handing),
                c.execute(&left, &leaving),
                c.batch_execute("COMMIT"),
            );
            committed?;
            conn.committed();
            let (_, _, live, _, _) = (begun?, locked?, live?, handed?, notified?);
            Ok(live.map(|row| row.try_get(0)).transpose()?)
        })
        .await
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
