//! Operator calls: `inspect`, `list`, `force_release` and a semaphore's resize, on the
//! tables of [`crate::layout`].

use std::time::Duration;

use lock_core::raw::backend::SemaphoreResize;
use lock_core::{FencingToken, LockName, Occupancy, Participant, Result};

use tokio_postgres::types::ToSql;

use crate::connection::PgClient;
use crate::hold::column;
use crate::layout::{kind_columns, millis, Entry, ENTRY_COLUMNS};
use crate::queue::fence_of;

/// What an inspection shows of one entry.
fn participant(entry: &Entry) -> Participant {
    let value = match &entry.kind {
        lock_core::raw::backend::HoldKind::Candidate { value } => Some(value.clone()),
        _ => None,
    };
    Participant::new(Some(entry.owner.clone()))
        .fencing_token(entry.fence.and_then(|f| fence_of(f).ok()).map(FencingToken))
        .lease_left(Some(entry.left))
        .session(Some(entry.client.clone()))
        .since(Some(entry.since))
        .value_version(
            value
                .as_ref()
                .and_then(|_| u64::try_from(entry.value_version).ok()),
        )
        .value(value)
        .kind(entry.kind.shown())
}

/// The live entries of `name` in queue order: holders, then waiters; the name's counter
/// as the token floor.
pub(crate) async fn inspect(client: &PgClient, name: &LockName) -> Result<Occupancy> {
    let s = &client.schema;
    let queue = format!(
        "SELECT {ENTRY_COLUMNS} FROM {s}.entries \
         WHERE name = $1 AND expires_at >= clock_timestamp() ORDER BY seq"
    );
    let counter = format!("SELECT fence FROM {s}.names WHERE name = $1");
    let name = name.as_str();
    let (rows, fence) = client
        .run("inspecting a lock", async |conn| {
            let (queue, counter) = futures::join!(conn.statement(&queue), conn.statement(&counter));
            let (queue, counter) = (queue?, counter?);
            let c = conn.client();
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let (rows, fence) =
                futures::join!(c.query(&queue, &by_name), c.query_opt(&counter, &by_name));
            let fence: Option<i64> = fence?.map(|row| row.try_get(0)).transpose()?;
            Ok((rows?, fence))
        })
        .await?;
    let entries: Vec<Entry> = rows.iter().map(Entry::from_row).collect::<Result<_>>()?;
    let (holders, waiters): (Vec<&Entry>, Vec<&Entry>) = entries.iter().partition(|e| e.granted);
    let occupancy = Occupancy::shared(
        holders.into_iter().map(participant).collect(),
        waiters.into_iter().map(participant).collect(),
    );
    Ok(occupancy.token_floor(fence.map(fence_of).transpose()?.map(FencingToken)))
}

/// The names under `prefix` with a live holder, sorted.
pub(crate) async fn list(client: &PgClient, prefix: &str) -> Result<Vec<LockName>> {
    let sql = format!(
        "SELECT DISTINCT name FROM {}.entries WHERE granted \
             AND expires_at >= clock_timestamp() AND starts_with(name, $1)",
        client.schema
    );
    let names: Vec<String> = client
        .run("listing locks", async |conn| {
            let statement = conn.statement(&sql).await?;
            let rows = conn.client().query(&statement, &[&prefix]).await?;
            Ok(column(&rows)?)
        })
        .await?;
    let mut names: Vec<LockName> = names
        .into_iter()
        .filter_map(|name| LockName::new(name).ok())
        .collect();
    names.sort();
    Ok(names)
}

/// Deletes the oldest live holder's entry of `name` and leaves a mark naming its owner
/// for `max(3 x own_ttl, mark_ttl)`; the waiters it may grant are told.
pub(crate) async fn force_release(
    client: &PgClient,
    name: &LockName,
    own_ttl: Duration,
    mark_ttl: Duration,
) -> Result<Option<Participant>> {
    let s = &client.schema;
    let lock = format!("SELECT fence FROM {s}.names WHERE name = $1 FOR UPDATE");
    let holder = format!(
        "SELECT {ENTRY_COLUMNS} FROM {s}.entries WHERE name = $1 AND granted \
             AND expires_at >= clock_timestamp() ORDER BY seq LIMIT 1"
    );
    let delete = format!(
        "WITH gone AS (DELETE FROM {s}.entries WHERE seq = $2 RETURNING owner), \
              marked AS (INSERT INTO {s}.marks (name, owner, until) \
                  SELECT $1, owner, clock_timestamp() + $3::float8 * interval '1 millisecond' \
                  FROM gone ON CONFLICT (name, owner) DO UPDATE SET until = excluded.until \
                  RETURNING owner), \
              swept AS (DELETE FROM {s}.marks WHERE until < clock_timestamp()) \
         SELECT pg_notify($4, '-' || $2 || ':' || $1) FROM marked"
    );
    let mark_ms = millis(own_ttl.saturating_mul(3).max(mark_ttl)) as f64;
    let channel: &str = &client.channel;
    let name = name.as_str();
    let broken = client
        .run("breaking a lock", async |conn| {
            let (lock, holder, delete) = futures::join!(
                conn.statement(&lock),
                conn.statement(&holder),
                conn.statement(&delete)
            );
            let (lock, holder, delete) = (lock?, holder?, delete?);
            conn.begin();
            let c = conn.client();
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let (begun, locked, holder) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&lock, &by_name),
                c.query_opt(&holder, &by_name),
            );
            let (_, _, holder) = (begun?, locked?, holder?);
            let Some(holder) = holder else {
                conn.rollback().await?;
                return Ok(None);
            };
            let entry = Entry::from_row(&holder)?;
            c.execute(&delete, &[&name, &entry.seq, &mark_ms, &channel])
                .await?;
            conn.commit().await?;
            Ok(Some(entry))
        })
        .await?;
    Ok(broken.as_ref().map(participant))
}

/// Every how long a client sweeps: its TTL, within 1 s and 30 s.
pub(crate) fn sweep_period(ttl: Duration) -> Duration {
    ttl.clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Sweeps every `period`, until aborted: deletes the entries (of any name) dead for a
/// second, telling their waiters, and the marks past their time. Failures are only
/// logged: the next sweep, or the next decision on a name, removes what this one left.
pub(crate) async fn sweep_forever(client: PgClient, period: Duration) {
    let s = client.schema.clone();
    let expired = crate::queue::expired_marks(&s, "name");
    let entries = format!(
        "WITH gone AS (DELETE FROM {s}.entries \
             WHERE expires_at < clock_timestamp() - interval '1 second' \
             RETURNING name, seq, client, granted), \
         {expired} \
         SELECT pg_notify($1, '-' || seq || ':' || name) FROM gone"
    );
    let marks = format!("DELETE FROM {s}.marks WHERE until < clock_timestamp()");
    let channel = client.channel.to_string();
    let channel: &str = &channel;
    loop {
        tokio::time::sleep(period).await;
        let swept = client
            .run("sweeping dead entries", async |conn| {
                let (entries, marks) =
                    futures::join!(conn.statement(&entries), conn.statement(&marks));
                let (entries, marks) = (entries?, marks?);
                let c = conn.client();
                let notice: [&(dyn ToSql + Sync); 1] = [&channel];
                let (swept, _) =
                    futures::join!(c.execute(&entries, &notice), c.execute(&marks, &[]));
                Ok(swept?)
            })
            .await;
        match swept {
            Ok(0) => {}
            Ok(n) => tracing::debug!(entries = n, "swept dead entries"),
            Err(err) => tracing::debug!(error = %err, "sweeping dead entries failed"),
        }
    }
}

/// Rewrites every live entry of the semaphore `name` as `resize` says, in one
/// transaction under the name's lock; every waiter of the name is told.
pub(crate) async fn resize(
    client: &PgClient,
    name: &LockName,
    resize: &SemaphoreResize<'_>,
) -> Result<()> {
    let s = &client.schema;
    let lock = format!("SELECT fence FROM {s}.names WHERE name = $1 FOR UPDATE");
    let queue = format!(
        "SELECT {ENTRY_COLUMNS} FROM {s}.entries \
         WHERE name = $1 AND expires_at >= clock_timestamp() ORDER BY seq"
    );
    let rewrite = format!(
        "UPDATE {s}.entries AS e SET permits = t.permits, count = t.count \
         FROM unnest($1::int8[], $2::int4[], $3::int4[]) AS t(seq, permits, count) \
         WHERE e.seq = t.seq"
    );
    let notify = "SELECT pg_notify($1, '-0:' || $2)";
    let channel: &str = &client.channel;
    let lock_name = name;
    let name = name.as_str();
    client
        .run("resizing a semaphore", async |conn| {
            let (lock, queue, rewrite, notify) = futures::join!(
                conn.statement(&lock),
                conn.statement(&queue),
                conn.statement(&rewrite),
                conn.statement(notify),
            );
            let (lock, queue, rewrite, notify) = (lock?, queue?, rewrite?, notify?);
            conn.begin();
            let c = conn.client();
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let (begun, locked, rows) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&lock, &by_name),
                c.query(&queue, &by_name),
            );
            let (_, _, rows) = (begun?, locked?, rows?);
            let mut seqs = Vec::new();
            let mut permits = Vec::new();
            let mut counts = Vec::new();
            let rewritten: Result<()> = (|| {
                for row in &rows {
                    let entry = Entry::from_row(row)?;
                    let kind = resize.rewrite(&entry.kind, Some(&entry.owner), lock_name)?;
                    let (_, p, n) = kind_columns(&kind)?;
                    seqs.push(entry.seq);
                    permits.push(p);
                    counts.push(n);
                }
                Ok(())
            })();
            if let Err(err) = rewritten {
                conn.rollback().await?;
                return Err(err.into());
            }
            if seqs.is_empty() {
                conn.rollback().await?;
                return Ok(());
            }
            let rewrites: [&(dyn ToSql + Sync); 3] = [&seqs, &permits, &counts];
            let notice: [&(dyn ToSql + Sync); 2] = [&channel, &name];
            let (rewritten, notified) =
                futures::join!(c.execute(&rewrite, &rewrites), c.execute(&notify, &notice),);
            rewritten?;
            notified?;
            conn.commit().await?;
            Ok(())
        })
        .await
}
