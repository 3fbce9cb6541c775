//! Advisory locks beside the lease table (`advisory_locks=on`), so that applications
//! that lock a name with `pg_advisory_lock` on the key madelson's DistributedLock derives
//! for it ([`madelson_key`]) and distlock holders of the name exclude each other.
//!
//! A grant that the table allows also takes the name's advisory lock (exclusive for a
//! mutex or a writer, shared for a reader or an upgradeable reader; none for permits and
//! candidates, which madelson has no Postgres form of) with `pg_try_advisory_lock…` on
//! the client's holding connection, one session of its own that carries every advisory
//! lock of the client: when another session holds it, the grant waits (re-checking every
//! [`FOREIGN_POLL`]). Session locks live as long as that connection, so its loss ends
//! every hold of the client ([`Advisory::session`] reports the session expired), and a
//! holder whose lease ran out while its connection stays open (a hung process) has its
//! holding connection ended by the next grantee (`pg_terminate_backend`), which keeps
//! the lease rule: a hung holder blocks others for its TTL and a bound.
//!
//! The key derivation is written here because no maintained crate ports it exactly (the
//! `distributed-lock` crate locks short names in the other key space).

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::backend::{HoldKind, SessionHealth, SessionStatus};
use lock_core::{Error, Result};
use sha1::{Digest, Sha1};
use tokio::sync::{oneshot, watch, Mutex};
use tokio_postgres::types::ToSql;

use crate::error::{from_client, BACKEND};
use crate::tls::Connector;

/// How often a grant blocked by another session's advisory lock re-checks.
pub(crate) const FOREIGN_POLL: Duration = Duration::from_millis(100);

/// An advisory lock key: one `bigint`, or a pair of `int4` (a separate key space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvisoryKey {
    /// `pg_advisory_lock(bigint)`.
    Single(i64),
    /// `pg_advisory_lock(int4, int4)`.
    Pair(i32, i32),
}

/// The key madelson's DistributedLock (`PostgresAdvisoryLockKey(name, allowHashing:
/// true)`) derives for `name`: ASCII names of at most 9 characters packed 7 bits a
/// character into an `int4` pair; 16 hex digits as a `bigint`, `8 hex,8 hex` as a pair;
/// any other name the first 8 bytes of its UTF-8 SHA-1, little-endian, as a `bigint`.
pub fn madelson_key(name: &str) -> AdvisoryKey {
    if name.len() <= 9 && name.is_ascii() {
        let mut bits: u64 = 0;
        for byte in name.bytes() {
            bits = (bits << 7) | u64::from(byte);
        }
        bits <<= 1;
        for _ in name.len()..9 {
            bits = (bits << 7) | 0x7f;
        }
        return pair_of(bits);
    }
    let hex32 = |part: &str| {
        (part.len() == 8 && part.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(part, 16).ok())
            .flatten()
    };
    if name.len() == 16 && name.is_ascii() {
        if let (Some(high), Some(low)) = (hex32(&name[..8]), hex32(&name[8..])) {
            return AdvisoryKey::Single(i64::from_be_bytes(
                ((u64::from(high) << 32) | u64::from(low)).to_be_bytes(),
            ));
        }
    }
    if name.len() == 17 && name.is_ascii() && name.as_bytes()[8] == b',' {
        if let (Some(high), Some(low)) = (hex32(&name[..8]), hex32(&name[9..])) {
            return AdvisoryKey::Pair(as_i32(high), as_i32(low));
        }
    }
    let digest = Sha1::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    AdvisoryKey::Single(i64::from_le_bytes(first))
}

fn as_i32(bits: u32) -> i32 {
    i32::from_be_bytes(bits.to_be_bytes())
}

fn pair_of(bits: u64) -> AdvisoryKey {
    let [a, b, c, d, e, f, g, h] = bits.to_be_bytes();
    AdvisoryKey::Pair(
        i32::from_be_bytes([a, b, c, d]),
        i32::from_be_bytes([e, f, g, h]),
    )
}

/// Shared or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Exclusive,
    Shared,
}

impl Mode {
    /// The mode a hold of `kind` takes, if any.
    pub(crate) fn of(kind: &HoldKind) -> Option<Mode> {
        match kind {
            HoldKind::Mutex | HoldKind::Write => Some(Mode::Exclusive),
            HoldKind::Read | HoldKind::Upgradeable => Some(Mode::Shared),
            _ => None,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Mode::Exclusive => "",
            Mode::Shared => "_shared",
        }
    }
}

impl AdvisoryKey {
    /// The key as the arguments of an advisory-lock function (`$1::int8`, or
    /// `$1::int4, $2::int4`: the two key spaces never meet), with their values.
    pub fn sql_args(&self) -> (&'static str, Vec<&(dyn ToSql + Sync)>) {
        match self {
            AdvisoryKey::Single(value) => ("$1::int8", vec![value]),
            AdvisoryKey::Pair(high, low) => ("$1::int4, $2::int4", vec![high, low]),
        }
    }

    /// `pg_locks`' `(classid, objid, objsubid)` of this key.
    fn lock_row(self) -> (i64, i64, i16) {
        let halves = |high: u32, low: u32| (i64::from(high), i64::from(low));
        match self {
            AdvisoryKey::Single(value) => {
                let bits = u64::from_be_bytes(value.to_be_bytes());
                let (c, o) = halves((bits >> 32) as u32, (bits & 0xffff_ffff) as u32);
                (c, o, 1)
            }
            AdvisoryKey::Pair(high, low) => {
                let (c, o) = halves(
                    u32::from_be_bytes(high.to_be_bytes()),
                    u32::from_be_bytes(low.to_be_bytes()),
                );
                (c, o, 2)
            }
        }
    }
}

/// The client's holding connection and its session epochs.
#[derive(Debug)]
pub(crate) struct Advisory {
    config: tokio_postgres::Config,
    tls: Connector,
    timeout: Duration,
    conn: Mutex<Option<Holding>>,
    status: watch::Sender<SessionStatus>,
}

#[derive(Debug)]
struct Holding {
    client: tokio_postgres::Client,
    epoch: u64,
}

impl Advisory {
    /// The holding side of a client whose id is `client_id` (its holding connection
    /// shows `distlock:<id>` as its `application_name`).
    pub(crate) fn new(
        mut config: tokio_postgres::Config,
        tls: Connector,
        client_id: &str,
        timeout: Duration,
    ) -> Self {
        config.application_name(format!("distlock:{client_id}"));
        let (status, _) = watch::channel(SessionStatus {
            epoch: 0,
            health: SessionHealth::Expired,
        });
        Advisory {
            config,
            tls,
            timeout,
            conn: Mutex::new(None),
            status,
        }
    }

    /// Session changes: the epoch grows with each holding connection; its loss expires it.
    pub(crate) fn session(&self) -> watch::Receiver<SessionStatus> {
        self.status.subscribe()
    }

    /// The holding connection's epoch, connecting one if none is open.
    pub(crate) async fn epoch(&self) -> Result<u64> {
        let mut conn = self.conn.lock().await;
        self.live(&mut conn).await.map(|holding| holding.epoch)
    }

    async fn live<'a>(&self, conn: &'a mut Option<Holding>) -> Result<&'a Holding> {
        if conn.as_ref().is_some_and(|h| h.client.is_closed()) {
            self.expire(conn);
        }
        if conn.is_none() {
            let connect = self.config.connect(self.tls.make());
            let (client, connection) = tokio::time::timeout(self.timeout, connect)
                .await
                .map_err(|_| {
                    Error::no_answer(BACKEND, "opening the holding connection", self.timeout)
                })?
                .map_err(|err| from_client("opening the holding connection", err))?;
            let epoch = self.status.borrow().epoch + 1;
            let status = self.status.clone();
            tokio::spawn(async move {
                let _ = connection.await;
                // Every advisory lock of the session went with it.
                status.send_if_modified(|s| {
                    let ended = s.epoch == epoch && s.health != SessionHealth::Expired;
                    if ended {
                        s.health = SessionHealth::Expired;
                    }
                    ended
                });
            });
            self.status.send_replace(SessionStatus {
                epoch,
                health: SessionHealth::Connected,
            });
            *conn = Some(Holding { client, epoch });
        }
        conn.as_ref().ok_or_else(|| {
            crate::error::unexpected("the holding connection", "none after connecting")
        })
    }

    /// Ends the holding connection (its locks with it) and expires its epoch.
    fn expire(&self, conn: &mut Option<Holding>) {
        if let Some(holding) = conn.take() {
            self.status.send_if_modified(|s| {
                let ended = s.epoch == holding.epoch && s.health != SessionHealth::Expired;
                if ended {
                    s.health = SessionHealth::Expired;
                }
                ended
            });
        }
    }

    /// Runs `sql` (a function of the key returning one boolean) on the holding
    /// connection; an error or a silence ends the connection (what it held is in doubt).
    async fn call(&self, what: &str, sql: &str, key: AdvisoryKey) -> Result<(bool, u64)> {
        let mut conn = self.conn.lock().await;
        let holding = self.live(&mut conn).await?;
        let epoch = holding.epoch;
        let (args, params) = key.sql_args();
        let statement = sql.replace("{args}", args);
        let call = holding.client.query_one(&statement, &params);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(row)) => {
                let done: Option<bool> = row.try_get(0).map_err(|err| from_client(what, err))?;
                Ok((done.unwrap_or(false), epoch))
            }
            Ok(Err(err)) => {
                self.expire(&mut conn);
                Err(from_client(what, err))
            }
            Err(_) => {
                self.expire(&mut conn);
                Err(Error::no_answer(BACKEND, what, self.timeout))
            }
        }
    }

    /// Tries `key` in `mode`; the epoch of the session that holds it if taken. The try
    /// runs in a task of its own: if this future is dropped before it answers, the task
    /// gives back what it took.
    pub(crate) async fn try_lock(
        self: &Arc<Self>,
        key: AdvisoryKey,
        mode: Mode,
    ) -> Result<Option<u64>> {
        let (answer, answered) = oneshot::channel();
        let advisory = Arc::clone(self);
        tokio::spawn(async move {
            let sql = format!("SELECT pg_try_advisory_lock{}({{args}})", mode.suffix());
            let taken = advisory
                .call("taking an advisory lock", &sql, key)
                .await
                .map(|(taken, epoch)| taken.then_some(epoch));
            if let Err(Ok(Some(epoch))) = answer.send(taken) {
                let _ = advisory.unlock(key, mode, epoch).await;
            }
        });
        answered.await.map_err(|_| {
            crate::error::unexpected("taking an advisory lock", "a try that never answered")
        })?
    }

    /// Gives back one `mode` hold of `key` taken in session `epoch` (nothing when that
    /// session has ended: its locks went with it).
    pub(crate) async fn unlock(&self, key: AdvisoryKey, mode: Mode, epoch: u64) -> Result<()> {
        {
            let conn = self.conn.lock().await;
            if conn.as_ref().is_none_or(|h| h.epoch != epoch) {
                return Ok(());
            }
        }
        let sql = format!("SELECT pg_advisory_unlock{}({{args}})", mode.suffix());
        self.call("giving back an advisory lock", &sql, key)
            .await
            .map(|_| ())
    }

    /// Ends the holding connection.
    pub(crate) async fn close(&self) {
        let mut conn = self.conn.lock().await;
        self.expire(&mut conn);
    }
}

/// The sessions holding `key`, with their `application_name`: a distlock client's holding
/// connection shows `distlock:<client id>`.
pub(crate) fn holders_sql() -> &'static str {
    "SELECT l.pid, coalesce(a.application_name, '') FROM pg_locks AS l \
     JOIN pg_stat_activity AS a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.database = \
         (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid AND l.objsubid = $3"
}

/// The `pg_locks` row parameters of `key` for [`holders_sql`].
pub(crate) fn holders_params(key: AdvisoryKey) -> (i64, i64, i16) {
    key.lock_row()
}

/// An advisory lock taken for a grant not yet made: given back (in a task of its own)
/// unless [`Taken::keep`] hands it to the hold, so that an acquire dropped or failed
/// between the two leaves no advisory lock behind.
pub(crate) struct Taken {
    pub(crate) advisory: Option<Arc<Advisory>>,
    pub(crate) key: AdvisoryKey,
    pub(crate) mode: Mode,
    pub(crate) epoch: u64,
}

impl Taken {
    pub(crate) fn keep(mut self) -> (AdvisoryKey, Mode, u64) {
        self.advisory = None;
        (self.key, self.mode, self.epoch)
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(advisory) = self.advisory.take() {
            let (key, mode, epoch) = (self.key, self.mode, self.epoch);
            tokio::spawn(async move {
                if let Err(err) = advisory.unlock(key, mode, epoch).await {
                    tracing::debug!(error = %err, "giving back an unused advisory lock failed; its session was ended");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// madelson's own expectations (PostgresAdvisoryLockKeyTest.cs) and hand-checked ones.
    #[test]
    fn keys_match_madelson() {
        use AdvisoryKey::{Pair, Single};
        for (name, key) in [
            ("漢".repeat(18), Single(-5_707_277_204_051_710_361)),
            ("\0".repeat(9), Pair(0, 0)),
            (String::new(), Pair(2_147_483_647, -1)),
            ("\0".into(), Pair(16_777_215, -1)),
            ("A".into(), Pair(-2_097_152_001, -1)),
            ("a".into(), Pair(-1_023_410_177, -1)),
            ("test".into(), Pair(-375_939_257, -1)),
            ("MyLock".into(), Pair(-1_679_399_172, 2_061_500_415)),
            ("lock:1234".into(), Pair(-641_786_185, 1_280_914_280)),
            ("123456789".into(), Pair(1_657_379_654, -1_382_303_630)),
            ("\x7f".repeat(9), Pair(-1, -2)),
            ("0000000000000001".into(), Single(1)),
            ("00000003ffffffff".into(), Single(17_179_869_183)),
            ("8000000000000000".into(), Single(i64::MIN)),
            ("ffffffffffffffff".into(), Single(-1)),
            ("00000003,ffffffff".into(), Pair(3, -1)),
            ("80000000,00000000".into(), Pair(i32::MIN, 0)),
            ("MyLockName".into(), Single(4_062_898_426_641_073_528)),
            (
                "some very long name".into(),
                Single(1_765_484_347_666_752_899),
            ),
            ("distlock:job:42".into(), Single(-6_448_050_697_445_440_782)),
            ("漢字".into(), Single(-1_151_405_521_232_592_816)),
        ] {
            assert_eq!(madelson_key(&name), key, "{name:?}");
        }
    }

    #[test]
    fn lock_rows_split_keys_as_pg_locks_shows_them() {
        assert_eq!(
            AdvisoryKey::Single(-1).lock_row(),
            (0xffff_ffff, 0xffff_ffff, 1)
        );
        assert_eq!(AdvisoryKey::Single(1 << 32 | 5).lock_row(), (1, 5, 1));
        assert_eq!(AdvisoryKey::Pair(3, -1).lock_row(), (3, 0xffff_ffff, 2));
    }
}
