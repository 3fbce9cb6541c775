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
//!
//! [`create`] puts our key in the queue; [`watch`] holds what a waiter watches and the
//! reads that confirm it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use lock_core::raw::backend::HoldKind;
use lock_core::{Error, LockName, LostReason, Result};
use tokio::time::{sleep_until, Instant};

use crate::connection::{first_kv, header_revision, EtcdClient};
use crate::error::unexpected;
use crate::layout::{entries_ahead, Entry};
use crate::session::{KeepAlive, Lease, Session};

mod create;
mod watch;

use watch::{still_behind, still_mine, watch_entry, EntryStream, EntryWatch, Waiting, Wake};

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
/// [`queue_head`](crate::layout::queue_head)).
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

/// The fewest deletes among the entries `ahead` after which `count` permits of
/// `permits` could be granted: the biggest holds going first. Fewer never grant, so a
/// waiter re-checks only after that many.
fn deletes_needed(permits: u32, count: u32, ahead: &[&KeyValue]) -> usize {
    let mut weights: Vec<u64> = ahead
        .iter()
        .map(|kv| u64::from(Entry::of(kv.key(), kv.value()).kind.weight()))
        .collect();
    weights.sort_unstable_by(|a, b| b.cmp(a));
    let mut taken: u64 = weights.iter().sum();
    let room = u64::from(permits).saturating_sub(u64::from(count));
    let mut needed = 0;
    for weight in weights {
        if taken <= room {
            break;
        }
        taken -= weight;
        needed += 1;
    }
    needed.max(1)
}

/// Our entry, just put in the queue.
#[derive(Debug)]
pub(crate) struct Enqueued {
    /// Its create revision (the transaction's revision).
    pub(crate) revision: i64,
    /// The entries ahead of it that were read, enough for [`admitted`] to tell whether
    /// it is granted at once: the queue's head ([`queue_head`](crate::layout::queue_head))
    /// for a shared kind, the entries just before it
    /// ([`queue_tail`](crate::layout::queue_tail), nearest first) for an exclusive one.
    pub(crate) ahead: Vec<KeyValue>,
    /// For an exclusive kind, the entries just before it: where its wait starts without
    /// another read.
    nearest: Option<Vec<KeyValue>>,
}

impl Queue {
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
                        match watch_entry(&self.client, &kv, puts, read_at, &also).await {
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
                        Wake::Granted if still_mine(&self.client, place.key, revision).await => return Ok(()),
                        Wake::Granted => break,
                        Wake::Recheck => break,
                    },
                    () = sleep_until(recheck_at) => {
                        // With the watch in place, our key and the predecessor both
                        // unchanged mean nothing was missed: a small read instead of the
                        // entries ahead.
                        let watching = entry_watch.is_some();
                        match &ahead_kv {
                            Some(kv) if watching && still_behind(&self.client, place.key, revision, kv).await => {
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

    /// Whether our entry (created at `revision`; `mine` as last read, if it was) is
    /// granted behind `ahead` ([`admitted`]). A reader that passes an upgradeable reader
    /// ahead is granted only by a transaction that rewrites its own key in place (same
    /// value and lease) if that entry is still the one read, still upgradeable; an upgrade
    /// rewrites the entry first, so a reader is either seen by the upgrade
    /// ([`passed_upgradeable`](crate::layout::passed_upgradeable)) or finds it a writer.
    /// A key of ours rewritten already (an earlier attempt's answer lost) is granted.
    pub(crate) async fn granted(
        &self,
        place: &Place<'_>,
        revision: i64,
        mine: Option<&KeyValue>,
        ahead: &[&KeyValue],
    ) -> Result<bool> {
        const WHAT: &str = "reading beside an upgradeable reader";
        if !admitted(place, ahead.iter().copied())? {
            return Ok(false);
        }
        let passed = ahead
            .iter()
            .find(|kv| Entry::of(kv.key(), kv.value()).kind == HoldKind::Upgradeable);
        let Some(passed) = passed.filter(|_| *place.kind == HoldKind::Read) else {
            return Ok(true);
        };
        if mine.is_some_and(|kv| kv.mod_revision() > kv.create_revision()) {
            return Ok(true);
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(passed.key(), CompareOp::Equal, passed.create_revision()),
                Compare::mod_revision(passed.key(), CompareOp::Equal, passed.mod_revision()),
                Compare::create_revision(place.key, CompareOp::Equal, revision),
            ])
            .and_then([TxnOp::put(
                place.key,
                "",
                Some(PutOptions::new().with_ignore_value().with_ignore_lease()),
            )]);
        Ok(self.client.txn(WHAT, txn).await?.succeeded())
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
        let mine = ops.first().and_then(first_kv);
        if self.granted(place, revision, mine, &ahead).await? {
            return Ok(Turn::Owner);
        }
        let blocker = match place.kind {
            HoldKind::Permit { permits, count } => Blocker::Deletes {
                needed: deletes_needed(*permits, *count, &ahead),
                ahead: ahead.iter().map(|kv| kv.key().to_vec()).collect(),
            },
            // A reader waits for the last writer ahead to go or to become a reader, else
            // for the first upgradeable reader ahead (a second one waits for it); an
            // upgradeable reader for the last entry ahead that is no reader.
            HoldKind::Read | HoldKind::Upgradeable => {
                let seen = |kv: &&&KeyValue| Entry::of(kv.key(), kv.value()).kind;
                let blocker = if *place.kind == HoldKind::Read {
                    let writer = ahead
                        .iter()
                        .rev()
                        .find(|kv| !matches!(seen(kv), HoldKind::Read | HoldKind::Upgradeable));
                    writer.or_else(|| ahead.iter().find(|kv| seen(kv) == HoldKind::Upgradeable))
                } else {
                    ahead.iter().rev().find(|kv| seen(kv) != HoldKind::Read)
                };
                match blocker.or(ahead.last()) {
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
/// or [`queue_tail`](crate::layout::queue_tail): up to [`crate::layout::NEAREST`]),
/// nearest first.
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
