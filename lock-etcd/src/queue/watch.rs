//! What a waiter watches and how a watch wakes it: the watch of the entry ahead (and of
//! the keys beside it), the range watch of a permit counting deletes, and the small
//! linearizable reads that confirm no change was missed while a watch was set up.

use std::collections::HashSet;

use etcd_client::{
    EventType, GetOptions, KeyValue, Txn, TxnOp, WatchFilterType, WatchOptions, WatchStream,
};
use lock_core::Result;

use crate::connection::{ends_wait, first_kv, watch_ended, DeleteWatch, EtcdClient};

/// Watches the entry `kv` (read at `read_at`) for its delete, or any write with
/// `puts`, and the deletes of the keys `also` (each from its start revision, see
/// [`EtcdClient::watch_delete`]); confirms the entry unchanged when the watch starts
/// after `read_at`, unless a key of `also` is watched since `read_at`: the entry
/// before it, which must go too before we are granted, makes us re-check when it
/// does.
pub(super) async fn watch_entry(
    client: &EtcdClient,
    kv: &KeyValue,
    puts: bool,
    read_at: i64,
    also: &[(&[u8], i64)],
) -> EntryWatch {
    let covered = also
        .iter()
        .any(|&(_, from)| from > 0 && from <= read_at + 1);
    match client.watch_delete(kv.key(), puts, also).await {
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
            match unchanged(client, kv).await {
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

/// Whether the entry `kv` still exists unchanged (same create and mod revisions).
async fn unchanged(client: &EtcdClient, kv: &KeyValue) -> Result<bool> {
    let now = revisions(client, "confirming the entry ahead", &[kv.key()]).await?;
    Ok(now.first().copied().flatten() == Some(revisions_of(kv)))
}

/// Whether our key (created at `revision`) is still there. False when the read fails.
pub(super) async fn still_mine(client: &EtcdClient, key: &str, revision: i64) -> bool {
    let now = revisions(client, "confirming the grant", &[key.as_bytes()]).await;
    matches!(now.as_deref(), Ok([Some((created, _))]) if *created == revision)
}

/// Whether our key (created at `revision`) is still there and the entry `kv` ahead
/// unchanged, by one read. False when the read fails.
pub(super) async fn still_behind(
    client: &EtcdClient,
    key: &str,
    revision: i64,
    kv: &KeyValue,
) -> bool {
    let now = revisions(client, "confirming the wait", &[key.as_bytes(), kv.key()]).await;
    matches!(
        now.as_deref(),
        Ok([Some((created, _)), ahead]) if *created == revision && *ahead == Some(revisions_of(kv))
    )
}

/// The create and mod revisions of each of `keys` now (`None`: no such key), by one
/// linearizable keys-only read.
async fn revisions(
    client: &EtcdClient,
    what: &str,
    keys: &[&[u8]],
) -> Result<Vec<Option<(i64, i64)>>> {
    let reads: Vec<TxnOp> = keys
        .iter()
        .map(|key| TxnOp::get(*key, Some(GetOptions::new().with_keys_only())))
        .collect();
    let response = client.txn(what, Txn::new().and_then(reads)).await?;
    let ops = response.op_responses();
    Ok((0..keys.len())
        .map(|i| ops.get(i).and_then(first_kv).map(revisions_of))
        .collect())
}

/// The create and mod revisions of `kv`.
fn revisions_of(kv: &KeyValue) -> (i64, i64) {
    (kv.create_revision(), kv.mod_revision())
}

/// A watch of one entry ahead.
pub(super) enum EntryWatch {
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
pub(super) struct EntryStream {
    pub(super) stream: Box<WatchStream>,
    pub(super) key: Vec<u8>,
    pub(super) create_revision: i64,
    pub(super) puts: bool,
    pub(super) also: Vec<Vec<u8>>,
}

impl EntryStream {
    /// Whether this watches the deletes of the entry `kv`.
    pub(super) fn watches(&self, kv: &KeyValue) -> bool {
        !self.puts && self.key == kv.key() && self.create_revision == kv.create_revision()
    }

    /// Watches the deletes of `key` too, from revision `from`, unless it already does.
    pub(super) async fn add(
        &mut self,
        key: &[u8],
        from: i64,
    ) -> std::result::Result<(), etcd_client::Error> {
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
pub(super) enum Wake {
    /// Re-check the queue.
    Recheck,
    /// The only entry ahead was deleted: we hold.
    Granted,
}

/// A waiter's wait, until its next re-check.
pub(super) enum Waiting {
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
    pub(super) async fn over(
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
