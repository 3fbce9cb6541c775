//! Waiting in a lock's queue on etcd: putting our key by one transaction, deciding by
//! [`HoldKind::granted_behind`] over the entries ahead whether it is granted, waiting on
//! what must go before it (with a periodic re-check), keeping the lease alive meanwhile;
//! and the key slots that let several acquisitions of one name in one client queue at
//! once (see [`crate::layout`]).
//!
//! What a waiter watches depends on its kind: an exclusive entry (a mutex, a candidate,
//! a writer) the delete of the entry just before it; a reader the last writer before it
//! (its delete, or its rewrite when it downgrades to read); a permit the deletes among
//! the entries before it, on one watch of the name's range that is in place before every
//! re-check, counted until enough of them went for it to be granted.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp, WatchStream,
};
use lock_core::raw::{lock_unpoisoned, HoldKind};
use lock_core::{Error, LockName, LostReason, Result};
use tokio::time::{sleep_until, Instant};

use crate::connection::{
    ends_wait, first_kv, header_revision, watch_ended, DeleteWatch, EtcdClient,
};
use crate::error::unexpected;
use crate::layout::{entries_ahead, queue_head, queue_key, Entry};
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

/// One acquisition's entry in the queue of a name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) name: &'a LockName,
    /// The name's key range ([`crate::layout::lock_prefix`]).
    pub(crate) prefix: &'a str,
    /// Our key.
    pub(crate) key: &'a str,
    /// What our entry asks for.
    pub(crate) kind: &'a HoldKind,
}

/// Whether an entry of `place.kind` created at `revision` is granted behind `ahead`, the
/// entries created before it in create order (or the first of them: an entry with
/// someone ahead is granted only where the rest could not change that, see
/// [`queue_head`]).
///
/// # Errors
/// [`Error::Conflict`] when an entry ahead is of a kind ours cannot queue beside
/// ([`HoldKind::check_beside`]: a semaphore of other permits, a name used as another
/// primitive).
pub(crate) fn admitted<'a>(
    place: &Place<'_>,
    ahead: impl IntoIterator<Item = &'a KeyValue>,
) -> Result<bool> {
    let kinds: Vec<HoldKind> = ahead
        .into_iter()
        .map(|kv| Entry::of_value(kv.value()).kind)
        .collect();
    for other in &kinds {
        place.kind.check_beside(other, place.name)?;
    }
    Ok(place.kind.granted_behind(&kinds))
}

impl Queue {
    /// Puts our key in the queue of `place` (or finds it there), with `value` (see
    /// [`crate::layout`]); returns its create revision and the entries ahead of it in the
    /// queue's head read in the same transaction ([`queue_head`]: enough for
    /// [`admitted`] to tell whether it is granted at once). One round trip.
    pub(crate) async fn enqueue(
        &self,
        place: &Place<'_>,
        lease: i64,
        value: &[u8],
    ) -> Result<(i64, Vec<KeyValue>)> {
        const WHAT: &str = "acquire";
        let (prefix, key) = (place.prefix, place.key);
        // A key of ours from an earlier, abandoned attempt is deleted and the put
        // retried, so every acquisition gets a fresh create revision (fencing token).
        for _ in 0..3 {
            let head = || TxnOp::get(prefix, Some(queue_head(place.kind)));
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
                    head(),
                ])
                .or_else([TxnOp::get(key, None)]);
            let response = self.client.txn(WHAT, txn).await?;
            let ops = response.op_responses();
            if response.succeeded() {
                let revision = header_revision(&response, WHAT)?;
                let ahead = match ops.get(1) {
                    Some(etcd_client::TxnOpResponse::Get(head)) => head
                        .kvs()
                        .iter()
                        .filter(|kv| kv.create_revision() < revision)
                        .cloned()
                        .collect(),
                    _ => return Err(unexpected(WHAT, "an answer without the queue's head")),
                };
                return Ok((revision, ahead));
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

    /// Waits until our key (created at `revision`) is granted: [`admitted`] behind the
    /// entries created before it.
    ///
    /// Watches what must go first (see the module docs), then re-checks with one
    /// read-only transaction (our key still there + the entries ahead that matter).
    /// Re-checks at least every `recheck` even without an event, and keeps the lease
    /// alive meanwhile. Retryable failures (an election, a member going away) are retried
    /// as long as the lease can be kept alive.
    ///
    /// No event is missed: a key watch carries every delete (and put) above its start
    /// revision (see [`EtcdClient::watch_delete`]), and the watched entry was read alive
    /// at `read_at`. When the watch starts after `read_at` (other writes in between), one
    /// linearizable read after the watch exists confirms the entry is still there
    /// unchanged (same create and mod revisions), so its change, if any, comes after the
    /// watch's start. A permit's range watch is in place before each re-check's read, and
    /// counts only deletes after that read.
    ///
    /// # Errors
    /// [`Error::Lost`] when our key or lease is gone; [`Error::Conflict`] as
    /// [`admitted`]; non-retryable request errors.
    pub(crate) async fn wait_turn(
        &self,
        place: &Place<'_>,
        revision: i64,
        lease: Lease,
    ) -> Result<()> {
        // A permit's watch of the name's range, kept across re-checks.
        let mut range_watch = None;
        loop {
            if matches!(place.kind, HoldKind::Permit { .. }) && range_watch.is_none() {
                range_watch = match self.client.watch_range(place.prefix).await {
                    Ok(stream) => Some(stream),
                    Err(err) => {
                        tracing::debug!(error = %err, "watching the range failed; re-checking on the timer");
                        None
                    }
                };
            }
            let turn = match self.check_turn(place, revision).await {
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
            let (blocker, read_at) = match turn {
                Turn::Owner => return Ok(()),
                Turn::Vanished => {
                    return Err(Error::Lost {
                        name: place.name.to_string(),
                        reason: LostReason::Vanished,
                    })
                }
                Turn::After { blocker, read_at } => (blocker, read_at),
            };
            let mut recheck_at = Instant::now() + self.recheck;
            let mut waiting = match blocker {
                Blocker::Entry { kv, puts } => match self.watch_entry(&kv, puts, read_at).await {
                    EntryWatch::Ended => continue,
                    EntryWatch::Watching { stream, confirmed } => {
                        if !confirmed {
                            recheck_at = Instant::now() + self.recheck.min(RETRY_PAUSE);
                        }
                        Waiting::Entry { stream, puts }
                    }
                },
                Blocker::Deletes { ahead, needed } => Waiting::Deletes {
                    ahead,
                    needed,
                    after: read_at,
                },
            };
            loop {
                let refresh_at = self.keep_waiting(lease.id).await?;
                tokio::select! {
                    () = waiting.over(&mut range_watch) => break,
                    () = sleep_until(recheck_at) => break,
                    () = sleep_until(refresh_at) => {}
                }
            }
        }
    }

    /// Watches the entry `kv` (read at `read_at`) for its delete, or any write with
    /// `puts`; confirms it unchanged when the watch starts after `read_at`.
    async fn watch_entry(&self, kv: &KeyValue, puts: bool, read_at: i64) -> EntryWatch {
        match self.client.watch_delete(kv.key(), puts).await {
            Ok(DeleteWatch::Ended) => EntryWatch::Ended,
            Ok(DeleteWatch::Watching { stream, start }) if start <= read_at => {
                EntryWatch::Watching {
                    stream: Some(stream),
                    confirmed: true,
                }
            }
            Ok(DeleteWatch::Watching { stream, start }) => {
                // Writes landed between our read and the watch: a change in
                // (read_at, start] would not be on the stream.
                match self.unchanged(kv).await {
                    Ok(true) => EntryWatch::Watching {
                        stream: Some(stream),
                        confirmed: true,
                    },
                    Ok(false) => EntryWatch::Ended,
                    Err(err) => {
                        tracing::debug!(error = %err, start, read_at, "confirming the entry ahead failed; re-checking soon");
                        EntryWatch::Watching {
                            stream: Some(stream),
                            confirmed: false,
                        }
                    }
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "watch failed; re-checking on the timer");
                EntryWatch::Watching {
                    stream: None,
                    confirmed: true,
                }
            }
        }
    }

    /// One linearizable read: does the key of `kv` still exist, with its create and mod
    /// revisions?
    async fn unchanged(&self, kv: &KeyValue) -> Result<bool> {
        const WHAT: &str = "confirming the entry ahead";
        let txn = Txn::new().and_then([TxnOp::get(
            kv.key(),
            Some(GetOptions::new().with_keys_only()),
        )]);
        let response = self.client.txn(WHAT, txn).await?;
        let found = response
            .op_responses()
            .first()
            .and_then(first_kv)
            .map(|now| (now.create_revision(), now.mod_revision()));
        Ok(found == Some((kv.create_revision(), kv.mod_revision())))
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

    /// One read-only transaction: is our key still there, and what must go before it?
    async fn check_turn(&self, place: &Place<'_>, revision: i64) -> Result<Turn> {
        const WHAT: &str = "re-checking the queue";
        let txn = Txn::new().and_then([
            TxnOp::get(place.key, None),
            TxnOp::get(place.prefix, Some(entries_ahead(place.kind, revision))),
        ]);
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
        let mut ahead: Vec<&KeyValue> = match ops.get(1) {
            Some(etcd_client::TxnOpResponse::Get(range)) => range.kvs().iter().collect(),
            _ => return Err(unexpected(WHAT, "an answer without the entries ahead")),
        };
        // In create order, whichever way the range was read.
        ahead.sort_by_key(|kv| kv.create_revision());
        if admitted(place, ahead.iter().copied())? {
            return Ok(Turn::Owner);
        }
        let blocker = match place.kind {
            HoldKind::Permit { permits } => Blocker::Deletes {
                needed: ahead
                    .len()
                    .saturating_sub(usize::try_from(*permits).unwrap_or(usize::MAX))
                    + 1,
                ahead: ahead.iter().map(|kv| kv.key().to_vec()).collect(),
            },
            // A reader waits for the last writer ahead to go or to become a reader.
            HoldKind::Read => {
                let writer = ahead
                    .iter()
                    .rev()
                    .find(|kv| Entry::of_value(kv.value()).kind == HoldKind::Write);
                match writer.or(ahead.last()) {
                    Some(kv) => Blocker::Entry {
                        kv: (*kv).clone(),
                        puts: true,
                    },
                    None => return Err(unexpected(WHAT, "not granted with nobody ahead")),
                }
            }
            _ => match ahead.last() {
                Some(kv) => Blocker::Entry {
                    kv: (*kv).clone(),
                    puts: false,
                },
                None => return Err(unexpected(WHAT, "not granted with nobody ahead")),
            },
        };
        Ok(Turn::After { blocker, read_at })
    }
}

/// Where a waiter stands in its queue.
enum Turn {
    /// Granted behind the entries ahead: we hold.
    Owner,
    /// Our key is gone (deleted, or its lease expired).
    Vanished,
    /// `blocker` must go first, as read at revision `read_at`.
    After { blocker: Blocker, read_at: i64 },
}

/// What a waiter waits for.
enum Blocker {
    /// The delete of one entry ahead (or, with `puts`, any write of it).
    Entry { kv: KeyValue, puts: bool },
    /// `needed` deletes among the entries `ahead` (a permit's).
    Deletes {
        ahead: HashSet<Vec<u8>>,
        needed: usize,
    },
}

/// A watch of one entry ahead.
enum EntryWatch {
    /// The entry changed while the watch was set up: re-check at once.
    Ended,
    /// Watching (without a stream: the watch failed, the re-check timer rules); not
    /// `confirmed`: the entry could not be confirmed unchanged, re-check soon.
    Watching {
        stream: Option<Box<WatchStream>>,
        confirmed: bool,
    },
}

/// A waiter's wait, until its next re-check.
enum Waiting {
    /// On one entry's watch.
    Entry {
        stream: Option<Box<WatchStream>>,
        puts: bool,
    },
    /// On deletes among the entries ahead, after revision `after`, on the range watch.
    Deletes {
        ahead: HashSet<Vec<u8>>,
        needed: usize,
        after: i64,
    },
}

impl Waiting {
    /// Returns once a re-check is due: what was waited for happened, or the watch ended
    /// or broke; never returns without a watch (the re-check timer rules then). What it
    /// has counted stays counted when it is dropped before it returns.
    async fn over(&mut self, range_watch: &mut Option<Box<WatchStream>>) {
        match self {
            Waiting::Entry { stream, puts } => changed(stream, *puts).await,
            Waiting::Deletes {
                ahead,
                needed,
                after,
            } => deletes_among(range_watch, ahead, needed, *after).await,
        }
    }
}

/// Returns once the watched key is deleted (or written, with `puts`), or the watch ends
/// or breaks (a re-check follows); never returns without a watch.
async fn changed(watch: &mut Option<Box<WatchStream>>, puts: bool) {
    let Some(stream) = watch.as_mut() else {
        return std::future::pending().await;
    };
    while let Ok(Some(answer)) = stream.message().await {
        if ends_wait(&answer, puts) {
            break;
        }
    }
    *watch = None;
}

/// Returns once `needed` of the keys `ahead` were deleted after revision `after`, or the
/// range watch ends or breaks (it is dropped: the next round makes another); never
/// returns without a watch.
async fn deletes_among(
    watch: &mut Option<Box<WatchStream>>,
    ahead: &mut HashSet<Vec<u8>>,
    needed: &mut usize,
    after: i64,
) {
    let Some(stream) = watch.as_mut() else {
        return std::future::pending().await;
    };
    while let Ok(Some(answer)) = stream.message().await {
        if watch_ended(&answer) {
            break;
        }
        for event in answer.events() {
            let Some(kv) = event.kv() else { continue };
            if event.event_type() == EventType::Delete
                && kv.mod_revision() > after
                && ahead.remove(kv.key())
            {
                *needed = needed.saturating_sub(1);
                if *needed == 0 {
                    return;
                }
            }
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
