//! Waiting in a lock's queue on etcd: putting our key by one transaction, waiting on the
//! delete of the key just before ours (with a periodic re-check), keeping the lease alive
//! meanwhile; and the key slots that let several acquisitions of one name in one client
//! queue at once (see [`crate::layout`]).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchStream,
};
use lock_core::raw::lock_unpoisoned;
use lock_core::{Error, LockName, LostReason, Result};
use tokio::time::{sleep_until, Instant};

use crate::connection::{ends_wait, first_kv, header_revision, DeleteWatch, EtcdClient};
use crate::error::unexpected;
use crate::layout::{first_created, queue_key};
use crate::session::{KeepAlive, Lease, Session};

/// Pause before a waiter retries a failed re-check.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The queue side of a client: its connection, its session and how often a waiter
/// re-checks without an event.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) client: EtcdClient,
    pub(crate) session: Arc<Session>,
    pub(crate) recheck: Duration,
}

impl Queue {
    /// Puts our key in the queue of `prefix` (or finds it there), with `value` (a mutex's
    /// owner token, a candidate's proposal: see [`crate::layout`]); returns its create
    /// revision and the create revision of the current owner. One round trip.
    pub(crate) async fn enqueue(
        &self,
        prefix: &str,
        key: &str,
        lease: i64,
        value: &[u8],
    ) -> Result<(i64, Option<i64>)> {
        const WHAT: &str = "acquire";
        // A key of ours from an earlier, abandoned attempt is deleted and the put
        // retried, so every acquisition gets a fresh create revision (fencing token).
        for _ in 0..3 {
            let owner = || TxnOp::get(prefix, Some(first_created()));
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
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
            self.client.delete_if_ours(key, Some(stale)).await?;
        }
        Err(unexpected(WHAT, "our queue key kept reappearing"))
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
    pub(crate) async fn wait_turn(
        &self,
        prefix: &str,
        key: &str,
        revision: i64,
        lease: Lease,
    ) -> Result<()> {
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

/// The keys of one name that this client's acquisitions use. Each acquisition under way
/// takes the lowest free slot: slot 0 is the plain `<lease hex>` key of the Go client's
/// `Mutex`, slot n the key `<lease hex>_<n>`. A slot is freed once its hold ended or its
/// cancelled attempt's key was cleaned up, so two live acquisitions never share a key,
/// and a key found on the server for a free slot is a leftover of this client.
#[derive(Default)]
pub(crate) struct Slots {
    names: Mutex<HashMap<LockName, BTreeSet<u32>>>,
}

impl Slots {
    fn names(&self) -> MutexGuard<'_, HashMap<LockName, BTreeSet<u32>>> {
        lock_unpoisoned(&self.names)
    }

    /// Takes the lowest free slot of `name`.
    pub(crate) fn take(self: &Arc<Self>, name: &LockName) -> Slot {
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
pub(crate) struct Slot {
    slots: Weak<Slots>,
    name: LockName,
    n: u32,
}

impl Slot {
    /// The slot's key in the range `prefix` under `lease`.
    pub(crate) fn key(&self, prefix: &str, lease: i64) -> String {
        queue_key(prefix, lease, self.n)
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
