//! The hold: our key, its create revision and the lease it lives on; and the server side
//! of holding: the owner-checked release, proclaim, downgrade and upgrade, and the renewal check (one list of
//! the lease's keys, whatever the number of holds), all telling a hold broken by an
//! operator (its mark is there, see [`crate::layout`]) from one that vanished.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse,
};
use futures::future::join_all;
use lock_core::raw::{
    backend::{Amended, BackendRelease, HoldKind},
    plumbing::lock_unpoisoned,
};
use lock_core::{Error, LostReason, Result};

use crate::connection::{first_kv, EtcdClient, LeaseKeys};
use crate::error::unexpected;
use crate::layout::{entry_value, passed_upgradeable};
use crate::slots::Slot;

/// etcd's default `--max-txn-ops`: the most operations (or compares) in one transaction.
pub const MAX_TXN_OPS: usize = 128;

/// A hold on etcd: our key, its create revision and the lease it lives on.
pub struct EtcdHold {
    pub(crate) key: String,
    /// Where a mark says the hold was broken ([`crate::layout::broken_mark`]).
    pub(crate) mark: String,
    pub(crate) revision: i64,
    pub(crate) lease: i64,
    /// The acquisition's owner token, as its entry stores it.
    pub(crate) owner: String,
    /// What the hold is; a writer's turns into a reader's when it downgrades.
    pub(crate) kind: Mutex<HoldKind>,
    /// Keeps the key from other acquisitions of the same name in this client.
    pub(crate) slot: Mutex<Option<Slot>>,
}

impl EtcdHold {
    /// The key (`<prefix>/<name>/<lease hex>`, or `…<lease hex>_<n>` for an acquisition
    /// made while another of the same name was under way in this client; then `.kind`
    /// for any kind but a candidate).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's create revision (the fencing token).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The hold ended: its key is free for another acquisition in this client.
    pub(crate) fn free_slot(&self) {
        drop(lock_unpoisoned(&self.slot).take());
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

/// Releases `hold`: deletes its key if its create revision is still the hold's, or else
/// reads its mark, in the same transaction, to tell a broken hold from a vanished one. A
/// mark found has served (the hold ended): its lease is revoked in the background.
pub(crate) async fn release(client: &EtcdClient, hold: &EtcdHold) -> Result<BackendRelease> {
    let txn = Txn::new()
        .when([Compare::create_revision(
            &*hold.key,
            CompareOp::Equal,
            hold.revision,
        )])
        .and_then([TxnOp::delete(&*hold.key, None)])
        .or_else([TxnOp::get(&*hold.mark, None)]);
    let response = client.txn("release", txn).await?;
    if response.succeeded() {
        return Ok(BackendRelease::Released);
    }
    Ok(BackendRelease::NotOwner(why_gone(client, &response, hold)))
}

/// Proclaims `value` for `hold`, a candidate's (the Go client's `Election.Proclaim`):
/// [`rewrite`]s the hold's key with it.
pub(crate) async fn proclaim(
    client: &EtcdClient,
    hold: &EtcdHold,
    value: &[u8],
) -> Result<Amended> {
    rewrite(client, hold, value, "proclaim").await
}

/// Turns `hold`, a writer's, into a reader's in its place: [`rewrite`]s its key's value
/// from `write/<token>` to `read/<token>` (same key, create revision and lease, so its
/// place in the queue stays, and the readers waiting on it see the put).
///
/// # Errors
/// [`Error::InvalidConfig`] for a hold that is no writer's; connection errors.
pub(crate) async fn downgrade(client: &EtcdClient, hold: &EtcdHold) -> Result<Amended> {
    let kind = lock_unpoisoned(&hold.kind).clone();
    if kind != HoldKind::Write {
        return Err(Error::config(format!(
            "cannot downgrade a hold of {}",
            kind.describe()
        )));
    }
    let value = entry_value(&HoldKind::Read, &hold.owner)
        .ok_or_else(|| unexpected("downgrade", "no value for a reader"))?;
    let amended = rewrite(client, hold, &value, "downgrade").await?;
    if matches!(amended, Amended::Done) {
        *lock_unpoisoned(&hold.kind) = HoldKind::Read;
    }
    Ok(amended)
}

/// One upgrade step of `hold`, an upgradeable reader's. The first [`rewrite`]s its
/// value to `write/<token>` in place: from then on no reader passes it (a reader is
/// granted beside it only by a transaction on its value being unchanged, see
/// [`passed_upgradeable`]). Each step then reads the name's range, in create order: the
/// hold is the writer alone when its key is first and no reader behind it passed it.
///
/// # Errors
/// [`Error::InvalidConfig`] for a hold that is no upgradeable reader's; connection
/// errors.
pub(crate) async fn upgrade(client: &EtcdClient, hold: &EtcdHold) -> Result<Amended> {
    const WHAT: &str = "upgrade";
    let kind = lock_unpoisoned(&hold.kind).clone();
    match kind {
        HoldKind::Upgradeable => {
            let value = entry_value(&HoldKind::Write, &hold.owner)
                .ok_or_else(|| unexpected(WHAT, "no value for a writer"))?;
            let amended = rewrite(client, hold, &value, WHAT).await?;
            if amended != Amended::Done {
                return Ok(amended);
            }
            *lock_unpoisoned(&hold.kind) = HoldKind::Write;
        }
        HoldKind::Write => {}
        other => {
            return Err(Error::config(format!(
                "cannot upgrade a hold of {}",
                other.describe()
            )))
        }
    }
    let prefix = hold.key.rfind('/').map_or("", |end| &hold.key[..=end]);
    let range = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let txn = Txn::new()
        .when([
            Compare::create_revision(&*hold.key, CompareOp::Equal, hold.revision),
            Compare::lease(&*hold.key, CompareOp::Equal, hold.lease),
        ])
        .and_then([TxnOp::get(prefix, Some(range))])
        .or_else([TxnOp::get(&*hold.mark, None)]);
    let response = client.txn(WHAT, txn).await?;
    if !response.succeeded() {
        return Ok(Amended::NotOwner(why_gone(client, &response, hold)));
    }
    let ops = response.op_responses();
    let queue: &[KeyValue] = match ops.first() {
        Some(etcd_client::TxnOpResponse::Get(range)) => range.kvs(),
        _ => return Err(unexpected(WHAT, "an answer without the queue")),
    };
    let alone = queue
        .first()
        .is_some_and(|first| first.create_revision() == hold.revision)
        && !queue.iter().skip(1).any(passed_upgradeable);
    Ok(if alone {
        Amended::Done
    } else {
        Amended::Pending
    })
}

/// Puts `value` on the hold's key, on the hold's lease, if the key's create revision and
/// lease are still the hold's; or else reads its mark, in the same transaction, as
/// [`release`] does.
async fn rewrite(
    client: &EtcdClient,
    hold: &EtcdHold,
    value: &[u8],
    what: &str,
) -> Result<Amended> {
    let txn = Txn::new()
        .when([
            Compare::create_revision(&*hold.key, CompareOp::Equal, hold.revision),
            Compare::lease(&*hold.key, CompareOp::Equal, hold.lease),
        ])
        .and_then([TxnOp::put(
            &*hold.key,
            value,
            Some(PutOptions::new().with_lease(hold.lease)),
        )])
        .or_else([TxnOp::get(&*hold.mark, None)]);
    let response = client.txn(what, txn).await?;
    if response.succeeded() {
        return Ok(Amended::Done);
    }
    Ok(Amended::NotOwner(why_gone(client, &response, hold)))
}

/// Why `hold`'s key was not there for a failed owner-checked transaction whose first
/// else-operation read the hold's mark: broken if the mark names this hold (then the mark
/// has served, and its lease is revoked in the background), vanished otherwise.
fn why_gone(client: &EtcdClient, response: &TxnResponse, hold: &EtcdHold) -> LostReason {
    let ops = response.op_responses();
    match ops.first().and_then(first_kv).filter(|kv| marks(kv, hold)) {
        Some(mark) => {
            client.revoke_in_background("revoking the mark of a broken hold", mark.lease());
            LostReason::Broken
        }
        None => LostReason::Vanished,
    }
}

/// Whether `mark` (read at `hold`'s mark key) says that this very hold was broken: its
/// value is the hold's create revision.
fn marks(mark: &KeyValue, hold: &EtcdHold) -> bool {
    mark.value() == hold.revision.to_string().as_bytes()
}

/// The renewal check: which holds on the client's lease are still ours.
#[derive(Debug, Default)]
pub(crate) struct HoldCheck {
    /// How many holds the check covered when the lease's key list last did not fit one
    /// answer (0: it fits).
    keys_overflow: AtomicUsize,
}

impl HoldCheck {
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
    /// one answer, every hold is checked by reads ([`compare_holds`]).
    pub(crate) async fn check(
        &self,
        client: &EtcdClient,
        lease: i64,
        holds: &[&EtcdHold],
    ) -> Result<Option<Vec<Option<LostReason>>>> {
        let overflowed_at = self.keys_overflow.load(Ordering::Relaxed);
        if overflowed_at != 0 && holds.len().saturating_mul(2) > overflowed_at {
            // The list overflowed with about this many holds: do not fetch it again.
            return compare_holds(client, lease, holds).await.map(Some);
        }
        let attached = match client.lease_keys(lease).await? {
            LeaseKeys::Gone => return Ok(None),
            LeaseKeys::TooLarge => {
                tracing::debug!(
                    holds = holds.len(),
                    "the keys of the session lease do not fit one answer; checking holds by reads"
                );
                self.keys_overflow
                    .store(holds.len().max(1), Ordering::Relaxed);
                return compare_holds(client, lease, holds).await.map(Some);
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
        let confirmed = compare_holds(client, lease, &suspects).await?;
        for (i, verdict) in missing.into_iter().zip(confirmed) {
            verdicts[i] = verdict;
        }
        Ok(Some(verdicts))
    }
}

/// Checks by linearizable reads that every hold's key still exists with its create
/// revision on lease `lease`: one transaction per [`MAX_TXN_OPS`] compares (two per
/// hold), all in flight at once. When one does not, the same transaction reads each
/// hold's key and mark: a hold whose key is gone is broken if its mark says so,
/// vanished otherwise.
async fn compare_holds(
    client: &EtcdClient,
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
                    .flat_map(|h| {
                        [
                            TxnOp::get(&*h.key, Some(GetOptions::new().with_keys_only())),
                            TxnOp::get(&*h.mark, None),
                        ]
                    })
                    .collect::<Vec<_>>(),
            );
        let response = client.txn(WHAT, txn).await?;
        if response.succeeded() {
            return Ok(vec![None; chunk.len()]);
        }
        let ops = response.op_responses();
        if ops.len() != chunk.len() * 2 {
            return Err(unexpected(WHAT, "wrong number of answers"));
        }
        Ok(chunk
            .iter()
            .zip(ops.chunks(2))
            .map(|(hold, ops)| {
                // Recreated, or rewritten off our lease: not this hold's key any more.
                let ours = first_kv(&ops[0])
                    .map(|kv| kv.create_revision() == hold.revision && kv.lease() == lease);
                match ours {
                    Some(true) => None,
                    // A break names this hold even when the key was taken again since.
                    _ if first_kv(&ops[1]).is_some_and(|mark| marks(mark, hold)) => {
                        Some(LostReason::Broken)
                    }
                    None => Some(LostReason::Vanished),
                    Some(false) => Some(LostReason::Taken),
                }
            })
            .collect())
    });
    let mut out = Vec::with_capacity(holds.len());
    for chunk in join_all(checks).await {
        out.extend(chunk?);
    }
    Ok(out)
}
