//! One acquire attempt where one server decides (one server, the primary Sentinels name,
//! a Redis Cluster primary), with the plain script or the queue's, and what an attempt
//! may leave on the servers ([`Dirty`]). RedLock's rounds are in `redlock.rs`.

use std::time::Duration;

use lock_core::raw::backend::{AcquireRequest, Acquired};
use lock_core::{Error, FencingToken, Result};
use tokio::time::Instant;

use crate::error;
use crate::hold::{release_all, RedisHold};
use crate::layout::{kind_named, WakeKeys};
use crate::queue::{pttl_wait, queued_nap};
use crate::scripts::{ttl_millis, AcquireReply, Ask, Call, Queueing};
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

/// Runs `call`, an acquire, on the server that owns `hold`'s key. Where the configuration
/// waits for replicas ([`RedisConfig::replica_wait`](crate::config::RedisConfig)), a grant
/// waits on the same connection until that many acknowledged it (`WAIT`, at most
/// `wait_timeout`); with fewer it is given back (compare-and-delete) and the attempt fails
/// with [`Error::Unavailable`].
async fn acquire_on_server(
    servers: &Servers,
    hold: &RedisHold,
    call: &Call<'_, Vec<i64>, AcquireReply>,
    dirty: &mut Dirty,
) -> Result<AcquireReply> {
    let wait = servers.config.replica_wait();
    let route = servers.routes(&hold.keys.key)[0];
    let (reply, acked) = call
        .on_replicated(route, servers.request_deadline(), wait)
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
    let queued = matches!(hold.keys.wake, WakeKeys::Queue { .. });
    let ask = Ask {
        keys: &hold.keys,
        token: hold.token.as_str(),
        ttl: request.ttl,
        floor: request.fence_at_least,
    };
    let channel = servers.channel_prefix_for(&hold.keys.key);
    let queueing = Queueing {
        wait: request.wait,
        channel: &channel,
        times: &servers.queue_times,
        grant_round: (request.wait && takes_grants(servers, hold)).then_some(round),
    };
    let scripts = &servers.scripts;
    let call = match &hold.keys.shared {
        Some(shared) => scripts.acquire_s(&ask, &queueing, shared),
        None if queued => scripts.acquire_q(&ask, &queueing),
        None => scripts.acquire(&ask),
    };
    let requested_at = Instant::now();
    dirty.arm(hold);
    let reply = acquire_on_server(servers, hold, &call, dirty).await?;
    match reply {
        AcquireReply::Granted { fence } => Ok(Attempt::Won(Acquired {
            hold: hold.clone(),
            fencing_token: FencingToken(fence),
            requested_at,
            lease: Duration::from_millis(ttl_millis(request.ttl)),
            session: 0,
        })),
        AcquireReply::Refused {
            pttl,
            place: Some(place),
        } => Ok(Attempt::Queued(queued_nap(servers, Some(place), pttl))),
        AcquireReply::Refused { pttl, place: None } => {
            dirty.disarm(hold);
            Ok(Attempt::Held(pttl_wait(pttl)))
        }
        AcquireReply::Conflict { theirs } => {
            // A shared kind's waiter an earlier round queued stays armed: the cleanup takes
            // it out of the queue (see `release_s.lua`).
            if hold.keys.shared.is_none() {
                dirty.disarm(hold);
            }
            Err(kind_conflict(servers, request, theirs))
        }
    }
}

/// The error of an acquire that a server refused because the name is held as another
/// kind (kind code `theirs`): the typed conflict, or a protocol error for a code this
/// client does not know.
pub(crate) fn kind_conflict(servers: &Servers, request: &AcquireRequest<'_>, theirs: i64) -> Error {
    if let Err(conflict) = request.kind.check_beside(&kind_named(theirs), request.name) {
        return conflict;
    }
    error::protocol(
        servers.backend,
        format!("`{}` was refused as another kind ({theirs})", request.name),
    )
}
