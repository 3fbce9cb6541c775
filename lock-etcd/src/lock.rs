//! The lock protocol: the layout of the Go client's `concurrency.Mutex`, acquire by one
//! transaction, waiting on the predecessor's delete, owner-checked release, and the
//! renewal check (one list of the lease's keys, whatever the number of holds).
//!
//! A lock `NAME` is the key range `<prefix>/<NAME>/` ([`EtcdConfig::lock_prefix`]). Each
//! contender puts `<prefix>/<NAME>/<lease id in hex>` attached to its client's lease;
//! the holder is the key with the lowest create revision, the rest queue in create
//! revision order (FIFO). The create revision of the holder's key is its fencing token.
//!
//! Concurrent acquisitions of one name in one client each queue on the server at once,
//! under a key of their own: the first under the plain `<lease id in hex>`, the others
//! under `<lease id in hex>_<n>` (n ≥ 1), so a later waiter of another client never
//! overtakes them. The Go client's `Mutex` orders every key under the range by create
//! revision, whatever its name, so the extra keys exclude `etcdctl lock` as well.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchStream,
};
use futures::future::join_all;
use lock_core::raw::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionStatus,
};
use lock_core::raw::{Connect, LeaseClient, LockUrl};
use lock_core::LockOptions;
use lock_core::{Capabilities, Error, FencingSource, FencingToken, LockName, LostReason, Result};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::client::{ends_wait, DeleteWatch, EtcdClient, LeaseKeys};
use crate::config::{lock_prefix, EtcdConfig};
use crate::error::{unexpected, BACKEND};
use crate::lease::{KeepAlive, Lease, Session};

/// etcd's default `--max-txn-ops`: the most operations (or compares) in one transaction.
pub const MAX_TXN_OPS: usize = 128;

/// Pause before a waiter retries a failed re-check.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A lock client on etcd.
pub type EtcdLock = LeaseClient<EtcdBackend>;

/// The protocol half of an etcd lock client (see the crate docs).
pub struct EtcdBackend {
    client: EtcdClient,
    session: Arc<Session>,
    prefix: String,
    label: String,
    recheck: Duration,
    slots: Arc<Slots>,
    /// How many holds the renewal checked when the lease's key list last did not fit
    /// one answer (0: it fits).
    keys_overflow: AtomicUsize,
}

/// Opened with [`Error::InvalidConfig`] for a bad configuration or refused credentials;
/// [`Error::Connection`] when authentication (with credentials) cannot reach etcd.
#[async_trait]
impl Connect for EtcdBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = EtcdConfig;

    fn config_from_url(url: &LockUrl) -> Result<EtcdConfig> {
        EtcdConfig::from_url(url)
    }

    fn lock_options(config: &EtcdConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: EtcdConfig) -> Result<EtcdBackend> {
        config.validate()?;
        let client = EtcdClient::connect(&config).await?;
        let backend = EtcdBackend {
            session: Arc::new(Session::new(client.clone(), config.options.ttl)),
            client,
            label: config.label(),
            prefix: config.prefix.clone(),
            recheck: config.options.recheck,
            slots: Arc::new(Slots::default()),
            keys_overflow: AtomicUsize::new(0),
        };
        Ok(backend)
    }
}

impl EtcdBackend {
    /// The key range of lock `name` (see [`EtcdConfig::lock_prefix`]).
    pub fn lock_prefix(&self, name: &LockName) -> String {
        lock_prefix(&self.prefix, name)
    }

    /// The id of the client's current lease, if it has a live one.
    pub fn lease_id(&self) -> Option<i64> {
        self.session.live_lease().map(|lease| lease.id)
    }

    /// Puts our key in the queue of `prefix` (or finds it there); returns its create
    /// revision and the create revision of the current owner. One round trip.
    async fn enqueue(&self, prefix: &str, key: &str, lease: i64) -> Result<(i64, Option<i64>)> {
        const WHAT: &str = "acquire";
        // A key of ours from an earlier, abandoned attempt is deleted and the put
        // retried, so every acquisition gets a fresh create revision (fencing token).
        for _ in 0..3 {
            let owner = || TxnOp::get(prefix, Some(first_created()));
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))),
                    owner(),
                ])
                .or_else([TxnOp::get(key, None), owner()]);
            let response = self.client.txn(WHAT, txn).await?;
            let ops = response.op_responses();
            let owner = ops.get(1).and_then(first_kv).map(KeyValue::create_revision);
            if response.succeeded() {
                let revision = header_revision(&response, WHAT)?;
                return Ok((revision, owner));
            }
            let Some(stale) = ops
                .first()
                .and_then(first_kv)
                .map(KeyValue::create_revision)
            else {
                continue;
            };
            tracing::debug!(key, stale, "removing a leftover key of this client");
            self.delete_if_ours(key, stale).await?;
        }
        Err(unexpected(WHAT, "our queue key kept reappearing"))
    }

    /// Deletes `key` if its create revision is `revision`; whether it did.
    async fn delete_if_ours(&self, key: &str, revision: i64) -> Result<bool> {
        delete_if_ours(&self.client, key, Some(revision)).await
    }

    /// Waits until our key (created at `revision`) has the lowest create revision.
    ///
    /// Watches the delete of the key just before ours, then re-checks with one read-only
    /// transaction (our key still there + the next predecessor). Re-checks at least every
    /// `recheck` even without an event, and keeps the lease alive meanwhile. Retryable
    /// failures (an election, a member going away) are retried as long as the lease can
    /// be kept alive.
    ///
    /// No delete is missed: the watch carries every delete above its start revision
    /// (see [`EtcdClient::watch_delete`]), and the predecessor was read alive at
    /// `read_at`. When the watch starts after `read_at` (other writes in between), one
    /// linearizable read after the watch exists confirms the predecessor is still there
    /// (same create revision), so its delete, if any, comes after the watch's start.
    async fn wait_turn(&self, prefix: &str, key: &str, revision: i64, lease: Lease) -> Result<()> {
        loop {
            let turn = match self.check_turn(prefix, key, revision).await {
                Ok(turn) => turn,
                Err(err) if err.is_retryable() => {
                    // A leader election or a member going away: ride it out while the
                    // lease can be kept alive (keep_waiting gives up at its deadline).
                    tracing::debug!(error = %err, "re-check failed; retrying");
                    let retry_at = Instant::now() + self.recheck.min(RETRY_PAUSE);
                    let refresh_at = self.keep_waiting(lease.id).await?;
                    sleep_until(retry_at.min(refresh_at)).await;
                    continue;
                }
                Err(err) => return Err(err),
            };
            let (predecessor, created, read_at) = match turn {
                Turn::Owner => return Ok(()),
                Turn::Vanished => {
                    return Err(Error::Lost {
                        name: prefix.trim_end_matches('/').to_owned(),
                        reason: LostReason::Vanished,
                    })
                }
                Turn::After {
                    predecessor,
                    created,
                    read_at,
                } => (predecessor, created, read_at),
            };
            let mut recheck_at = Instant::now() + self.recheck;
            let mut watch = match self.client.watch_delete(&predecessor).await {
                Ok(DeleteWatch::Ended) => continue,
                Ok(DeleteWatch::Watching { stream, start }) if start <= read_at => Some(stream),
                Ok(DeleteWatch::Watching { stream, start }) => {
                    // Writes landed between our read and the watch: a delete in
                    // (read_at, start] would not be on the stream.
                    match self.still_there(&predecessor, created).await {
                        Ok(true) => Some(stream),
                        Ok(false) => continue,
                        Err(err) => {
                            tracing::debug!(error = %err, start, read_at, "confirming the predecessor failed; re-checking soon");
                            recheck_at = Instant::now() + self.recheck.min(RETRY_PAUSE);
                            Some(stream)
                        }
                    }
                }
                Err(err) => {
                    tracing::debug!(error = %err, "watch failed; re-checking on the timer");
                    None
                }
            };
            loop {
                let refresh_at = self.keep_waiting(lease.id).await?;
                tokio::select! {
                    () = deleted(&mut watch) => break,
                    () = sleep_until(recheck_at) => break,
                    () = sleep_until(refresh_at) => {}
                }
            }
        }
    }

    /// One linearizable read: does `key` still exist with create revision `created`?
    async fn still_there(&self, key: &[u8], created: i64) -> Result<bool> {
        const WHAT: &str = "confirming the predecessor";
        let txn = Txn::new().and_then([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let response = self.client.txn(WHAT, txn).await?;
        let found = response
            .op_responses()
            .first()
            .and_then(first_kv)
            .map(KeyValue::create_revision);
        Ok(found == Some(created))
    }

    /// Keeps the lease of a waiter alive when due; returns when to look again.
    ///
    /// # Errors
    /// [`Error::Lost`] (session expired) when the lease is gone or was replaced: the
    /// waiter's key went with it.
    async fn keep_waiting(&self, id: i64) -> Result<Instant> {
        let lost = || Error::Lost {
            name: "(waiting)".to_owned(),
            reason: LostReason::SessionExpired,
        };
        let Some(lease) = self.session.lease_by_id(id) else {
            return Err(lost());
        };
        if Instant::now() < lease.refresh_due() {
            return Ok(lease.refresh_due());
        }
        match self.session.keep_alive(id, lease.ttl / 3).await {
            Ok(KeepAlive::Alive(lease)) => Ok(lease.refresh_due()),
            Ok(KeepAlive::Gone) => Err(lost()),
            Err(err) => {
                // Retry soon while the lease may still live; give up at its deadline.
                tracing::debug!(error = %err, "keep-alive of a waiter failed");
                let retry = Instant::now() + (lease.ttl / 10).max(Duration::from_millis(50));
                if retry < lease.valid_until() {
                    Ok(retry)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// One read-only transaction: is our key still there, and which key is just before it?
    async fn check_turn(&self, prefix: &str, key: &str, revision: i64) -> Result<Turn> {
        const WHAT: &str = "re-checking the queue";
        let before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        let txn = Txn::new().and_then([TxnOp::get(key, None), TxnOp::get(prefix, Some(before))]);
        let response = self.client.txn(WHAT, txn).await?;
        let read_at = header_revision(&response, WHAT)?;
        let ops = response.op_responses();
        let mine = ops
            .first()
            .and_then(first_kv)
            .map(KeyValue::create_revision);
        if mine != Some(revision) {
            return Ok(Turn::Vanished);
        }
        match ops.get(1).and_then(first_kv) {
            None => Ok(Turn::Owner),
            Some(kv) => Ok(Turn::After {
                predecessor: kv.key().to_vec(),
                created: kv.create_revision(),
                read_at,
            }),
        }
    }

    /// Which `holds` (all on lease `lease`) are no longer ours; `None` when the lease
    /// itself is gone on the server.
    ///
    /// ONE `LeaseTimeToLive` request lists every key attached to the lease: a hold whose
    /// key is in the list is ours (its key is `<range><lease hex>[_<n>]`, put only by
    /// this client under this lease, and a key [`Slot`] is used by one acquisition at a
    /// time, so a key on our lease is the current hold's). A key missing from the list is
    /// confirmed by a linearizable read before its hold is declared lost, since the
    /// list is the leader's view of the lease and may lag a write just served by another
    /// member; in the steady state that costs nothing. When the list is too large for
    /// one answer, every hold is checked by reads ([`EtcdBackend::compare_holds`]).
    async fn check_holds(
        &self,
        lease: i64,
        holds: &[&EtcdHold],
    ) -> Result<Option<Vec<Option<LostReason>>>> {
        let overflowed_at = self.keys_overflow.load(Ordering::Relaxed);
        if overflowed_at != 0 && holds.len().saturating_mul(2) > overflowed_at {
            // The list overflowed with about this many holds: do not fetch it again.
            return self.compare_holds(lease, holds).await.map(Some);
        }
        let attached = match self.client.lease_keys(lease).await? {
            LeaseKeys::Gone => return Ok(None),
            LeaseKeys::TooLarge => {
                tracing::debug!(
                    holds = holds.len(),
                    "the keys of the session lease do not fit one answer; checking holds by reads"
                );
                self.keys_overflow
                    .store(holds.len().max(1), Ordering::Relaxed);
                return self.compare_holds(lease, holds).await.map(Some);
            }
            LeaseKeys::Attached(answer) => answer,
        };
        self.keys_overflow.store(0, Ordering::Relaxed);
        let listed: HashSet<&[u8]> = attached.keys().iter().map(Vec::as_slice).collect();
        let missing: Vec<usize> = holds
            .iter()
            .enumerate()
            .filter(|(_, hold)| !listed.contains(hold.key.as_bytes()))
            .map(|(i, _)| i)
            .collect();
        let mut verdicts = vec![None; holds.len()];
        if missing.is_empty() {
            return Ok(Some(verdicts));
        }
        let suspects: Vec<&EtcdHold> = missing.iter().map(|&i| holds[i]).collect();
        let confirmed = self.compare_holds(lease, &suspects).await?;
        for (i, verdict) in missing.into_iter().zip(confirmed) {
            verdicts[i] = verdict;
        }
        Ok(Some(verdicts))
    }

    /// Checks by linearizable reads that every hold's key still exists with its create
    /// revision on lease `lease`: one transaction per [`MAX_TXN_OPS`] compares (two per
    /// hold), all in flight at once.
    async fn compare_holds(
        &self,
        lease: i64,
        holds: &[&EtcdHold],
    ) -> Result<Vec<Option<LostReason>>> {
        let checks = holds.chunks(MAX_TXN_OPS / 2).map(|chunk| async move {
            const WHAT: &str = "checking held keys";
            let txn = Txn::new()
                .when(
                    chunk
                        .iter()
                        .flat_map(|h| {
                            [
                                Compare::create_revision(&*h.key, CompareOp::Equal, h.revision),
                                Compare::lease(&*h.key, CompareOp::Equal, lease),
                            ]
                        })
                        .collect::<Vec<_>>(),
                )
                .or_else(
                    chunk
                        .iter()
                        .map(|h| TxnOp::get(&*h.key, Some(GetOptions::new().with_keys_only())))
                        .collect::<Vec<_>>(),
                );
            let response = self.client.txn(WHAT, txn).await?;
            if response.succeeded() {
                return Ok(vec![None; chunk.len()]);
            }
            let ops = response.op_responses();
            if ops.len() != chunk.len() {
                return Err(unexpected(WHAT, "wrong number of answers"));
            }
            Ok(chunk
                .iter()
                .zip(&ops)
                .map(|(hold, op)| match first_kv(op) {
                    None => Some(LostReason::Vanished),
                    // Recreated, or rewritten off our lease: not this hold's key any more.
                    Some(kv) if kv.create_revision() != hold.revision || kv.lease() != lease => {
                        Some(LostReason::Taken)
                    }
                    Some(_) => None,
                })
                .collect())
        });
        let mut out = Vec::with_capacity(holds.len());
        for chunk in join_all(checks).await {
            out.extend(chunk?);
        }
        Ok(out)
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        // The client is gone: free its keys now rather than at the TTL.
        self.session.close();
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoint", &self.label)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// Where a waiter stands in its queue.
enum Turn {
    /// No key before ours: we hold the lock.
    Owner,
    /// Our key is gone (deleted, or its lease expired).
    Vanished,
    /// `predecessor` (created at revision `created`) is just before us, as read at
    /// revision `read_at`.
    After {
        predecessor: Vec<u8>,
        created: i64,
        read_at: i64,
    },
}

/// Range options for "the key created first under the prefix" (the owner).
fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

fn first_kv(op: &TxnOpResponse) -> Option<&KeyValue> {
    match op {
        TxnOpResponse::Get(get) => get.kvs().first(),
        _ => None,
    }
}

fn header_revision(response: &TxnResponse, what: &str) -> Result<i64> {
    response
        .header()
        .map(|header| header.revision())
        .ok_or_else(|| unexpected(what, "answer without a header"))
}

/// Returns once the watched key is deleted, or the watch ends or breaks (a re-check
/// follows); never returns without a watch (the re-check timer rules then).
async fn deleted(watch: &mut Option<Box<WatchStream>>) {
    let Some(stream) = watch.as_mut() else {
        return std::future::pending().await;
    };
    while let Ok(Some(answer)) = stream.message().await {
        if ends_wait(&answer) {
            break;
        }
    }
    *watch = None;
}

/// Deletes `key`, only if its create revision is `revision` when one is given.
async fn delete_if_ours(client: &EtcdClient, key: &str, revision: Option<i64>) -> Result<bool> {
    let compares = revision
        .map(|revision| vec![Compare::create_revision(key, CompareOp::Equal, revision)])
        .unwrap_or_default();
    let txn = Txn::new()
        .when(compares)
        .and_then([TxnOp::delete(key, None)]);
    let response = client.txn("release", txn).await?;
    if !response.succeeded() {
        return Ok(false);
    }
    Ok(response.op_responses().iter().any(|op| match op {
        TxnOpResponse::Delete(delete) => delete.deleted() > 0,
        _ => false,
    }))
}

/// A hold on etcd: our key, its create revision and the lease it lives on.
pub struct EtcdHold {
    key: String,
    revision: i64,
    lease: i64,
    /// Keeps the key from other acquisitions of the same name in this client.
    slot: Mutex<Option<Slot>>,
}

impl EtcdHold {
    /// The key (`<prefix>/<name>/<lease hex>`, or `…<lease hex>_<n>` for an acquisition
    /// made while another of the same name was under way in this client).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's create revision (the fencing token).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    fn free_slot(&self) {
        drop(
            self.slot
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take(),
        );
    }
}

impl fmt::Debug for EtcdHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdHold")
            .field("key", &self.key)
            .field("revision", &self.revision)
            .field("lease", &format_args!("{:x}", self.lease))
            .finish()
    }
}

/// The key of an acquire in progress: if the acquire future is dropped, the key is
/// deleted in a background task, and only then is its slot free for another acquire of
/// the same name in this client.
struct Pending {
    client: EtcdClient,
    key: String,
    revision: Option<i64>,
    slot: Option<Slot>,
}

impl Pending {
    /// The acquire is complete (granted or cleaned up): nothing to undo.
    fn disarm(mut self) -> Option<Slot> {
        self.slot.take()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        let key = std::mem::take(&mut self.key);
        let revision = self.revision;
        runtime.spawn(async move {
            if let Err(err) = delete_if_ours(&client, &key, revision).await {
                tracing::warn!(key, error = %err, "removing the key of a cancelled acquire failed; the lease TTL ends it");
            }
            drop(slot);
        });
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    type Hold = EtcdHold;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .fair(true)
            .per_lock_ttl(false)
            .min_ttl(Duration::from_secs(1))
            .push_wakeup(true)
            .durable(true)
            .fencing(FencingSource::CreateRevision)
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<EtcdHold>>> {
        let prefix = self.lock_prefix(request.name);
        // A key of its own for each acquisition under way: it queues on the server at
        // once, in FIFO order with every other client's.
        let slot = self.slots.take(request.name);
        let lease = self.session.lease().await?;
        let key = slot.key(&prefix, lease.id);
        let mut pending = Pending {
            client: self.client.clone(),
            key: key.clone(),
            revision: None,
            slot: Some(slot),
        };
        let (revision, owner) = self.enqueue(&prefix, &key, lease.id).await?;
        pending.revision = Some(revision);
        if owner != Some(revision) {
            if !request.wait {
                // Like TryLock: leave the queue at once. On failure the pending guard
                // retries the delete in the background.
                if self.delete_if_ours(&key, revision).await.is_ok() {
                    drop(pending.disarm());
                }
                return Ok(None);
            }
            self.wait_turn(&prefix, &key, revision, lease)
                .await
                .map_err(|err| match err {
                    Error::Lost { reason, .. } => Error::Lost {
                        name: request.name.to_string(),
                        reason,
                    },
                    other => other,
                })?;
        }
        // The hold lives as long as the lease: measure it from the last keep-alive,
        // refreshed now if it is older than TTL/3.
        let lease = match self.session.lease_by_id(lease.id) {
            Some(now) if Instant::now() < now.refresh_due() => now,
            _ => match self.session.keep_alive(lease.id, lease.ttl / 3).await? {
                KeepAlive::Alive(now) => now,
                KeepAlive::Gone => {
                    return Err(Error::Lost {
                        name: request.name.to_string(),
                        reason: LostReason::SessionExpired,
                    })
                }
            },
        };
        let fencing = u64::try_from(revision)
            .map_err(|_| unexpected("acquire", format!("create revision {revision}")))?;
        let slot = pending.disarm();
        Ok(Some(Acquired {
            hold: EtcdHold {
                key,
                revision,
                lease: lease.id,
                slot: Mutex::new(slot),
            },
            fencing_token: FencingToken(fencing),
            requested_at: lease.fresh_at,
            lease: lease.ttl,
            session: lease.epoch,
        }))
    }

    async fn renew(&self, items: &[RenewItem<'_, EtcdHold>]) -> Result<Vec<RenewOutcome>> {
        let started = Instant::now();
        let current = self.session.live_lease();
        let mut outcomes = vec![RenewOutcome::Lost(LostReason::SessionExpired); items.len()];
        let live: Vec<(usize, &EtcdHold)> = items
            .iter()
            .enumerate()
            .filter(|(_, item)| current.is_some_and(|lease| lease.id == item.hold.lease))
            .map(|(i, item)| (i, item.hold))
            .collect();
        for item in items {
            if current.is_none_or(|lease| lease.id != item.hold.lease) {
                item.hold.free_slot();
            }
        }
        let Some(current) = current.filter(|_| !live.is_empty()) else {
            return Ok(outcomes);
        };
        // Two requests whatever the number of holds: one keep-alive for the client's
        // lease (shared with concurrent users; a lease time-to-live query does not renew
        // it), and one list of the keys still attached to the lease, since a keep-alive
        // success alone proves nothing about keys deleted behind our back.
        let holds: Vec<&EtcdHold> = live.iter().map(|(_, hold)| *hold).collect();
        let (kept, checked) = futures::join!(
            self.session.keep_alive(current.id, current.ttl / 6),
            self.check_holds(current.id, &holds)
        );
        let (lease, verdicts) = match (kept, checked) {
            (_, Ok(None)) => {
                // The server does not know the lease (expired, or revoked behind our
                // back): every hold on it is lost, whatever the keep-alive got.
                self.session.expire(current.id);
                for (_, hold) in &live {
                    hold.free_slot();
                }
                return Ok(outcomes);
            }
            (Ok(KeepAlive::Gone), _) => {
                for (_, hold) in &live {
                    hold.free_slot();
                }
                return Ok(outcomes);
            }
            (Err(err), _) | (_, Err(err)) => return Err(err),
            (Ok(KeepAlive::Alive(lease)), Ok(Some(verdicts))) => (lease, verdicts),
        };
        let remaining = lease
            .valid_until()
            .saturating_duration_since(started)
            .min(lease.ttl);
        for ((i, hold), lost) in live.iter().zip(verdicts) {
            outcomes[*i] = match lost {
                None => RenewOutcome::Renewed { lease: remaining },
                Some(reason) => {
                    hold.free_slot();
                    RenewOutcome::Lost(reason)
                }
            };
        }
        Ok(outcomes)
    }

    async fn release(&self, hold: &EtcdHold) -> Result<BackendRelease> {
        let deleted = self.delete_if_ours(&hold.key, hold.revision).await;
        hold.free_slot();
        Ok(if deleted? {
            BackendRelease::Released
        } else {
            BackendRelease::NotOwner(LostReason::Vanished)
        })
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.session.subscribe())
    }
}

/// The keys of one name that this client's acquisitions use. Each acquisition under way
/// takes the lowest free slot: slot 0 is the plain `<lease hex>` key of the Go client's
/// `Mutex`, slot n the key `<lease hex>_<n>`. A slot is freed once its hold ended or its
/// cancelled attempt's key was cleaned up, so two live acquisitions never share a key,
/// and a key found on the server for a free slot is a leftover of this client.
#[derive(Default)]
struct Slots {
    names: Mutex<HashMap<LockName, BTreeSet<u32>>>,
}

impl Slots {
    fn names(&self) -> MutexGuard<'_, HashMap<LockName, BTreeSet<u32>>> {
        self.names
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the lowest free slot of `name`.
    fn take(self: &Arc<Self>, name: &LockName) -> Slot {
        let mut names = self.names();
        let used = names.entry(name.clone()).or_default();
        let mut n = 0;
        while used.contains(&n) {
            n += 1;
        }
        used.insert(n);
        Slot {
            slots: Arc::downgrade(self),
            name: name.clone(),
            n,
        }
    }
}

/// One acquisition's key slot on one name; freed on drop.
struct Slot {
    slots: Weak<Slots>,
    name: LockName,
    n: u32,
}

impl Slot {
    /// The slot's key in the range `prefix` under `lease`.
    fn key(&self, prefix: &str, lease: i64) -> String {
        match self.n {
            0 => format!("{prefix}{lease:x}"),
            n => format!("{prefix}{lease:x}_{n}"),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(slots) = self.slots.upgrade() else {
            return;
        };
        let mut names = slots.names();
        if let Some(used) = names.get_mut(&self.name) {
            used.remove(&self.n);
            if used.is_empty() {
                names.remove(&self.name);
            }
        }
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("name", &self.name)
            .field("n", &self.n)
            .finish()
    }
}
