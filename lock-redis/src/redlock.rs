//! RedLock: the quorum rounds of an acquire over several independent servers (acquire
//! with a fencing reading, then the fencing write-back), each decided by a majority; and
//! the check that no server is listed twice (it would cast several votes).
//!
//! The other calls go to every server and are decided the same way, in their own files:
//! renewal and release (`hold.rs`: a hold is kept by a majority, and a lost one is
//! `Broken` when any server that answered found the break mark, else `Taken` when any
//! found another owner), inspection, listing and breaking (`operator.rs`: a majority
//! must answer; a listed name is held on a majority; a break reads the servers, then
//! deletes the value stored on the most of them from each server that holds it, marking
//! each there).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use lock_core::raw::backend::{validity_deadline, AcquireRequest, Acquired};
use lock_core::{Error, FencingToken, Result};
use tokio::time::{timeout_at, Instant};

use crate::attempt::{kind_conflict, Attempt, Dirty};
use crate::config::{twice_listed, RedisNode};
use crate::connection::Route;
use crate::error;
use crate::hold::{release_each, RedisHold};
use crate::layout::WakeKeys;
use crate::queue::{pttl_wait, queued_nap};
use crate::scripts::{ttl_millis, Ask, Queueing, Reading};
use crate::topology::Servers;

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

/// RedLock round `round` of the acquisition of `first`, in two parallel round trips:
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
///
/// With a floor (`fence_at_least`), readings leave the clock out and the token is
/// `max(max reading + 1, floor)`, the floor itself where no server has a counter; the
/// same intersection argument holds (the floor only raises it), but a counter lost on
/// the shared servers is covered by the floor alone, not by the clock.
pub(crate) async fn attempt(
    servers: &Servers,
    first: &RedisHold,
    round: u64,
    request: &AcquireRequest<'_>,
    dirty: &mut Dirty,
) -> Result<Attempt> {
    // Each round has its own owner token, so that a late undo of an earlier round can
    // never remove what a later round took.
    let hold = &first.for_round(round);
    let nodes = servers.topology.nodes();
    let backend = servers.backend;
    let arbiter = servers.topology.arbiter();
    let n = nodes.len();
    let (ttl, wait, floor) = (request.ttl, request.wait, request.fence_at_least);
    let lease = Duration::from_millis(ttl_millis(ttl));
    let node_timeout = servers.config.node_timeout_for(ttl);
    let ask = Ask {
        keys: &hold.keys,
        token: hold.token.as_str(),
        ttl,
        floor,
    };
    let plain = servers.scripts.acquire_reading(&ask);
    let queued = matches!(hold.keys.wake, WakeKeys::Queue { .. });
    let channel = servers.channel_prefix_for(&hold.keys.key);
    let queueing = Queueing {
        wait,
        channel: &channel,
        times: &servers.queue_times,
        grant_round: None,
    };
    let ordered = queued.then(|| servers.scripts.acquire_q_reading(&ask, &queueing));
    // The validity is counted from here, before round 1, so it covers both rounds.
    let requested_at = Instant::now();
    let deadline = requested_at + node_timeout;
    // From here until the grant (or the undo below), a drop of this future leaves the
    // cleanup of every server to a background task.
    dirty.arm(hold);
    // Round 1. Once a majority granted, other slower servers are not waited for (whatever
    // they do with this token later is covered by renewal and release on every
    // server); the granting majority's readings are all the fence needs.
    let quorum = servers.quorum();
    let calls = nodes.iter().enumerate().map(|(i, node)| {
        let call = match &ordered {
            Some(ordered) if i == arbiter => ordered,
            _ => &plain,
        };
        async move { (i, call.on(Route::Node(node), deadline).await) }
    });
    // With the queue, the server that orders the waiters is always waited for (within
    // the node timeout): its refusal decides, below.
    let replies = gather(calls, |replies| {
        replies
            .iter()
            .filter(|(_, r)| matches!(r, Ok(r) if r.won))
            .count()
            >= quorum
            && (!queued || replies.iter().any(|(i, _)| *i == arbiter))
    })
    .await;
    let mut tally = Tally::new(n);
    for (i, reply) in replies {
        tally.count(i, reply);
    }
    if queued && tally.granted[arbiter] {
        // The server that orders the waiters granted: the others' refusals are
        // contenders that lost it and are undoing their round, or the tail of the
        // previous holder's release; ask them again.
        // The first ask again goes out at once: the tail of a release sent to every
        // server at the same time as the one that woke us is then already there.
        let pause = requested_at.elapsed().max(Duration::from_millis(1));
        for retry in 0..ARBITER_RETRIES {
            let wait = if retry == 0 { Duration::ZERO } else { pause };
            if tally.won() >= quorum
                || validity_deadline(requested_at, lease) <= Instant::now() + wait
            {
                break;
            }
            if retry > 0 {
                tokio::time::sleep(wait).await;
            }
            let deadline = Instant::now() + node_timeout;
            let missing = (0..n).filter(|&i| !tally.granted[i]);
            let plain = &plain;
            let replies = futures::future::join_all(
                missing
                    .map(|i| async move { (i, plain.on(Route::Node(&nodes[i]), deadline).await) }),
            )
            .await;
            for (i, reply) in replies {
                tally.count(i, reply);
            }
        }
    }
    // While the server that orders the waiters answers, its refusal decides: the lock
    // goes to the head of its queue, not to whoever reaches a majority first.
    let arbiter_refused = queued && tally.refused[arbiter];
    let mut outcome = None;
    if tally.won() >= quorum && !arbiter_refused {
        // Round 2.
        let next = tally.highest_reading.saturating_add(1);
        let fence = floor.map_or(next, |floor| next.max(floor.get()));
        match write_fence(servers, hold, fence, node_timeout).await {
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
                    backend,
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
    } else if let Some(theirs) = tally.conflict {
        outcome = Some(Err(kind_conflict(servers, request, theirs)));
    } else if tally.answered < quorum {
        outcome = Some(Err(error::no_majority(
            backend,
            format!(
                "only {} of {n} servers answered the acquire of `{}`; RedLock needs {quorum}",
                tally.answered, hold.name
            ),
            tally.first_error,
        )));
    }
    if let Some(Ok(Attempt::Won(acquired))) = outcome {
        return Ok(Attempt::Won(acquired));
    }
    // Not granted: undo what this round took on every server (what cannot be undone
    // now is retried in the background when the acquire ends; the next round uses a
    // new token). A place in the queue is kept. Servers that refused hold nothing of
    // this round and are left alone.
    let taken: Vec<bool> = tally.refused.iter().map(|refused| !refused).collect();
    let undo = release_each(
        servers,
        hold,
        false,
        Some(&taken),
        Instant::now() + node_timeout,
    )
    .await;
    if undo.iter().all(Result::is_ok) {
        dirty.disarm(hold);
    }
    if tally.place.is_some() && wait {
        // Queued: leaving the queue is the cleanup's job until the acquire ends.
        dirty.arm(&hold.for_round(0));
    }
    match outcome {
        Some(result) => result,
        None => Ok(match tally.place {
            Some(place) => Attempt::Queued(queued_nap(servers, Some(place), tally.queue_pttl)),
            None => Attempt::Held(tally.held_for.unwrap_or(Duration::ZERO)),
        }),
    }
}

/// RedLock round 2: stores fencing token `fence` on every server where the lock is
/// still ours and the counter is below it (set if greater), and returns once a
/// majority stored it. `Ok(false)`: a majority answered but refused (the lock was lost
/// meanwhile).
async fn write_fence(
    servers: &Servers,
    hold: &RedisHold,
    fence: u64,
    node_timeout: Duration,
) -> Result<bool> {
    let nodes = servers.topology.nodes();
    let n = nodes.len();
    let quorum = servers.quorum();
    // A candidate's entry, stored by round 1, gets its term.
    let write = servers
        .scripts
        .fence_write(&hold.keys, hold.token.as_str(), fence);
    let deadline = Instant::now() + node_timeout;
    let acks = gather(
        nodes.iter().map(|node| {
            let write = &write;
            async move { write.on(Route::Node(node), deadline).await }
        }),
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
            servers.backend,
            format!(
                "only {answered} of {n} servers answered the fencing write of `{}`; RedLock needs {quorum}",
                hold.name
            ),
            first_error,
        ))
    }
}

/// How often the holder of the server that orders the waiters asks the servers that
/// refused again within one round.
const ARBITER_RETRIES: usize = 4;

/// The answers of a round so far.
struct Tally {
    granted: Vec<bool>,
    refused: Vec<bool>,
    answered: usize,
    highest_reading: u64,
    held_for: Option<Duration>,
    place: Option<u64>,
    /// The PTTL the queue's server reported with `place`.
    queue_pttl: i64,
    /// The kind code of another kind a server found holding the name.
    conflict: Option<i64>,
    first_error: Option<Error>,
}

impl Tally {
    fn new(n: usize) -> Self {
        Tally {
            granted: vec![false; n],
            refused: vec![false; n],
            answered: 0,
            highest_reading: 0,
            held_for: None,
            place: None,
            queue_pttl: 0,
            conflict: None,
            first_error: None,
        }
    }

    fn won(&self) -> usize {
        self.granted.iter().filter(|g| **g).count()
    }

    /// Server `i` answered `reply`.
    fn count(&mut self, i: usize, reply: Result<Reading>) {
        match reply {
            Ok(reply) => {
                if !self.refused[i] && !self.granted[i] {
                    self.answered += 1;
                }
                self.highest_reading = self.highest_reading.max(reply.reading);
                if let Some(theirs) = reply.conflict {
                    self.refused[i] = true;
                    self.conflict = Some(theirs);
                } else if reply.won {
                    self.granted[i] = true;
                    self.refused[i] = false;
                } else {
                    self.refused[i] = true;
                    let retry = pttl_wait(reply.pttl);
                    self.held_for = Some(self.held_for.map_or(retry, |w| w.min(retry)));
                    if reply.place.is_some() {
                        self.place = reply.place;
                        self.queue_pttl = reply.pttl;
                    }
                }
            }
            Err(err) => {
                self.first_error.get_or_insert(err);
            }
        }
    }
}

/// Runs `calls` concurrently and collects their results as they finish, until `enough`
/// says the outcome is decided or all are done; the calls still running are dropped.
async fn gather<T, F>(calls: impl IntoIterator<Item = F>, enough: impl Fn(&[T]) -> bool) -> Vec<T>
where
    F: std::future::Future<Output = T>,
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
