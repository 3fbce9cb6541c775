//! Renewal on Redis Cluster: one script call per primary for the holds of every slot it
//! serves, the slot map reloaded once when a primary does not answer or no longer serves
//! some holds.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::raw::backend::{RenewItem, RenewOutcome};
use lock_core::Result;
use tokio::time::Instant;

use super::{lost_reason, renewal_of, status, RedisHold, RENEW_CHUNK};
use crate::connection::{group_by_shard, slot_of, Node, Route, Shards};
use crate::scripts::ttl_millis;
use crate::topology::Servers;

/// Renews `items` on Redis Cluster: one script call per primary (per [`RENEW_CHUNK`]
/// keys) for the holds of every slot it serves, the keys passed as arguments to the
/// renew script (flagged `allow-cross-slot-keys` on a cluster). When a primary does not
/// answer or no longer serves some holds, the slot map is reloaded once and the holds
/// whose slot has another primary now are renewed there, again one call per primary.
/// A hold its primary still serves but answers "elsewhere" for (its slot is moving and
/// its key went ahead) is sent again on its own, routed by its lock key so that the
/// cluster's `ASK` is followed.
///
/// # Errors
/// Only when the slot map cannot be loaded at all: a primary that does not answer
/// leaves its holds undecided.
pub(super) async fn renew(
    servers: &Servers,
    shards: &Shards,
    items: &[RenewItem<'_, RedisHold>],
) -> Result<Vec<RenewOutcome>> {
    let deadline = servers.request_deadline();
    let primaries = shards.primaries(deadline).await?;
    let seen = shards.version();
    let mut statuses: Vec<Option<i64>> = vec![None; items.len()];
    let slot = |i: usize| slot_of(items[i].hold.keys.key.as_bytes());
    let all: Vec<usize> = (0..items.len()).collect();
    let pending = renew_batches(
        servers,
        &primaries,
        shards,
        items,
        &all,
        &mut statuses,
        deadline,
    )
    .await;
    let mut alone = Vec::new();
    if !pending.is_empty() {
        let asked: Vec<Option<usize>> = pending
            .iter()
            .map(|(i, _)| shards.owner_index(slot(*i)))
            .collect();
        let reloaded = shards.reload(seen, deadline).await.is_ok();
        let mut moved = Vec::new();
        for ((i, elsewhere), asked) in pending.into_iter().zip(asked) {
            if reloaded && (asked.is_none() || shards.owner_index(slot(i)) != asked) {
                moved.push(i);
            } else if elsewhere {
                alone.push(i);
            }
            // Else its primary did not answer and still serves it: undecided.
        }
        if !moved.is_empty() {
            let primaries = shards.primaries(deadline).await?;
            let pending = renew_batches(
                servers,
                &primaries,
                shards,
                items,
                &moved,
                &mut statuses,
                deadline,
            )
            .await;
            alone.extend(pending.into_iter().filter(|(_, e)| *e).map(|(i, _)| i));
        }
    }
    let retries = join_all(alone.iter().map(|&i| {
        // Routed (and redirected) by its lock key.
        let call = servers
            .scripts
            .renew([renewal_of(&items[i])], Some(&items[i].hold.keys.key));
        async move { call.on(Route::Slot(shards, slot(i)), deadline).await }
    }))
    .await;
    for (&i, reply) in alone.iter().zip(retries) {
        if let Ok(reply) = reply {
            statuses[i] = reply.first().copied().filter(|s| *s != status::ELSEWHERE);
        }
    }
    Ok(items
        .iter()
        .zip(statuses)
        .map(|(item, status)| match status {
            Some(status::DONE) => RenewOutcome::Renewed {
                lease: Duration::from_millis(ttl_millis(item.ttl)),
            },
            Some(status) => RenewOutcome::Lost(lost_reason(std::iter::once(status))),
            None => RenewOutcome::Undecided,
        })
        .collect())
}

/// Renews the holds `which` (indices into `items`) on the `primaries` that serve them
/// in the slot map as it is: one script call per primary (per [`RENEW_CHUNK`] keys),
/// the answers put in `statuses`. Returns the holds left without a status, each with
/// whether its primary answered "elsewhere" (else it did not answer, or no primary
/// serves its slot).
async fn renew_batches(
    servers: &Servers,
    primaries: &[Arc<Node>],
    shards: &Shards,
    items: &[RenewItem<'_, RedisHold>],
    which: &[usize],
    statuses: &mut [Option<i64>],
    deadline: Instant,
) -> Vec<(usize, bool)> {
    let (groups, orphans) = group_by_shard(
        shards,
        primaries,
        which.iter().map(|&i| items[i].hold.keys.key.as_str()),
    );
    let mut pending: Vec<(usize, bool)> = orphans.iter().map(|&at| (which[at], false)).collect();
    let batches = groups.iter().zip(primaries).flat_map(|(group, node)| {
        group.chunks(RENEW_CHUNK).map(move |chunk| async move {
            let holds = chunk.iter().map(|&at| renewal_of(&items[which[at]]));
            let reply = servers
                .scripts
                .renew(holds, None)
                .on(Route::Node(node), deadline)
                .await;
            (chunk, reply)
        })
    });
    for (chunk, reply) in join_all(batches).await {
        match reply {
            Ok(replies) if replies.len() == chunk.len() => {
                for (&at, status) in chunk.iter().zip(replies) {
                    if status == status::ELSEWHERE {
                        pending.push((which[at], true));
                    } else {
                        statuses[which[at]] = Some(status);
                    }
                }
            }
            Ok(_) | Err(_) => pending.extend(chunk.iter().map(|&at| (which[at], false))),
        }
    }
    pending
}
