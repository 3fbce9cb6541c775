//! Where locks live in the database: three tables in the client's schema (default
//! `distlock`), created on first use, and the rows of one name's queue.
//!
//! - `names (name, fence)`: one row per name ever locked. Every write that decides a
//!   grant locks the name's row first (`FOR UPDATE`), so the decisions on one name are
//!   serial and queue order is commit order. `fence` is the name's fencing counter; the
//!   row outlives its holds so that tokens keep increasing.
//! - `entries (seq, name, owner, kind, permits, count, value, value_version, granted,
//!   fence, client, session, since, expires_at, grant_ms, fence_floor)`: one row per hold or
//!   waiter, in `seq` order. A row whose `expires_at` (server time) has passed is dead:
//!   whoever decides on the name next deletes it. Holders and waiters push `expires_at`
//!   forward while alive. A waiter with a `grant_ms` may be granted by a release (with that
//!   first lease, and a token no lower than its `fence_floor`); one without (a client that
//!   takes advisory locks) decides its own grant.
//! - `marks (name, owner, until)`: what a forced release leaves for the broken holder's
//!   renewal, so that it is told `Broken`, not `Expired`.
//!
//! Every client also sweeps, every TTL (1 s to 30 s), the entries of any name dead for a
//! second and the marks past their time, so that a crashed client's rows go even where
//! nobody locks its names again.
//!
//! Every change to a name's queue notifies the channel named like the schema with the
//! name as payload (see [`crate::connection`]).

use std::time::Duration;

use lock_core::raw::backend::HoldKind;
use lock_core::{Error, Result};
use tokio_postgres::Row;

use crate::error::BACKEND;

/// The statements that create the schema, its tables and index (idempotent). `{s}` is
/// the quoted schema name.
pub(crate) fn schema_ddl(schema: &str) -> String {
    let s = quote_ident(schema);
    // The table's name as a string literal's text (tables of an older layout gain the
    // columns of grants on release).
    let entries = format!("{s}.entries").replace('\'', "''");
    format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.names (
             name text PRIMARY KEY,
             fence bigint NOT NULL DEFAULT 0
         );
         CREATE TABLE IF NOT EXISTS {s}.entries (
             seq bigserial PRIMARY KEY,
             name text NOT NULL,
             owner text NOT NULL,
             kind text NOT NULL,
             permits integer,
             count integer,
             value bytea,
             value_version bigint NOT NULL DEFAULT 0,
             granted boolean NOT NULL DEFAULT false,
             fence bigint,
             client text NOT NULL,
             session bigint NOT NULL DEFAULT 0,
             since timestamptz NOT NULL DEFAULT clock_timestamp(),
             expires_at timestamptz NOT NULL,
             grant_ms float8,
             fence_floor bigint NOT NULL DEFAULT 0,
             UNIQUE (name, owner)
         );
         DO $layout$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = '{entries}'::regclass AND attname = 'grant_ms') THEN
                 ALTER TABLE {s}.entries ADD COLUMN grant_ms float8,
                     ADD COLUMN fence_floor bigint NOT NULL DEFAULT 0;
             END IF;
         END $layout$;
         CREATE INDEX IF NOT EXISTS entries_by_name ON {s}.entries (name, seq);
         CREATE INDEX IF NOT EXISTS entries_by_expiry ON {s}.entries (expires_at);
         CREATE TABLE IF NOT EXISTS {s}.marks (
             name text NOT NULL,
             owner text NOT NULL,
             until timestamptz NOT NULL,
             PRIMARY KEY (name, owner)
         );"
    )
}

/// `ident` as a quoted SQL identifier.
pub(crate) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The `kind` column of a hold kind, with its `permits` and `count` columns.
pub(crate) fn kind_columns(kind: &HoldKind) -> Result<(&'static str, Option<i32>, Option<i32>)> {
    let int = |n: u32| {
        i32::try_from(n)
            .map_err(|_| Error::config(format!("{n} permits is more than Postgres keeps")))
    };
    Ok(match kind {
        HoldKind::Mutex => ("mutex", None, None),
        HoldKind::Candidate { .. } => ("candidate", None, None),
        HoldKind::Read => ("read", None, None),
        HoldKind::Write => ("write", None, None),
        HoldKind::Upgradeable => ("upgradeable", None, None),
        HoldKind::Permit { permits, count } => ("permit", Some(int(*permits)?), Some(int(*count)?)),
        other => {
            return Err(Error::unsupported(
                BACKEND,
                format!("holds of {}", other.describe()),
            ))
        }
    })
}

/// The hold kind of a row's `kind`, `permits`, `count` and `value` columns.
pub(crate) fn kind_of(
    kind: &str,
    permits: Option<i32>,
    count: Option<i32>,
    value: Option<Vec<u8>>,
) -> Result<HoldKind> {
    let unsigned = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok());
    Ok(match kind {
        "mutex" => HoldKind::Mutex,
        "candidate" => HoldKind::Candidate {
            value: value.unwrap_or_default(),
        },
        "read" => HoldKind::Read,
        "write" => HoldKind::Write,
        "upgradeable" => HoldKind::Upgradeable,
        "permit" => match (unsigned(permits), unsigned(count)) {
            (Some(permits), Some(count)) => HoldKind::Permit { permits, count },
            _ => {
                return Err(crate::error::unexpected(
                    "reading a queue",
                    "a permit row without counts",
                ))
            }
        },
        other => {
            return Err(crate::error::unexpected(
                "reading a queue",
                format!("an entry of kind {other:?}"),
            ))
        }
    })
}

/// The columns [`Entry::from_row`] reads, in its order.
pub(crate) const ENTRY_COLUMNS: &str = "seq, owner, kind, permits, count, value, value_version, \
     granted, fence, client, since, \
     (extract(epoch FROM (expires_at - clock_timestamp())) * 1000)::float8";

/// One row of a name's queue.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) seq: i64,
    pub(crate) owner: String,
    pub(crate) kind: HoldKind,
    pub(crate) value_version: i64,
    pub(crate) granted: bool,
    pub(crate) fence: Option<i64>,
    pub(crate) client: String,
    pub(crate) since: std::time::SystemTime,
    /// How long until it expires, by the server's clock when read; zero once it has.
    pub(crate) left: Duration,
    /// Whether it had expired when read.
    pub(crate) dead: bool,
}

impl Entry {
    /// Reads a row selected with [`ENTRY_COLUMNS`].
    pub(crate) fn from_row(row: &Row) -> Result<Entry> {
        let get = |e: tokio_postgres::Error| crate::error::unexpected("reading a queue", e);
        let left_ms: f64 = row.try_get(11).map_err(get)?;
        let value: Option<Vec<u8>> = row.try_get(5).map_err(get)?;
        Ok(Entry {
            seq: row.try_get(0).map_err(get)?,
            owner: row.try_get(1).map_err(get)?,
            kind: kind_of(
                row.try_get(2).map_err(get)?,
                row.try_get(3).map_err(get)?,
                row.try_get(4).map_err(get)?,
                value,
            )?,
            value_version: row.try_get(6).map_err(get)?,
            granted: row.try_get(7).map_err(get)?,
            fence: row.try_get(8).map_err(get)?,
            client: row.try_get(9).map_err(get)?,
            since: row.try_get(10).map_err(get)?,
            left: Duration::from_secs_f64((left_ms / 1000.0).max(0.0)),
            dead: left_ms < 0.0,
        })
    }
}

/// Milliseconds of `duration` for SQL (`$n * interval '1 millisecond'`), at least 1.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis())
        .unwrap_or(i64::MAX)
        .max(1)
}
