//! Holds and their batched renewal: one script call per server renews every hold of the
//! client (compare-and-PEXPIRE per key).

use futures::future::join_all;
use lock_core::raw::{RenewItem, RenewOutcome};
use lock_core::{Error, LockName, LostReason, OwnerToken, Result};
use tokio::time::Instant;

use crate::error;
use crate::lock::{ttl_millis, Inner};

/// Keys per renewal script call; bigger batches are split into several calls sent
/// together on the same connection.
const RENEW_CHUNK: usize = 1000;

/// One hold on Redis: the lock key and the owner token stored in it.
#[derive(Debug, Clone)]
pub struct RedisHold {
    pub(crate) name: LockName,
    pub(crate) key: String,
    pub(crate) fence_key: String,
    pub(crate) channel: String,
    pub(crate) token: OwnerToken,
}

impl RedisHold {
    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner token stored in the lock key. On RedLock, an acquisition that needed
    /// several rounds stores its token with a `~<round>` suffix.
    pub fn token(&self) -> &OwnerToken {
        &self.token
    }

    /// The hold a RedLock round would take: round 0 uses the acquisition's token.
    pub(crate) fn for_round(&self, round: u64) -> RedisHold {
        if round == 0 {
            return self.clone();
        }
        RedisHold {
            token: OwnerToken::from_string(format!("{}~{round}", self.token)),
            ..self.clone()
        }
    }
}

/// Renews `items` on every server: one script call per server (per [`RENEW_CHUNK`] keys).
/// Each hold gets its own outcome: renewed when a majority of servers (the one server, on
/// `redis://`) renewed it, lost when a majority can no longer confirm it, and undecided
/// when the servers that did not answer could still tip it either way.
///
/// # Errors
/// When fewer than a majority of servers answered: then no hold can be decided.
pub(crate) async fn renew(
    inner: &Inner,
    items: &[RenewItem<'_, RedisHold>],
) -> Result<Vec<RenewOutcome>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let n = inner.nodes.len();
    let shortest = items.iter().map(|i| i.ttl).min().unwrap_or_default();
    let limit = if inner.config.redlock {
        // A slow server must not hold up the others' verdict past a third of the lease,
        // nor past the caller's bound on the whole renewal (`request_timeout`, counted from
        // a little earlier): the replies that did come must still be counted.
        let request_timeout = inner.config.lock.request_timeout;
        inner
            .config
            .node_timeout_for(shortest)
            .min(shortest / 3)
            .min(request_timeout - request_timeout / 5)
    } else {
        inner.config.lock.request_timeout
    };
    let deadline = Instant::now() + limit;
    let per_node = join_all(inner.nodes.iter().map(|node| async move {
        let calls = items.chunks(RENEW_CHUNK).map(|chunk| {
            let mut invocation = inner.scripts.renew.prepare_invoke();
            for item in chunk {
                invocation
                    .key(&item.hold.key)
                    .arg(item.hold.token.as_str())
                    .arg(ttl_millis(item.ttl));
            }
            async move {
                node.script::<Vec<i64>>("renew", deadline, &invocation)
                    .await
            }
        });
        let mut statuses = Vec::with_capacity(items.len());
        for chunk in join_all(calls).await {
            statuses.extend(chunk?);
        }
        if statuses.len() != items.len() {
            return Err(error::protocol(
                inner.backend,
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
    let mut answers = Vec::with_capacity(n);
    let mut first_error = None;
    for result in per_node {
        match result {
            Ok(statuses) => answers.push(statuses),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    if answers.len() < inner.quorum {
        return Err(match (n, first_error) {
            (1, Some(err)) => err,
            (_, first_error) => Error::Unavailable {
                backend: inner.backend,
                message: format!(
                    "only {} of {n} servers answered the renewal; RedLock needs {}",
                    answers.len(),
                    inner.quorum
                ),
                source: first_error.map(|e| Box::new(e) as lock_core::BoxError),
            },
        });
    }
    let silent = n - answers.len();
    let mut outcomes = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let renewed = answers.iter().filter(|a| a[i] == 1).count();
        let taken = answers.iter().filter(|a| a[i] < 0).count();
        if renewed >= inner.quorum {
            outcomes.push(RenewOutcome::Renewed {
                lease: std::time::Duration::from_millis(ttl_millis(item.ttl)),
            });
        } else if renewed + silent >= inner.quorum {
            // The servers that did not answer may still hold it: this hold alone is
            // undecided (Suspect, retried soon).
            outcomes.push(RenewOutcome::Undecided);
        } else if taken > 0 {
            outcomes.push(RenewOutcome::Lost(LostReason::Taken));
        } else {
            outcomes.push(RenewOutcome::Lost(LostReason::Vanished));
        }
    }
    Ok(outcomes)
}
