//! What a lock's key range shows ([`inspect`]): its keys in create revision order (the
//! first holds, the rest wait, as `concurrency.Mutex` orders them), their owner tokens,
//! the holder's fencing token and lease, and the token floor.
//!
//! One linearizable range read; one `LeaseTimeToLive` (without keys) more for the
//! holder's lease when the lock is held. Each under the request timeout.
//!
//! No participant shows since when it is there ([`Participant::since`] is `None`): etcd
//! records revisions for keys, no time.
//!
//! # Token floor
//! The revision the range was read at, lowered below the second key's create revision
//! when there is one: every key put later has a greater create revision, and every waiter
//! already queued is granted a token above the floor as well.

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use lock_core::{FencingToken, Occupancy, Participant, Result};

use crate::connection::{header_revision, EtcdClient, LeaseTtl};
use crate::error::unexpected;

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
    let mut floor = read_at;
    if let Some(second) = keys.get(1) {
        floor = floor.min(second.create_revision() - 1);
    }
    let holder = match keys.first() {
        Some(kv) => Some(holder(kv, lease_ttl(client, kv.lease()).await)?),
        None => None,
    };
    let waiters = keys.iter().skip(1).map(participant).collect();
    Ok(Occupancy::new(holder, waiters).token_floor(Some(token(floor)?)))
}

/// The holding key `kv` (whose lease shows `lease`): a participant with its create
/// revision as fencing token and what its lease has left.
pub(crate) fn holder(kv: &KeyValue, lease: Option<LeaseTtl>) -> Result<Participant> {
    Ok(participant(kv)
        .fencing_token(Some(token(kv.create_revision())?))
        .lease_left(lease.map(|lease| lease.left)))
}

/// A queued key: its value is the owner token (ours; none from the Go client, which
/// stores an empty value).
fn participant(kv: &KeyValue) -> Participant {
    let value = String::from_utf8_lossy(kv.value());
    // The lease id, in the lowercase hex the key name carries.
    let session = (kv.lease() != 0).then(|| format!("{:x}", kv.lease()));
    Participant::new(Some(value.into_owned()).filter(|token| !token.is_empty())).session(session)
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
pub(crate) async fn lease_ttl(client: &EtcdClient, id: i64) -> Option<LeaseTtl> {
    if id == 0 {
        return None;
    }
    client.lease_ttl(id).await.unwrap_or_else(|err| {
        tracing::debug!(lease = format_args!("{id:x}"), error = %err, "the holder's lease could not be read");
        None
    })
}
