//! One hold's row ([`PostgresHold`]) and the owner-checked statements on it: the batched
//! renewal (one statement for every hold of the client), release, and amendments
//! (proclaim, downgrade, upgrade). Each is keyed on the entry's `seq` and owner token, so
//! it never touches another acquisition's row.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::raw::backend::{Amended, BackendRelease, HoldKind, RenewOutcome};
use lock_core::{LostReason, Result};
use tokio_postgres::types::ToSql;

use crate::advisory::{Advisory, AdvisoryKey, Mode};
use crate::connection::PgClient;
use crate::listener::Waiter;

/// Backend data of one hold: its entry.
#[derive(Debug)]
pub struct PostgresHold {
    /// The lock name.
    pub name: String,
    /// The entry's place in the queue (`entries.seq`).
    pub seq: i64,
    /// The owner token the entry carries.
    pub owner: String,
    /// What it holds (a downgrade or an upgrade changes it).
    pub(crate) kind: Mutex<HoldKind>,
    /// The advisory lock held with it, and the holding session's epoch (shared with
    /// [`give_back_when_gone`]).
    pub(crate) advisory: HeldAdvisory,
}

impl PostgresHold {
    fn set_kind(&self, kind: HoldKind) {
        *self
            .kind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = kind;
    }

    fn advisory(&self) -> std::sync::MutexGuard<'_, Option<(AdvisoryKey, Mode, u64)>> {
        taken_lock(&self.advisory)
    }

    /// Gives back the advisory lock held with this hold, if any (once).
    pub(crate) async fn give_back(&self, advisory: Option<&Advisory>) {
        let held = self.advisory().take();
        if let (Some(advisory), Some((key, mode, epoch))) = (advisory, held) {
            if let Err(err) = advisory.unlock(key, mode, epoch).await {
                tracing::debug!(name = self.name, error = %err, "giving back an advisory lock failed; its session was ended");
            }
        }
    }
}

/// The first column of `rows`.
pub(crate) fn column<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    rows: &[tokio_postgres::Row],
) -> std::result::Result<Vec<T>, tokio_postgres::Error> {
    rows.iter().map(|row| row.try_get(0)).collect()
}

/// The advisory lock a hold carries, if any, and the epoch of the session holding it;
/// whoever takes it out gives it back.
pub(crate) type HeldAdvisory = Arc<Mutex<Option<(AdvisoryKey, Mode, u64)>>>;

/// While the hold carries an advisory lock: gives it back the moment the hold's entry
/// leaves the table by another hand (a break, a steal, a purge after expiry), woken by
/// the name's notifications, so that the next grantee does not wait for the hold's next
/// renewal to find it gone. Ends once the lock was given back (by anyone), the hold is
/// gone, or on an error (the renewal then gives it back).
pub(crate) async fn give_back_when_gone(
    client: PgClient,
    waiter: Waiter,
    seq: i64,
    owner: String,
    held: std::sync::Weak<Mutex<Option<(AdvisoryKey, Mode, u64)>>>,
    advisory: std::sync::Weak<Advisory>,
) {
    let sql = format!(
        "SELECT 1 FROM {}.entries WHERE seq = $1 AND owner = $2",
        client.schema
    );
    waiter.watch(seq, [seq]);
    loop {
        waiter.woken().await;
        // The client is gone (its listener's end woke us): nothing more will.
        let Some(shared) = held.upgrade().filter(|_| advisory.strong_count() > 0) else {
            return;
        };
        if taken_lock(&shared).is_none() {
            return;
        }
        let present = client
            .run("checking a hold's entry", async |conn| {
                let statement = conn.statement(&sql).await?;
                let row = conn.client().query_opt(&statement, &[&seq, &owner]).await?;
                Ok(row.is_some())
            })
            .await;
        match present {
            Ok(true) => {}
            Ok(false) => {
                let taken = taken_lock(&shared).take();
                if let (Some((key, mode, epoch)), Some(advisory)) = (taken, advisory.upgrade()) {
                    if let Err(err) = advisory.unlock(key, mode, epoch).await {
                        tracing::debug!(error = %err, "giving back a gone hold's advisory lock failed; its session was ended");
                    }
                }
                return;
            }
            Err(_) => return,
        }
    }
}

fn taken_lock(
    held: &Mutex<Option<(AdvisoryKey, Mode, u64)>>,
) -> std::sync::MutexGuard<'_, Option<(AdvisoryKey, Mode, u64)>> {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why the entries of `owners` are gone: `Broken` where a forced release left a mark,
/// `Expired` otherwise.
async fn gone_reasons(client: &PgClient, owners: &[&str]) -> Result<Vec<LostReason>> {
    let sql = format!(
        "SELECT owner FROM {}.marks WHERE owner = ANY($1) AND until >= clock_timestamp()",
        client.schema
    );
    let marked: Vec<String> = client
        .run("reading the marks of broken holds", async |conn| {
            let statement = conn.statement(&sql).await?;
            let rows = conn.client().query(&statement, &[&owners]).await?;
            Ok(column(&rows)?)
        })
        .await?;
    Ok(owners
        .iter()
        .map(|owner| {
            if marked.iter().any(|m| m == owner) {
                LostReason::Broken
            } else {
                LostReason::Expired
            }
        })
        .collect())
}

/// Why the entry of `hold` is gone ([`gone_reasons`] for one).
async fn gone_reason(client: &PgClient, hold: &PostgresHold) -> Result<LostReason> {
    let reasons = gone_reasons(client, &[hold.owner.as_str()]).await?;
    Ok(reasons.first().copied().unwrap_or(LostReason::Expired))
}

/// Renews `holds` (each with its TTL) in one statement; one outcome per hold, in order.
/// A hold renewed is guaranteed its TTL from when the statement was sent.
pub(crate) async fn renew(
    client: &PgClient,
    holds: &[(&PostgresHold, Duration)],
) -> Result<Vec<RenewOutcome>> {
    let sql = format!(
        "UPDATE {s}.entries AS e \
         SET expires_at = clock_timestamp() + t.ttl * interval '1 millisecond' \
         FROM unnest($1::int8[], $2::text[], $3::float8[]) AS t(seq, owner, ttl) \
         WHERE e.seq = t.seq AND e.owner = t.owner AND e.granted \
             AND e.expires_at >= clock_timestamp() \
         RETURNING e.seq",
        s = client.schema
    );
    let seqs: Vec<i64> = holds.iter().map(|(h, _)| h.seq).collect();
    let owners: Vec<&str> = holds.iter().map(|(h, _)| h.owner.as_str()).collect();
    let ttls: Vec<f64> = holds
        .iter()
        .map(|(_, ttl)| crate::layout::millis(*ttl) as f64)
        .collect();
    let renewed: Vec<i64> = client
        .run("renewing holds", async |conn| {
            let statement = conn.statement(&sql).await?;
            let params: [&(dyn ToSql + Sync); 3] = [&seqs, &owners, &ttls];
            let rows = conn.client().query(&statement, &params).await?;
            Ok(column(&rows)?)
        })
        .await?;
    let missing: Vec<&str> = holds
        .iter()
        .filter(|(h, _)| !renewed.contains(&h.seq))
        .map(|(h, _)| h.owner.as_str())
        .collect();
    let mut reasons = if missing.is_empty() {
        Vec::new()
    } else {
        gone_reasons(client, &missing).await?
    }
    .into_iter();
    Ok(holds
        .iter()
        .map(|(hold, ttl)| {
            if renewed.contains(&hold.seq) {
                RenewOutcome::Renewed { lease: *ttl }
            } else {
                RenewOutcome::Lost(reasons.next().unwrap_or(LostReason::Expired))
            }
        })
        .collect())
}

/// Deletes the hold's entry if it is still ours, granting whom its leaving grants
/// ([`crate::handover::release`]).
pub(crate) async fn release(
    client: &PgClient,
    sql: &crate::handover::Statements,
    listener: &crate::listener::Listener,
    hold: &PostgresHold,
) -> Result<BackendRelease> {
    let live = crate::handover::release(client, sql, listener, hold).await?;
    Ok(match live {
        Some(true) => BackendRelease::Released,
        Some(false) => BackendRelease::NotOwner(LostReason::Expired),
        None => BackendRelease::NotOwner(gone_reason(client, hold).await?),
    })
}

/// Runs an owner-checked update of the hold's live entry that notifies with `payload`
/// (`-` for a change of kind, `+` for another), or tells why the entry is gone.
async fn amend_row(
    client: &PgClient,
    hold: &PostgresHold,
    what: &str,
    set: &str,
    condition: &str,
    extra: Option<&(dyn ToSql + Sync)>,
    payload: char,
) -> Result<Amended> {
    let sql = format!(
        "WITH changed AS (UPDATE {s}.entries SET {set} \
             WHERE seq = $1 AND owner = $2 AND {condition} \
                 AND expires_at >= clock_timestamp() RETURNING name, seq) \
         SELECT pg_notify($3, '{payload}' || (CASE WHEN '{payload}' = '-' THEN seq::text \
             ELSE '' END) || ':' || name) FROM changed",
        s = client.schema
    );
    let channel: &str = &client.channel;
    let changed = client
        .run(what, async |conn| {
            let statement = conn.statement(&sql).await?;
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&hold.seq, &hold.owner, &channel];
            params.extend(extra);
            let rows = conn.client().query(&statement, &params).await?;
            Ok(!rows.is_empty())
        })
        .await?;
    if changed {
        return Ok(Amended::Done);
    }
    Ok(Amended::NotOwner(gone_reason(client, hold).await?))
}

/// Stores a candidate's new value (observers are told).
pub(crate) async fn proclaim(
    client: &PgClient,
    hold: &PostgresHold,
    value: &[u8],
) -> Result<Amended> {
    let value = value.to_vec();
    amend_row(
        client,
        hold,
        "proclaiming",
        "value = $4, value_version = value_version + 1",
        "kind = 'candidate'",
        Some(&value),
        '+',
    )
    .await
}

/// Turns a writer's entry into a reader's in place (the readers behind it are told), and
/// its exclusive advisory lock into a shared one (taken before the other is given back).
pub(crate) async fn downgrade(
    client: &PgClient,
    hold: &PostgresHold,
    advisory: Option<&Arc<Advisory>>,
) -> Result<Amended> {
    let amended = amend_row(
        client,
        hold,
        "downgrading a write lock",
        "kind = 'read'",
        "kind IN ('write', 'read')",
        None,
        '-',
    )
    .await?;
    if amended == Amended::Done {
        hold.set_kind(HoldKind::Read);
        let held = *hold.advisory();
        if let (Some(advisory), Some((key, Mode::Exclusive, epoch))) = (advisory, held) {
            match advisory.try_lock(key, Mode::Shared).await? {
                Some(now) if now == epoch => {
                    *hold.advisory() = Some((key, Mode::Shared, epoch));
                    advisory.unlock(key, Mode::Exclusive, epoch).await?;
                }
                // A new session: the hold's own went, and with it the hold.
                Some(now) => advisory.unlock(key, Mode::Shared, now).await?,
                None => {}
            }
        }
    }
    Ok(amended)
}

/// One upgrade step, under the name's lock (so no reader is granted beside it meanwhile):
/// the entry becomes a writer's, then `Done` if nobody else holds (its shared advisory
/// lock turned exclusive, which waits for other sessions' readers too), `Pending`
/// otherwise.
pub(crate) async fn upgrade(
    client: &PgClient,
    hold: &PostgresHold,
    advisory: Option<&Arc<Advisory>>,
) -> Result<Amended> {
    let s = &client.schema;
    let lock = format!("SELECT fence FROM {s}.names WHERE name = $1 FOR UPDATE");
    let rewrite = format!(
        "UPDATE {s}.entries SET kind = 'write' WHERE seq = $1 AND owner = $2 \
             AND kind IN ('upgradeable', 'write') AND expires_at >= clock_timestamp() \
         RETURNING seq"
    );
    let others = format!(
        "SELECT count(*) FROM {s}.entries WHERE name = $1 AND seq <> $2 AND granted \
             AND expires_at >= clock_timestamp()"
    );
    let notify = "SELECT pg_notify($1, '+:' || $2)";
    let channel: &str = &client.channel;
    let name = hold.name.as_str();
    let step = client
        .run("upgrading a read lock", async |conn| {
            let (lock, rewrite, others, notify) = futures::join!(
                conn.statement(&lock),
                conn.statement(&rewrite),
                conn.statement(&others),
                conn.statement(notify),
            );
            let (lock, rewrite, others, notify) = (lock?, rewrite?, others?, notify?);
            conn.begin();
            let c = conn.client();
            let by_name: [&(dyn ToSql + Sync); 1] = [&name];
            let by_owner: [&(dyn ToSql + Sync); 2] = [&hold.seq, &hold.owner];
            let beside: [&(dyn ToSql + Sync); 2] = [&name, &hold.seq];
            let notice: [&(dyn ToSql + Sync); 2] = [&channel, &name];
            let (begun, locked, rewritten, others, notified, committed) = futures::join!(
                c.batch_execute("BEGIN"),
                c.query_opt(&lock, &by_name),
                c.query_opt(&rewrite, &by_owner),
                c.query_one(&others, &beside),
                c.execute(&notify, &notice),
                c.batch_execute("COMMIT"),
            );
            committed?;
            conn.committed();
            let (_, _, rewritten, others, _) = (begun?, locked?, rewritten?, others?, notified?);
            let others: i64 = others.try_get(0)?;
            Ok(rewritten.map(|_| others))
        })
        .await?;
    match step {
        Some(0) => {
            let held = *hold.advisory();
            if let (Some(advisory), Some((key, Mode::Shared, epoch))) = (advisory, held) {
                match advisory.try_lock(key, Mode::Exclusive).await? {
                    Some(now) if now == epoch => {}
                    Some(now) => {
                        // A new session: the hold's own went, and with it the hold.
                        advisory.unlock(key, Mode::Exclusive, now).await?;
                        return Ok(Amended::Pending);
                    }
                    None => return Ok(Amended::Pending),
                }
                *hold.advisory() = Some((key, Mode::Exclusive, epoch));
                advisory.unlock(key, Mode::Shared, epoch).await?;
            }
            hold.set_kind(HoldKind::Write);
            Ok(Amended::Done)
        }
        Some(_) => Ok(Amended::Pending),
        None => Ok(Amended::NotOwner(gone_reason(client, hold).await?)),
    }
}

/// With advisory locks, until aborted: each time a holding session ends, deletes the
/// entries the client (`client_id`) was granted in it or before (its holds are lost with
/// their advisory locks, and their rows must not hold the name until their expiry),
/// telling the waiters. A delete that keeps failing is given up after a minute; the
/// entries' expiry ends them then.
pub(crate) async fn end_with_sessions(
    client: PgClient,
    client_id: String,
    mut sessions: tokio::sync::watch::Receiver<lock_core::raw::backend::SessionStatus>,
) {
    let sql = format!(
        "WITH gone AS (DELETE FROM {s}.entries \
             WHERE client = $1 AND session BETWEEN 1 AND $2 RETURNING name, seq) \
         SELECT pg_notify($3, '-' || seq || ':' || name) FROM gone",
        s = client.schema
    );
    let channel = client.channel.to_string();
    while sessions.changed().await.is_ok() {
        let status = *sessions.borrow_and_update();
        if status.health != lock_core::raw::backend::SessionHealth::Expired {
            continue;
        }
        let ended = i64::try_from(status.epoch).unwrap_or(i64::MAX);
        let deleted = client
            .execute_patiently(
                "ending the holds of an ended session",
                &sql,
                &[&client_id, &ended, &channel.as_str()],
                Duration::from_secs(60),
                |_| true,
            )
            .await;
        match deleted {
            Ok(n) => tracing::debug!(
                session = ended,
                entries = n,
                "ended the holds of a holding session"
            ),
            Err(err) => {
                tracing::warn!(error = %err, "ending the holds of a holding session failed; their expiry ends them")
            }
        }
    }
}
