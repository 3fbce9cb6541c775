//! Waiting in a lock's queue on etcd: putting our key by one transaction, deciding by
//! [`HoldKind::granted_behind`] over the entries ahead whether it is granted, waiting on
//! what must go before it (with a periodic re-check), keeping the lease alive meanwhile
//! (see [`crate::layout`]).
//!
//! What a waiter watches depends on its kind: an exclusive entry (a mutex, a candidate,
//! a writer) the delete of the entry just before it; a reader the last writer before it
//! (its delete, or its rewrite when it downgrades to read); a permit the deletes among
//! the entries before it, on one watch of the name's range that is in place before every
//! re-check, counted until enough of them went for it to be granted.
//!
//! An exclusive waiter also watches the entry before its predecessor and its own key, on
//! the same stream. When the entry before the predecessor goes it re-checks at once,
//! while the predecessor still holds; once a read shows the predecessor as the only
//! entry ahead, the predecessor's delete grants it without another read: entries created
//! before ours cannot appear later, so with the last of them gone nobody is ahead. Its
//! own key's delete makes it re-check (and stop).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp, WatchFilterType,
    WatchOptions, WatchStream,
};
use lock_core::raw::backend::HoldKind;
use lock_core::{Error, LockName, LostReason, Result};
use tokio::time::{sleep_until, Instant};

use crate::connection::{
    ends_wait, first_kv, header_revision, watch_ended, DeleteWatch, EtcdClient,
};
use crate::error::unexpected;
use crate::layout::{entries_ahead, queue_head, queue_tail, twin_key, Entry};
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
        .map(|kv| Entry::of(kv.key(), kv.value()).kind)
        .collect();
    for other in &kinds {
        place.kind.check_beside(other, place.name)?;
    }
    Ok(place.kind.granted_behind(&kinds))
}

/// Our entry, just put in the queue.
#[derive(Debug)]
pub(crate) struct Enqueued {
    /// Its create revision (the transaction's revision).
    pub(crate) revision: i64,
    /// The entries ahead of it that were read, enough for [`admitted`] to tell whether
    /// it is granted at once: the queue's head ([`queue_head`]) for a shared kind, the
    /// entries just before it ([`queue_tail`], nearest first) for an exclusive one.
    pub(crate) ahead: Vec<KeyValue>,
    /// For an exclusive kind, the entries just before it: where its wait starts without
    /// another read.
    nearest: Option<Vec<KeyValue>>,
}

impl Queue {
    /// Puts our key in the queue of `place` (or finds it there), with `value` (see
    /// [`crate::layout`]), deletes its [`twin_key`] (a leftover), and reads what is
    /// ahead of it in the same transaction (see [`Enqueued::ahead`]). One round trip.
    pub(crate) async fn enqueue(
        &self,
        place: &Place<'_>,
        lease: i64,
        value: &[u8],
    ) -> Result<Enqueued> {
        const WHAT: &str = "acquire";
        let (prefix, key) = (place.prefix, place.key);
        // A key of ours from an earlier, abandoned attempt is deleted and the put
        // retried, so every acquisition gets a fresh create revision (fencing token).
        for _ in 0..3 {
            // An exclusive kind is granted when nobody is ahead: the entries just before
            // ours tell that, and where its wait starts.
            let read = if place.kind.is_shared() {
                queue_head(place.kind)
            } else {
                queue_tail()
            };
            let put = TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)));
            let twin = TxnOp::delete(twin_key(key), None);
            let ops = [put, twin, TxnOp::get(prefix, Some(read))];
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then(ops)
                .or_else([TxnOp::get(key, None)]);
            let response = self.client.txn(WHAT, txn).await?;
            let ops = response.op_responses();
            if response.succeeded() {
                let revision = header_revision(&response, WHAT)?;
                let before = |range: &etcd_client::GetResponse| -> Vec<KeyValue> {
                    range
                        .kvs()
                        .iter()
                        .filter(|kv| kv.create_revision() < revision)
                        .cloned()
                        .collect()
                };
                let ahead = match ops.get(2) {
                    Some(etcd_client::TxnOpResponse::Get(range)) => before(range),
                    _ => return Err(unexpected(WHAT, "an answer without the queue's head")),
                };
                let nearest = (!place.kind.is_shared()).then(|| ahead.clone());
                return Ok(Enqueued {
                    revision,
                    ahead,
                    nearest,
                });
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

    /// Waits until our entry (`enqueued`) is granted: [`admitted`] behind the entries
    /// created before it.
    ///
    /// Watches what must go first (see the module docs), then re-checks with one
    /// read-only transaction (our key still there + the entries ahead that matter), or,
    /// for an exclusive entry whose last read showed only its predecessor ahead, holds on
    /// the predecessor's delete. Starts from the enqueue's read when it has the entries
    /// just ahead. Re-checks at least every `recheck` even without an event, and keeps
    /// the lease alive meanwhile. Retryable failures (an election, a member going away)
    /// are retried as long as the lease can be kept alive.
    ///
    /// No event is missed: a key watch carries every delete (and put) above its start
    /// revision (see [`EtcdClient::watch_delete`]), and the watched entry was read alive
    /// at `read_at`. When the watch starts after `read_at` (other writes in between), one
    /// linearizable read after the watch exists confirms the entry is still there
    /// unchanged (same create and mod revisions), so its change, if any, comes after the
    /// watch's start. A watch kept across re-checks started before their reads. A permit's
    /// range watch is in place before each re-check's read, and counts only deletes after
    /// that read.
    ///
    /// # Errors
    /// [`Error::Lost`] when our key or lease is gone; [`Error::Conflict`] as
    /// [`admitted`]; non-retryable request errors.
    pub(crate) async fn wait_turn(
        &self,
        place: &Place<'_>,
        enqueued: &Enqueued,
        lease: Lease,
    ) -> Result<()> {
        let revision = enqueued.revision;
        let mut first = match &enqueued.nearest {
            Some(nearest) if !nearest.is_empty() => {
                admitted(place, nearest)?;
                predecessor(nearest.iter()).map(|blocker| Turn::After {
                    blocker,
                    read_at: revision,
                })
            }
            _ => None,
        };
        // A permit's watch of the name's range, kept across re-checks.
        let mut range_watch = None;
        // An exclusive entry's watch of its predecessor, kept while that stays the same.
        let mut entry_watch: Option<EntryStream> = None;
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
            let turn = match first.take() {
                Some(turn) => Ok(turn),
                None => self.check_turn(place, revision).await,
            };
            let turn = match turn {
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
            // An exclusive waiter's predecessor, which the timer's re-check confirms.
            let mut ahead_kv = None;
            let mut waiting = match blocker {
                Blocker::Entry {
                    kv,
                    puts,
                    alone,
                    next,
                } => {
                    let kept = entry_watch
                        .as_mut()
                        .filter(|watch| !puts && watch.watches(&kv));
                    if let Some(watch) = kept {
                        // Still the same predecessor: its watch started before this read.
                        if let Some(next) = &next {
                            if watch.add(next.key(), read_at + 1).await.is_err() {
                                entry_watch = None;
                                continue;
                            }
                        }
                    } else {
                        // Our key from now on; the entry before the predecessor since the
                        // read, so that a delete of the predecessor before the watch
                        // starts is never missed for long: that entry's delete makes us
                        // re-check.
                        let mut also = Vec::new();
                        if !puts {
                            also.push((place.key.as_bytes(), 0));
                            also.extend(next.as_ref().map(|next| (next.key(), read_at + 1)));
                        }
                        entry_watch = None;
                        match self.watch_entry(&kv, puts, read_at, &also).await {
                            EntryWatch::Ended => continue,
                            EntryWatch::Watching { stream, confirmed } => {
                                if !confirmed {
                                    recheck_at = Instant::now() + self.recheck.min(RETRY_PAUSE);
                                }
                                entry_watch = stream.map(|stream| EntryStream {
                                    stream,
                                    key: kv.key().to_vec(),
                                    create_revision: kv.create_revision(),
                                    puts,
                                    also: also.iter().map(|(key, _)| key.to_vec()).collect(),
                                });
                            }
                        }
                    }
                    let grant_on = (alone && !puts).then(|| (kv.key().to_vec(), read_at));
                    if !puts {
                        ahead_kv = Some(kv);
                    }
                    Waiting::Entry { grant_on }
                }
                Blocker::Deletes { ahead, needed } => Waiting::Deletes {
                    ahead,
                    needed,
                    after: read_at,
                },
            };
            loop {
                let refresh_at = self.keep_waiting(lease.id).await?;
                tokio::select! {
                    wake = waiting.over(&mut range_watch, &mut entry_watch) => match wake {
                        // The predecessor's delete proves nobody is ahead; our own key
                        // must still stand (its delete may come late on a watcher still
                        // catching up), else the full re-check finds it gone.
                        Wake::Granted if self.still_mine(place.key, revision).await => return Ok(()),
                        Wake::Granted => break,
                        Wake::Recheck => break,
                    },
                    () = sleep_until(recheck_at) => {
                        // With the watch in place, our key and the predecessor both
                        // unchanged mean nothing was missed: a small read instead of the
                        // entries ahead.
                        let watching = entry_watch.is_some();
                        match &ahead_kv {
                            Some(kv) if watching && self.still_behind(place.key, revision, kv).await => {
                                recheck_at = Instant::now() + self.recheck;
                            }
                            _ => break,
                        }
                    }
                    () = sleep_until(refresh_at) => {}
                }
            }
        }
    }

    /// Watches the entry `kv` (read at `read_at`) for its delete, or any write with
    /// `puts`, and the deletes of the keys `also` (each from its start revision, see
    /// [`EtcdClient::watch_delete`]); confirms the entry unchanged when the watch starts
    /// after `read_at`, unless a key of `also` is watched since `read_at`: the entry
    /// before it, which must go too before we are granted, makes us re-check when it
    /// does.
    async fn watch_entry(
        &self,
        kv: &KeyValue,
        puts: bool,
        read_at: i64,
        also: &[(&[u8], i64)],
    ) -> EntryWatch {
        let covered = also
            .iter()
            .any(|&(_, from)| from > 0 && from <= read_at + 1);
        match self.client.watch_delete(kv.key(), puts, also).await {
            Ok(DeleteWatch::Ended) => EntryWatch::Ended,
            Ok(DeleteWatch::Watching { stream, start }) if start <= read_at || covered => {
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

    /// One linearizable read of two keys: is our key (created at `revision`) still there,
    /// and the entry `kv` ahead unchanged? False when the read fails.
    /// Whether our key (created at `revision`) is still there: one keys-only read.
    async fn still_mine(&self, key: &str, revision: i64) -> bool {
        const WHAT: &str = "confirming the grant";
        let txn = Txn::new().and_then([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        let Ok(response) = self.client.txn(WHAT, txn).await else {
            return false;
        };
        response
            .op_responses()
            .first()
            .and_then(first_kv)
            .map(|kv| kv.create_revision())
            == Some(revision)
    }

    async fn still_behind(&self, key: &str, revision: i64, kv: &KeyValue) -> bool {
        const WHAT: &str = "confirming the wait";
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let txn = Txn::new().and_then([
            TxnOp::get(key, keys_only()),
            TxnOp::get(kv.key(), keys_only()),
        ]);
        let Ok(response) = self.client.txn(WHAT, txn).await else {
            return false;
        };
        let found = |op: Option<&etcd_client::TxnOpResponse>| {
            op.and_then(first_kv)
                .map(|now| (now.create_revision(), now.mod_revision()))
        };
        let ops = response.op_responses();
        found(ops.first()).map(|(created, _)| created) == Some(revision)
            && found(ops.get(1)) == Some((kv.create_revision(), kv.mod_revision()))
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
                    .find(|kv| Entry::of(kv.key(), kv.value()).kind == HoldKind::Write);
                match writer.or(ahead.last()) {
                    Some(kv) => Blocker::Entry {
                        kv: (*kv).clone(),
                        puts: true,
                        alone: false,
                        next: None,
                    },
                    None => return Err(unexpected(WHAT, "not granted with nobody ahead")),
                }
            }
            _ => match predecessor(ahead.iter().rev().copied()) {
                Some(blocker) => blocker,
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

/// An exclusive waiter's blocker, from the entries just ahead of it ([`entries_ahead`]
/// or [`queue_tail`]: up to [`crate::layout::NEAREST`]), nearest first.
fn predecessor<'a>(mut nearest: impl Iterator<Item = &'a KeyValue>) -> Option<Blocker> {
    let kv = nearest.next()?.clone();
    let next = nearest.next().cloned();
    Some(Blocker::Entry {
        kv,
        puts: false,
        alone: next.is_none(),
        next,
    })
}

/// What a waiter waits for.
enum Blocker {
    /// The delete of one entry ahead (or, with `puts`, any write of it); `alone`: it was
    /// the only entry ahead; `next`: the entry before it (an exclusive waiter's).
    Entry {
        kv: KeyValue,
        puts: bool,
        alone: bool,
        next: Option<KeyValue>,
    },
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

/// The watch of one entry ahead, and of the keys `also` (our own, the entry before it).
struct EntryStream {
    stream: Box<WatchStream>,
    key: Vec<u8>,
    create_revision: i64,
    puts: bool,
    also: Vec<Vec<u8>>,
}

impl EntryStream {
    /// Whether this watches the deletes of the entry `kv`.
    fn watches(&self, kv: &KeyValue) -> bool {
        !self.puts && self.key == kv.key() && self.create_revision == kv.create_revision()
    }

    /// Watches the deletes of `key` too, from revision `from`, unless it already does.
    async fn add(&mut self, key: &[u8], from: i64) -> std::result::Result<(), etcd_client::Error> {
        if self.also.iter().any(|other| other == key) {
            return Ok(());
        }
        let deletes = WatchOptions::new()
            .with_filters([WatchFilterType::NoPut])
            .with_start_revision(from);
        self.stream.watch(key.to_vec(), Some(deletes)).await?;
        self.also.push(key.to_vec());
        Ok(())
    }
}

/// What ends a wait.
enum Wake {
    /// Re-check the queue.
    Recheck,
    /// The only entry ahead was deleted: we hold.
    Granted,
}

/// A waiter's wait, until its next re-check.
enum Waiting {
    /// On the watch of one entry; `grant_on`: its key and the revision of the read that
    /// showed it as the only entry ahead, when its delete grants us.
    Entry { grant_on: Option<(Vec<u8>, i64)> },
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
    async fn over(
        &mut self,
        range_watch: &mut Option<Box<WatchStream>>,
        entry_watch: &mut Option<EntryStream>,
    ) -> Wake {
        match self {
            Waiting::Entry { grant_on } => changed(entry_watch, grant_on.as_ref()).await,
            Waiting::Deletes {
                ahead,
                needed,
                after,
            } => {
                deletes_among(range_watch, ahead, needed, *after).await;
                Wake::Recheck
            }
        }
    }
}

/// Returns once a watched key is deleted (or, with `puts`, written), or the watch ends or
/// breaks (it is dropped); never returns without a watch. [`Wake::Granted`] for a delete
/// of the key of `grant_on` after its revision: whatever incarnation of the key the read
/// saw alive is gone, and with it the last entry ahead (none created before ours can
/// appear later). The stream of a delete-only watch is kept for the next round.
async fn changed(watch: &mut Option<EntryStream>, grant_on: Option<&(Vec<u8>, i64)>) -> Wake {
    let Some(entry) = watch.as_mut() else {
        return std::future::pending().await;
    };
    while let Ok(Some(answer)) = entry.stream.message().await {
        if entry.puts || watch_ended(&answer) {
            if ends_wait(&answer, entry.puts) {
                break;
            }
            continue;
        }
        let Some(event) = answer
            .events()
            .iter()
            .find(|event| event.event_type() == EventType::Delete)
        else {
            continue;
        };
        let granted = matches!(
            (event.kv(), grant_on),
            (Some(kv), Some((key, after))) if kv.key() == key.as_slice() && kv.mod_revision() > *after
        );
        return if granted {
            Wake::Granted
        } else {
            Wake::Recheck
        };
    }
    *watch = None;
    Wake::Recheck
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
