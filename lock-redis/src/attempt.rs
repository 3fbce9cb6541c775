//! One acquire attempt where one server decides (one server, the primary Sentinels name,
//! a Redis Cluster primary), and what an attempt may leave on the servers ([`Dirty`]).
//!
//! The plain script or the queue's; RedLock's rounds over several servers are in
//! `redlock.rs`.

use std::time::Duration;

use lock_core::raw::backend::{AcquireRequest, Acquired};
use lock_core::{Error, FencingToken, Result};
use redis::ScriptInvocation;
use tokio::time::Instant;

use crate::error;
use crate::hold::{floor_arg, kind_named, pttl_wait, release_all, ttl_millis, RedisHold, WakeKeys};
use crate::queue::{acquire_q_invocation, acquire_s_invocation, queued_nap, Reply};
use crate::topology::Servers;

/// The outcome of one acquire attempt.
pub(crate) enum Attempt {
    Won(Acquired<RedisHold>),
    /// Held by someone else: try again after at most this long.
    Held(Duration),
    /// Queued on the server that orders the waiters: try again when woken or after at most
    /// this long.
    Queued(Duration),
}

/// The holds (one per owner token) an acquire may have left on some server: a request in
/// flight, a queue entry, what a failed RedLock round could not undo. Released in the
/// background when the acquire's future is dropped or fails.
#[derive(Default)]
pub(crate) struct Dirty {
    pub(crate) holds: Vec<RedisHold>,
}

impl Dirty {
    /// `hold` may exist on some server from now on.
    pub(crate) fn arm(&mut self, hold: &RedisHold) {
        if !self.holds.iter().any(|h| h.token == hold.token) {
            self.holds.push(hold.clone());
        }
    }

    /// `hold` is granted or known to be gone everywhere.
    pub(crate) fn disarm(&mut self, hold: &RedisHold) {
        self.holds.retain(|h| h.token != hold.token);
    }
}

/// The acquire script for `hold`: with `count` it takes the next fencing token on a
/// grant, `max(counter + 1, server clock in µs)`, and stores it (one server); without, it
/// only reads `max(counter, server clock in µs)` (RedLock, which writes the token back
/// through a majority). With a `floor`, the floor takes the place of the clock (see
/// `tokens.lua`). A candidate's grant also stores its entry (see `leader.lua`).
pub(crate) fn acquire_invocation<'s>(
    servers: &'s Servers,
    hold: &RedisHold,
    ttl_ms: u64,
    count: bool,
    floor: Option<FencingToken>,
) -> ScriptInvocation<'s> {
    let mut invocation = servers.scripts.acquire.prepare_invoke();
    invocation
        .key(&hold.keys.key)
        .key(&hold.keys.fence_key)
        .arg(hold.token.as_str())
        .arg(ttl_ms)
        .arg(u8::from(count))
        .arg(floor_arg(floor));
    if let Some(candidate) = &hold.keys.candidate {
        invocation
            .key(&candidate.leader)
            .arg(candidate.value.as_slice())
            .arg(&candidate.changed);
    }
    invocation
}

/// Runs an acquire script on the server that owns `hold`'s key. Where the configuration
/// waits for replicas ([`RedisConfig::replica_wait`](crate::config::RedisConfig)), a grant
/// waits on the same connection until that many acknowledged it (`WAIT`, at most
/// `wait_timeout`); with fewer it is given back (compare-and-delete) and the attempt fails
/// with [`Error::Unavailable`].
async fn acquire_on_server(
    servers: &Servers,
    hold: &RedisHold,
    invocation: &ScriptInvocation<'_>,
    dirty: &mut Dirty,
) -> Result<Vec<i64>> {
    let wait = servers.config.replica_wait();
    let (reply, acked) = servers.routes(&hold.keys.key)[0]
        .acquire_script(servers.request_deadline(), invocation, wait)
        .await?;
    match (acked, wait) {
        (Some(acked), Some(wait)) if acked < i64::from(wait.replicas) => {
            if release_all(servers, hold, true, servers.request_deadline())
                .await
                .is_ok()
            {
                dirty.disarm(hold);
            }
            Err(Error::Unavailable {
                backend: servers.backend,
                message: format!(
                    "only {acked} of the {} replicas asked for acknowledged the grant of \
                     `{}` within {:?}; it was given back",
                    wait.replicas, hold.name, wait.timeout
                ),
                source: None,
            })
        }
        _ => Ok(reply),
    }
}

/// Whether a release may hand `hold` to it while it waits in the queue (see `grant_head`
/// in `queue.lua`, `settle` in `shared.lua`): any kind where one server decides (one
/// server, Sentinel, the primary of the name's slot). RedLock's waiters, whose grant takes
/// a majority, are woken and take the lock themselves.
pub(crate) fn takes_grants(servers: &Servers, hold: &RedisHold) -> bool {
    matches!(hold.keys.wake, WakeKeys::Queue { .. }) && !servers.topology.is_redlock()
}

/// One attempt where one server decides: with the queue, granted in arrival order and a
/// refused waiter stays queued (still in `dirty`, to leave the queue should the acquire
/// end) unless it does not `wait`; without, the plain `SET NX`. A waiter that
/// [`takes_grants`] may be handed the lock on `round` of its acquire.
pub(crate) async fn attempt(
    servers: &Servers,
    hold: &RedisHold,
    request: &AcquireRequest<'_>,
    round: u64,
    dirty: &mut Dirty,
) -> Result<Attempt> {
    let ttl_ms = ttl_millis(request.ttl);
    let floor = request.fence_at_least;
    let queued = matches!(hold.keys.wake, WakeKeys::Queue { .. });
    let grant_round = (request.wait && takes_grants(servers, hold)).then_some(round);
    let invocation = if let Some(shared) = &hold.keys.shared {
        acquire_s_invocation(
            servers,
            hold,
            shared,
            ttl_ms,
            request.wait,
            floor,
            grant_round,
        )
    } else if queued {
        acquire_q_invocation(
            servers,
            hold,
            ttl_ms,
            true,
            request.wait,
            floor,
            grant_round,
        )
    } else {
        acquire_invocation(servers, hold, ttl_ms, true, floor)
    };
    let requested_at = Instant::now();
    dirty.arm(hold);
    let reply = acquire_on_server(servers, hold, &invocation, dirty).await?;
    let reply = if queued {
        Reply::parse(servers.backend, &reply)?
    } else {
        Reply::parse_plain(servers.backend, &reply)?
    };
    match reply {
        Reply::Granted { fence } => Ok(Attempt::Won(Acquired {
            hold: hold.clone(),
            fencing_token: FencingToken(fence),
            requested_at,
            lease: Duration::from_millis(ttl_ms),
            session: 0,
        })),
        Reply::Refused {
            pttl,
            place: Some(place),
        } => Ok(Attempt::Queued(queued_nap(servers, Some(place), pttl))),
        Reply::Refused { pttl, place: None } => {
            dirty.disarm(hold);
            Ok(Attempt::Held(pttl_wait(pttl)))
        }
        Reply::Conflict { theirs } => {
            // A shared kind's waiter an earlier round queued stays armed: the cleanup takes
            // it out of the queue (see `release_s.lua`).
            if hold.keys.shared.is_none() {
                dirty.disarm(hold);
            }
            request
                .kind
                .check_beside(&kind_named(theirs), request.name)?;
            Err(error::protocol(
                servers.backend,
                format!("`{}` was refused as another kind ({theirs})", request.name),
            ))
        }
    }
}
