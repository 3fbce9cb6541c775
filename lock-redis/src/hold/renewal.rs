//! Renewal of holds: one batched script call per server, each hold decided by a
//! majority of answers, and the grouping of holds by the server that renews them (on
//! Redis Cluster the renewal itself is in `hold/cluster.rs`).

use std::time::Duration;

use futures::future::join_all;
use lock_core::raw::backend::{RenewItem, RenewOutcome};
use lock_core::Result;
use tokio::time::Instant;

use super::{cluster, lost_reason, renewal_of, status, RedisHold, RENEW_CHUNK};
use crate::connection::{slot_of, Route};
use crate::error;
use crate::scripts::ttl_millis;
use crate::topology::{Servers, Topology};

/// Renews `items` on every server: one script call per server (per [`RENEW_CHUNK`] keys).
/// Each hold gets its own outcome: renewed when a majority of servers (the one server, on
/// `redis://`) renewed it, lost when a majority can no longer confirm it, and undecided
/// when the servers that did not answer could still tip it either way.
///
/// # Errors
/// When fewer than a majority of servers answered: then no hold can be decided.
pub(crate) async fn renew(
    servers: &Servers,
    items: &[RenewItem<'_, RedisHold>],
) -> Result<Vec<RenewOutcome>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let nodes = match &servers.topology {
        Topology::Cluster(shards) => return cluster::renew(servers, shards, items).await,
        topology => topology.nodes(),
    };
    let n = nodes.len();
    let quorum = servers.quorum();
    let config = &servers.config;
    let shortest = items.iter().map(|i| i.ttl).min().unwrap_or_default();
    let limit = if servers.topology.is_redlock() {
        // A slow server must not hold up the others' verdict past a third of the lease,
        // nor past the caller's bound on the whole renewal (`request_timeout`, counted from
        // a little earlier): the replies that did come must still be counted.
        let request_timeout = config.options.request_timeout;
        config
            .node_timeout_for(shortest)
            .min(shortest / 3)
            .min(request_timeout - request_timeout / 5)
    } else {
        config.options.request_timeout
    };
    let deadline = Instant::now() + limit;
    let per_node = join_all(nodes.iter().map(|node| async move {
        let calls = items.chunks(RENEW_CHUNK).map(|chunk| {
            let call = servers.scripts.renew(chunk.iter().map(renewal_of), None);
            async move { call.on(Route::Node(node), deadline).await }
        });
        let mut statuses = Vec::with_capacity(items.len());
        for chunk in join_all(calls).await {
            statuses.extend(chunk?);
        }
        if statuses.len() != items.len() {
            return Err(error::protocol(
                servers.backend,
                format!(
                    "renewal of {} locks on {} returned {} statuses",
                    items.len(),
                    node.label,
                    statuses.len()
                ),
            ));
        }
        Ok(statuses)
    }))
    .await;
    let answers = error::majority(servers.backend, quorum, per_node, "the renewal")?;
    let silent = n - answers.len();
    let mut outcomes = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let renewed = answers.iter().filter(|(_, a)| a[i] == status::DONE).count();
        if renewed >= quorum {
            outcomes.push(RenewOutcome::Renewed {
                lease: Duration::from_millis(ttl_millis(item.ttl)),
            });
        } else if renewed + silent >= quorum {
            // The servers that did not answer may still hold it: this hold alone is
            // undecided (Suspect, retried soon).
            outcomes.push(RenewOutcome::Undecided);
        } else {
            let reason = lost_reason(answers.iter().map(|(_, a)| a[i]));
            outcomes.push(RenewOutcome::Lost(reason));
        }
    }
    Ok(outcomes)
}

/// See [`Backend::renewal_group`](lock_core::raw::backend::Backend::renewal_group): on Redis
/// Cluster the index of the primary that serves `hold`'s slot, `u64::MAX` for a slot
/// without one (the renewal finds its primary); 0 elsewhere.
pub(crate) fn renewal_group(topology: &Topology, hold: &RedisHold) -> u64 {
    let Some(shards) = topology.shards() else {
        return 0;
    };
    shards
        .owner_index(slot_of(hold.keys.key.as_bytes()))
        .and_then(|i| u64::try_from(i).ok())
        .unwrap_or(u64::MAX)
}
