//! What an operator asks and does: who holds and who waits for a lock ([`inspect`]),
//! which names are held under a prefix ([`list`]), breaking a hold
//! ([`force_release`]), and a semaphore's resize ([`resize`]).
//!
//! An inspection is one linearizable range read of the lock's key range, in create
//! revision order (the first holds, the rest wait, as `concurrency.Mutex` orders them),
//! and one `LeaseTimeToLive` (without keys) more for the holder's lease when the lock is
//! held. Each participant shows its owner token or, for an election's leader and
//! candidates, their proposals ([`participant`]). No participant shows since when it is there
//! ([`Participant::since`] is `None`): etcd records revisions for keys, no time.
//!
//! A listing reads keys only, page by page, all pages at the revision of the first, so
//! it shows one moment. Breaking costs a read, a lease read, a lease grant and one
//! transaction. Every request is under the request timeout.
//!
//! # Token floor
//! The revision the range was read at, lowered below the first waiter's create revision
//! when there is one (the second key's for a mutex; after every co-holder's for a
//! semaphore or read-write lock): every key put later has a greater create revision, and
//! every waiter already queued is granted a token above the floor as well.

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use lock_core::raw::backend::{HoldKind, SemaphoreResize};
use lock_core::{Error, FencingToken, LockName, Occupancy, Participant, Result};

use crate::connection::{first_kv, header_revision, EtcdClient, LeaseTtl};
use crate::error::{unexpected, BACKEND};
use crate::layout::{
    broken_mark, entry_value, first_created, lock_of_key, names_under, range_end, Entry,
};
use crate::session::ttl_seconds;

const WHAT: &str = "inspecting a lock";

/// The occupancy of the lock whose key range is `prefix`.
///
/// # Errors
/// [`lock_core::Error::InvalidConfig`] when the range may not be read (permission
/// denied); connection errors, or [`lock_core::Error::Unavailable`] without a quorum.
pub(crate) async fn inspect(client: &EtcdClient, prefix: &str) -> Result<Occupancy> {
    let queue = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let txn = Txn::new().and_then([TxnOp::get(prefix, Some(queue))]);
    let response = client.txn(WHAT, txn).await?;
    let read_at = header_revision(&response, WHAT)?;
    let ops = response.op_responses();
    let Some(TxnOpResponse::Get(range)) = ops.first() else {
        return Err(unexpected(WHAT, "an answer without the range"));
    };
    let keys = range.kvs();
    let held = holding(keys);
    let mut floor = read_at;
    if let Some(first_waiter) = keys.get(held) {
        floor = floor.min(first_waiter.create_revision() - 1);
    }
    let mut holders = Vec::with_capacity(held);
    for (i, kv) in keys.iter().take(held).enumerate() {
        // What the lease has left, for the oldest holder (one request).
        let lease = match i {
            0 => lease_ttl(client, kv.lease()).await,
            _ => None,
        };
        holders.push(holder(kv, lease)?);
    }
    let waiters = keys.iter().skip(held).map(participant).collect();
    Ok(Occupancy::shared(holders, waiters).token_floor(Some(token(floor)?)))
}

/// How many of `keys` (a name's range in create order) hold: the longest head each of
/// whose entries [`HoldKind::granted_behind`] admits behind the entries before it. The
/// grant rule makes the holders a head of the queue: behind an entry not granted, none
/// is.
fn holding(keys: &[KeyValue]) -> usize {
    let kinds: Vec<HoldKind> = keys
        .iter()
        .map(|kv| Entry::of(kv.key(), kv.value()).kind)
        .collect();
    (0..kinds.len())
        .find(|&i| !kinds[i].granted_behind(&kinds[..i]))
        .unwrap_or(kinds.len())
}

/// The holding key `kv` (whose lease shows `lease`): a participant with its create
/// revision as fencing token and what its lease has left.
fn holder(kv: &KeyValue, lease: Option<LeaseTtl>) -> Result<Participant> {
    Ok(participant(kv)
        .fencing_token(Some(token(kv.create_revision())?))
        .lease_left(lease.map(|lease| lease.left)))
}

/// A queued key, as its [`Entry`] reads: under a `.kind` key, our mutex's, permit's,
/// reader's or writer's owner token (and the kind, as [`Participant::kind`], but for a
/// mutex); under a plain key, a candidate's proposal (ours or the Go client's
/// `Election`'s) as [`Participant::value`], what an election's reader takes as the
/// leader's value, and no owner token; nothing from the Go client's `Mutex`.
fn participant(kv: &KeyValue) -> Participant {
    let entry = Entry::of(kv.key(), kv.value());
    // The lease id, in the lowercase hex the key name carries.
    let session = (kv.lease() != 0).then(|| format!("{:x}", kv.lease()));
    // The campaign's put is the key's version 1; each proclaim is one more put.
    let version = entry
        .proposal
        .as_ref()
        .map(|_| u64::try_from(kv.version().saturating_sub(1)).unwrap_or(0));
    Participant::new(entry.owner)
        .session(session)
        .value(entry.proposal)
        .value_version(version)
        .kind(entry.kind.shown())
}

/// A revision as a fencing token (the lock grants its key's create revision).
fn token(revision: i64) -> Result<FencingToken> {
    u64::try_from(revision)
        .map(FencingToken)
        .map_err(|_| unexpected(WHAT, format!("revision {revision}")))
}

/// What lease `id` has left and was granted; `None` without a lease, or when it cannot
/// be read (it may be refused where the lease has keys we may not read): the rest of the
/// answer stands.
async fn lease_ttl(client: &EtcdClient, id: i64) -> Option<LeaseTtl> {
    if id == 0 {
        return None;
    }
    client.lease_ttl(id).await.unwrap_or_else(|err| {
        tracing::debug!(lease = format_args!("{id:x}"), error = %err, "the holder's lease could not be read");
        None
    })
}

/// Keys per page of a listing.
const PAGE: i64 = 1000;
/// Pages a listing reads at most.
const MAX_PAGES: usize = 1000;

/// The locks under `prefix` (the client's key prefix) whose names start with
/// `name_prefix` and that have a key, hence a holder (the key created first), sorted.
/// Keys that are not queue keys (marks, other data under the prefix) are skipped.
///
/// # Errors
/// [`Error::Unsupported`] for a range of more than `PAGE` × `MAX_PAGES` keys;
/// [`Error::InvalidConfig`] when the range may not be read; connection errors.
pub(crate) async fn list(
    client: &EtcdClient,
    prefix: &str,
    name_prefix: &str,
) -> Result<Vec<LockName>> {
    const WHAT: &str = "listing locks";
    let start = names_under(prefix, name_prefix).into_bytes();
    let end = range_end(&start);
    // An empty start is every key: etcd spells it `\0`.
    let mut from = if start.is_empty() { vec![0] } else { start };
    let mut names = BTreeSet::new();
    // 0: the latest revision, then the first page's.
    let mut revision = 0;
    for _ in 0..MAX_PAGES {
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_keys_only()
            .with_limit(PAGE)
            .with_revision(revision);
        let page = client.get(WHAT, &from, options).await?;
        if revision == 0 {
            revision = page.header().map_or(0, |header| header.revision());
        }
        names.extend(
            page.kvs()
                .iter()
                .filter_map(|kv| lock_of_key(prefix, kv.key(), kv.lease()))
                .filter(|name| name.as_str().starts_with(name_prefix)),
        );
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(names.into_iter().collect()),
        }
    }
    Err(Error::Unsupported {
        backend: BACKEND,
        operation: format!(
            "listing the locks under `{name_prefix}`: more than {} keys",
            PAGE * i64::try_from(MAX_PAGES).unwrap_or(i64::MAX)
        ),
    })
}

/// How many times a resize reads and writes again when the range changed in between.
const RESIZE_ROUNDS: usize = 8;

/// Resizes the semaphore `name`, whose key range is `prefix`: rewrites the value of every
/// entry as [`SemaphoreResize::rewrite`] says, keeping each key's lease and create
/// revision, in one transaction that holds only if no key of the range was put since the
/// read (every mod revision up to it) and every entry read is still there (its create
/// revision). Reads and writes again when the range changed meanwhile.
///
/// # Errors
/// [`Error::Conflict`] as [`SemaphoreResize::rewrite`]; [`Error::Unavailable`]
/// (retryable) when the range kept changing; connection errors.
pub(crate) async fn resize(
    client: &EtcdClient,
    name: &LockName,
    prefix: &str,
    resize: &SemaphoreResize<'_>,
) -> Result<()> {
    const WHAT: &str = "resizing a semaphore";
    for _ in 0..RESIZE_ROUNDS {
        let read = Txn::new().and_then([TxnOp::get(prefix, Some(GetOptions::new().with_prefix()))]);
        let response = client.txn(WHAT, read).await?;
        let read_at = header_revision(&response, WHAT)?;
        let Some(TxnOpResponse::Get(range)) = response.op_responses().first().cloned() else {
            return Err(unexpected(WHAT, "an answer without the range"));
        };
        if range.kvs().is_empty() {
            return Ok(());
        }
        let mut unchanged =
            vec![Compare::mod_revision(prefix, CompareOp::Less, read_at + 1).with_prefix()];
        let mut writes = Vec::new();
        for kv in range.kvs() {
            let entry = Entry::of(kv.key(), kv.value());
            let kind = resize.rewrite(&entry.kind, entry.owner.as_deref(), name)?;
            let value = entry
                .owner
                .as_deref()
                .and_then(|owner| entry_value(&kind, owner))
                .ok_or_else(|| unexpected(WHAT, "a permit's entry without its owner"))?;
            unchanged.push(Compare::create_revision(
                kv.key(),
                CompareOp::Equal,
                kv.create_revision(),
            ));
            let keep_lease = PutOptions::new().with_ignore_lease();
            writes.push(TxnOp::put(kv.key(), value, Some(keep_lease)));
        }
        let write = Txn::new().when(unchanged).and_then(writes);
        if client.txn(WHAT, write).await?.succeeded() {
            return Ok(());
        }
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        message: format!("the semaphore `{name}` changed under every resize attempt"),
        source: None,
    })
}

/// Breaks the lock whose key range is `range` (under the client's key `prefix`): deletes
/// its holder's key, the one created first (ours or any `concurrency.Mutex` user's), in
/// a transaction that checks its create revision, so a hold that ended meanwhile (and
/// its successor) is never hit; and puts its mark ([`broken_mark`]) in the same
/// transaction, on a lease of its own that lives three times the holder's lease TTL (or
/// `own_ttl` when it cannot be read), at least `mark_ttl`: the holder's
/// renewal or release finds it there. The holder's release revokes that lease; a holder
/// that never comes back leaves it to its TTL.
///
/// Returns the holder removed, as `inspect` shows it; `None` when there was
/// none, or when it ended between the read and the delete.
///
/// # Errors
/// [`Error::InvalidConfig`] when the range may not be read or written; connection
/// errors, after which the hold may or may not be broken.
pub(crate) async fn force_release(
    client: &EtcdClient,
    prefix: &str,
    range: &str,
    own_ttl: Duration,
    mark_ttl: Duration,
) -> Result<Option<Participant>> {
    const WHAT: &str = "breaking a lock";
    let read = Txn::new().and_then([TxnOp::get(range, Some(first_created()))]);
    let response = client.txn(WHAT, read).await?;
    let Some(kv) = response.op_responses().first().and_then(first_kv).cloned() else {
        return Ok(None);
    };
    let lease = lease_ttl(client, kv.lease()).await;
    let shown = holder(&kv, lease)?;
    let granted = lease.map_or(own_ttl, |lease| lease.granted);
    let mark_ttl = ttl_seconds(granted.saturating_mul(3).max(mark_ttl));
    let (mark_lease, _) = client
        .lease_grant("granting a mark's lease", mark_ttl)
        .await?;
    let mark = broken_mark(prefix, &String::from_utf8_lossy(kv.key()));
    let revision = kv.create_revision();
    let txn = Txn::new()
        .when([Compare::create_revision(
            kv.key(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([
            TxnOp::delete(kv.key(), None),
            TxnOp::put(
                mark,
                revision.to_string(),
                Some(PutOptions::new().with_lease(mark_lease)),
            ),
        ]);
    let revoke = || client.revoke_in_background("revoking an unused mark's lease", mark_lease);
    match client.txn(WHAT, txn).await {
        Ok(response) if response.succeeded() => Ok(Some(shown)),
        Ok(_) => {
            revoke();
            Ok(None)
        }
        Err(err) => {
            // Refused (permissions, a bad request): nothing was written. Otherwise the
            // transaction may have been applied, and its mark is needed.
            if !err.is_retryable() {
                revoke();
            }
            Err(err)
        }
    }
}
