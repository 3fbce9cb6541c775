//! What an operator does beyond inspecting a lock: list the held names under a prefix
//! ([`list`]) and break a hold ([`force_release`]).
//!
//! A listing reads keys only, page by page, all pages at the revision of the first, so
//! it shows one moment; every request is under the request timeout. Breaking costs a
//! read, a lease read, a lease grant and one transaction.

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use lock_core::{Error, LockName, Participant, Result};

use crate::connection::{first_kv, ttl_seconds, EtcdClient};
use crate::error::BACKEND;
use crate::inspect::{holder, lease_ttl};
use crate::layout::{
    broken_mark, first_created, lock_of_key, names_under, range_end, MARK_TTL_FLOOR,
};

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

/// Breaks the lock whose key range is `range` (under the client's key `prefix`): deletes
/// its holder's key, the one created first (ours or any `concurrency.Mutex` user's), in
/// a transaction that checks its create revision, so a hold that ended meanwhile (and
/// its successor) is never hit; and puts its mark ([`broken_mark`]) in the same
/// transaction, on a lease of its own that lives three times the holder's lease TTL (or
/// `own_ttl` when it cannot be read), at least [`MARK_TTL_FLOOR`]: the holder's
/// renewal or release finds it there. The holder's release revokes that lease; a holder
/// that never comes back leaves it to its TTL.
///
/// Returns the holder removed, as [`crate::inspect`] shows it; `None` when there was
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
    let mark_ttl = ttl_seconds(granted.saturating_mul(3).max(MARK_TTL_FLOOR));
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
