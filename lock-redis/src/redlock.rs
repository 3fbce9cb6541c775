//! RedLock: the quorum rounds of an acquire over several independent servers (acquire
//! with a fencing reading, then the fencing write-back), each decided by a majority; and
//! the check that no server is listed twice (it would cast several votes).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use lock_core::raw::{validity_deadline, Acquired, CleanupOnDrop};
use lock_core::{Error, FencingToken, Result};
use tokio::time::{timeout_at, Instant};

use crate::backend::{pttl_wait, Abandoned, Attempt, Inner};
use crate::config::{twice_listed, RedisNode};
use crate::error;
use crate::hold::{ttl_millis, RedisHold};

/// Rejects RedLock servers that resolve to a common address (`localhost:6379` and
/// `127.0.0.1:6379` are one server, which would cast several votes). A name that does not
/// resolve by `deadline` is left to the connection, which counts it as a server down.
///
/// # Errors
/// [`Error::InvalidConfig`] naming two servers and the address they share.
pub(crate) async fn reject_aliases(nodes: &[RedisNode], deadline: Instant) -> Result<()> {
    let resolved = futures::future::join_all(nodes.iter().map(|node| async move {
        match timeout_at(
            deadline,
            tokio::net::lookup_host((node.host.as_str(), node.port)),
        )
        .await
        {
            Ok(Ok(addrs)) => addrs
                .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
                .collect(),
            _ => Vec::new(),
        }
    }))
    .await;
    let mut owner: HashMap<SocketAddr, usize> = HashMap::new();
    for (i, addrs) in resolved.into_iter().enumerate() {
        for addr in addrs {
            match owner.get(&addr) {
                Some(&j) if j != i => return Err(twice_listed(&nodes[j], &nodes[i], Some(addr))),
                _ => {
                    owner.insert(addr, i);
                }
            }
        }
    }
    Ok(())
}

impl Inner {
    /// One RedLock round, in two parallel round trips:
    /// 1. acquire on every server; each reply also carries that server's reading
    ///    `max(fencing counter, server clock in µs)`, taken in the same atomic script as
    ///    the `SET`;
    /// 2. once a majority granted, write back the maximum reading + 1 on every server
    ///    (set if greater, only where the lock is still ours) and wait for a majority.
    ///
    /// The lock is granted when both rounds reached a majority and the validity, counted
    /// from before round 1, is still positive; otherwise everything this round took is
    /// undone before returning.
    ///
    /// Why the tokens strictly increase across successive holders: any two majorities
    /// intersect. The previous holder stored its token on a majority, each time while its
    /// key was on that server (fence_write.lua checks); this round's grants form another
    /// majority, and each grant read the counter atomically with the `SET` that found the
    /// key free, so after the previous holder's key had left that server (released, or
    /// expired, which under the bounded-drift assumption is after its validity ended). At
    /// least one server is in both majorities, and its reading already holds the previous
    /// token: max + 1 is above it. Readings of servers that refused (held by another) only
    /// raise the maximum. Where the shared servers lost that token (restored stale,
    /// restarted empty), the clock in their readings keeps max + 1 above it, as long as
    /// the servers' clocks do not go back and agree to within the time between grants.
    pub(crate) async fn attempt_redlock(
        &self,
        hold: &RedisHold,
        ttl: Duration,
        wait: bool,
        pending: &mut CleanupOnDrop<Abandoned>,
    ) -> Result<Attempt> {
        let n = self.nodes.len();
        let ttl_ms = ttl_millis(ttl);
        let lease = Duration::from_millis(ttl_ms);
        let node_timeout = self.config.node_timeout_for(ttl);
        let invocation = self.acquire_invocation(hold, ttl_ms, false);
        // The validity is counted from here, before round 1, so it covers both rounds.
        let requested_at = Instant::now();
        let deadline = requested_at + node_timeout;
        // From here until the grant (or the undo below), a drop of this future leaves the
        // cleanup of every server to a background task.
        pending.state_mut().arm(hold);
        // Round 1. Once a majority granted, slower servers are not waited for (whatever
        // they do with this token later is covered by renewal and release on every
        // server); the granting majority's readings are all the fence needs.
        let quorum = self.quorum;
        let replies = gather(
            self.nodes
                .iter()
                .map(|node| node.script::<(i64, i64, u64)>("acquire", deadline, &invocation)),
            |replies| {
                replies
                    .iter()
                    .filter(|r| matches!(r, Ok((1, _, _))))
                    .count()
                    >= quorum
            },
        )
        .await;
        let mut won = 0;
        let mut held_for: Option<Duration> = None;
        let mut answered = 0;
        let mut highest_reading = 0u64;
        let mut first_error = None;
        for reply in replies {
            match reply {
                Ok((1, _, reading)) => {
                    won += 1;
                    answered += 1;
                    highest_reading = highest_reading.max(reading);
                }
                Ok((_, pttl, reading)) => {
                    answered += 1;
                    highest_reading = highest_reading.max(reading);
                    let retry = pttl_wait(pttl);
                    held_for = Some(held_for.map_or(retry, |w| w.min(retry)));
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        let mut outcome = None;
        if won >= self.quorum {
            // Round 2.
            let fence = highest_reading.saturating_add(1);
            match self.write_fence(hold, fence, node_timeout).await {
                Ok(true) if validity_deadline(requested_at, lease) > Instant::now() => {
                    outcome = Some(Ok(Attempt::Won(Acquired {
                        hold: hold.clone(),
                        fencing_token: FencingToken(fence),
                        requested_at,
                        lease,
                        session: 0,
                    })));
                }
                Ok(true) if !wait => {
                    outcome = Some(Err(Error::Unavailable {
                        backend: self.backend,
                        message: format!(
                            "the servers answered too slowly: the {lease:?} lease on `{}` ran out \
                             while it was being acquired",
                            hold.name
                        ),
                        source: None,
                    }));
                }
                Ok(_) => outcome = Some(Ok(Attempt::Held(Duration::ZERO))),
                Err(err) => outcome = Some(Err(err)),
            }
        } else if answered < self.quorum {
            outcome = Some(Err(error::no_majority(
                self.backend,
                format!(
                    "only {answered} of {n} servers answered the acquire of `{}`; RedLock needs {}",
                    hold.name, self.quorum
                ),
                first_error,
            )));
        }
        if let Some(Ok(Attempt::Won(acquired))) = outcome {
            return Ok(Attempt::Won(acquired));
        }
        // Not granted: undo what this round took on every server (what cannot be undone
        // now is retried in the background when the acquire ends; the next round uses a
        // new token).
        let undo = self
            .release_each(hold, false, Instant::now() + node_timeout)
            .await;
        if undo.iter().all(Result::is_ok) {
            pending.state_mut().disarm(hold);
        }
        match outcome {
            Some(result) => result,
            None => Ok(Attempt::Held(held_for.unwrap_or(Duration::ZERO))),
        }
    }

    /// RedLock round 2: stores fencing token `fence` on every server where the lock is
    /// still ours and the counter is below it (set if greater), and returns once a
    /// majority stored it. `Ok(false)`: a majority answered but refused (the lock was lost
    /// meanwhile).
    async fn write_fence(
        &self,
        hold: &RedisHold,
        fence: u64,
        node_timeout: Duration,
    ) -> Result<bool> {
        let n = self.nodes.len();
        let quorum = self.quorum;
        let mut write = self.scripts.fence_write.prepare_invoke();
        write
            .key(&hold.key)
            .key(&hold.fence_key)
            .arg(hold.token.as_str())
            .arg(fence);
        let deadline = Instant::now() + node_timeout;
        let acks = gather(
            self.nodes
                .iter()
                .map(|node| node.script::<i64>("write the fencing counter", deadline, &write)),
            |acks| acks.iter().filter(|a| matches!(a, Ok(1))).count() >= quorum,
        )
        .await;
        let stored = acks.iter().filter(|a| matches!(a, Ok(1))).count();
        let answered = acks.iter().filter(|a| a.is_ok()).count();
        if stored >= quorum {
            Ok(true)
        } else if answered >= quorum {
            Ok(false)
        } else {
            let first_error = acks.into_iter().find_map(Result::err);
            Err(error::no_majority(
                self.backend,
                format!(
                    "only {answered} of {n} servers answered the fencing write of `{}`; RedLock needs {quorum}",
                    hold.name
                ),
                first_error,
            ))
        }
    }
}

/// Runs `calls` concurrently and collects their results as they finish, until `enough`
/// says the outcome is decided or all are done; the calls still running are dropped.
async fn gather<T, F>(
    calls: impl IntoIterator<Item = F>,
    enough: impl Fn(&[Result<T>]) -> bool,
) -> Vec<Result<T>>
where
    F: std::future::Future<Output = Result<T>>,
{
    let mut running: FuturesUnordered<F> = calls.into_iter().collect();
    let mut done = Vec::with_capacity(running.len());
    while let Some(result) = running.next().await {
        done.push(result);
        if enough(&done) {
            break;
        }
    }
    done
}
