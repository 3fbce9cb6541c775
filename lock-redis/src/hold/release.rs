//! Owner-checked writes of a hold: release (compare-and-DEL plus a wake-up, or the
//! shared kinds' release), the downgrade of a writer's hold, the upgrade of an upgradeable
//! reader's and the proclaim of a
//! candidate's value, each decided by a majority of answers.

use std::sync::atomic::Ordering;

use futures::future::join_all;
use lock_core::raw::backend::{Amended, Amendment, BackendRelease};
use lock_core::{LockName, LostReason, Result};
use tokio::time::Instant;

use super::{lost_reason, status, RedisHold};
use crate::connection::Route;
use crate::error;
use crate::layout::{SharedKeys, WakeKeys};
use crate::scripts::Call;
use crate::topology::Servers;

/// Runs the release script for `hold` on every server: 1 released, 0 gone, -1 held
/// by another owner, -2 broken (see [`status`]). With `leave`, a queued waiter of the
/// acquisition is also taken out of the queue. With `only`, just the servers it marks
/// (the others are left out of the result).
pub(crate) async fn release_each(
    servers: &Servers,
    hold: &RedisHold,
    leave: bool,
    only: Option<&[bool]>,
    deadline: Instant,
) -> Vec<Result<i64>> {
    // With the queue, the server that orders the waiters (the only one on `redis://`)
    // runs the queue's release, which wakes the head; the others a plain release.
    if let Some(shared) = &hold.keys.shared {
        return release_shared(servers, hold, shared, leave, deadline).await;
    }
    let (keys, token, scripts) = (&*hold.keys, hold.token.as_str(), &servers.scripts);
    // On Redis Cluster, a queue's release refused while the slot migrates (`TRYAGAIN`:
    // the queue's keys are not all on one node) falls back to the plain release of the
    // lock key alone.
    let (queued, channel) = match &keys.wake {
        WakeKeys::Queue { .. } => {
            let channel = servers.channel_prefix_for(&keys.key);
            let window = servers.queue_times.window;
            (
                Some(scripts.release_q(keys, token, leave, &channel, window)),
                "",
            )
        }
        WakeKeys::Channel(channel) => (None, channel.as_str()),
    };
    let routes = servers.routes(&keys.key);
    let cluster = servers.topology.shards().is_some();
    // On Redis Cluster the plain release is also the queue's release's fallback.
    let plain = (queued.is_none() || routes.len() > 1 || cluster)
        .then(|| scripts.release(keys, token, channel));
    let arbiter = servers.topology.arbiter();
    let selected = |i: &usize| only.is_none_or(|only| only[*i]);
    join_all((0..routes.len()).filter(selected).map(|i| {
        let route = routes[i];
        let (call, fallback) = match (&queued, &plain) {
            (Some(queued), plain) if i == arbiter => (queued, plain.as_ref()),
            (_, Some(plain)) => (plain, None),
            (Some(queued), None) => (queued, None),
            (None, None) => unreachable!("a release without a script"),
        };
        async move {
            match (route, fallback) {
                // Exclusion rests on the lock key alone: while the slot migrates, its
                // compare-and-DEL; the queued head is woken when its subscription
                // moves with the slot, or at its recheck.
                (Route::Slot(shards, slot), Some(fallback)) => {
                    match call.unless_busy(shards, slot, deadline).await? {
                        Some(status) => Ok(status),
                        None => fallback.on(route, deadline).await,
                    }
                }
                _ => call.on(route, deadline).await,
            }
        }
    }))
    .await
}

/// Runs `call`, an owner-checked write of `hold`, on every server that serves it.
async fn on_every_server(
    servers: &Servers,
    hold: &RedisHold,
    call: &Call<'_, i64>,
    deadline: Instant,
) -> Vec<Result<i64>> {
    join_all(
        servers
            .routes(&hold.keys.key)
            .into_iter()
            .map(|route| call.on(route, deadline)),
    )
    .await
}

/// The release of a hold of a shared kind (`release_s.lua`): removes it from the holders,
/// with `leave` takes its waiter out of the queue, and grants the waiters the holders
/// then admit.
async fn release_shared(
    servers: &Servers,
    hold: &RedisHold,
    shared: &SharedKeys,
    leave: bool,
    deadline: Instant,
) -> Vec<Result<i64>> {
    let channel = servers.channel_prefix_for(&hold.keys.key);
    let call = servers
        .scripts
        .release_s(&hold.keys, hold.token.as_str(), shared, leave, &channel);
    on_every_server(servers, hold, &call, deadline).await
}

/// Downgrades `hold`, a writer's, to a reader's in its place, granting the readers
/// queued behind it in the same step; or takes an upgrade step of `hold`, an upgradeable
/// reader's: it becomes a writer in its place (`rekind.lua`), `Pending` while readers
/// still hold beside it.
///
/// # Errors
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) for a hold of another kind;
/// connection errors, after which the step may or may not be done.
pub(crate) async fn rekind(
    servers: &Servers,
    hold: &RedisHold,
    amendment: Amendment<'_>,
) -> Result<Amended> {
    let (from, to) = match amendment {
        Amendment::Downgrade => ("W", "R"),
        _ => ("U", "W"),
    };
    let shared = match &hold.keys.shared {
        // An upgraded hold keeps the kind it was acquired as.
        Some(shared) if shared.kind == from || (to == "R" && shared.kind == "U") => shared,
        _ => {
            return Err(lock_core::Error::config(format!(
                "cannot {} `{}`: not a read-write lock's {} hold",
                amendment.label(),
                hold.name,
                if to == "R" {
                    "write"
                } else {
                    "upgradeable read"
                },
            )))
        }
    };
    let channel = servers.channel_prefix_for(&hold.keys.key);
    let call = servers
        .scripts
        .rekind(&hold.keys, hold.token.as_str(), shared, &channel, to);
    let deadline = servers.request_deadline();
    let replies = on_every_server(servers, hold, &call, deadline).await;
    let pending = replies.iter().any(|r| matches!(r, Ok(status::PENDING)));
    let replies = replies
        .into_iter()
        .map(|r| {
            r.map(|s| {
                if s == status::PENDING {
                    status::DONE
                } else {
                    s
                }
            })
        })
        .collect();
    Ok(
        match owner_checked(servers, replies, amendment.label(), &hold.name)? {
            None if pending => Amended::Pending,
            None => Amended::Done,
            Some(reason) => Amended::NotOwner(reason),
        },
    )
}

/// Releases `hold` on every server (compare-and-delete, then a wake-up); with `leave`,
/// also takes the acquisition's waiter out of the queue.
pub(crate) async fn release_all(
    servers: &Servers,
    hold: &RedisHold,
    leave: bool,
    deadline: Instant,
) -> Result<BackendRelease> {
    let replies = release_each(servers, hold, leave, None, deadline).await;
    Ok(
        match owner_checked(servers, replies, "release", &hold.name)? {
            None => BackendRelease::Released,
            Some(reason) => BackendRelease::NotOwner(reason),
        },
    )
}

/// What the servers' `replies` to an owner-checked write (`what`: the release or the
/// proclaim of `name`) decide: `None` when it was done on a majority (the one server, on
/// `redis://`), why the hold is not ours when a majority answered otherwise.
///
/// # Errors
/// When fewer than a majority answered: the write may then be done on some.
fn owner_checked(
    servers: &Servers,
    replies: Vec<Result<i64>>,
    what: &str,
    name: &LockName,
) -> Result<Option<LostReason>> {
    let (quorum, backend, servers_n) = (servers.quorum(), servers.backend, replies.len());
    let mut statuses = Vec::with_capacity(servers_n);
    let mut first_error = None;
    for reply in replies {
        match reply {
            Ok(status) => statuses.push(status),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    let done = statuses.iter().filter(|s| **s == status::DONE).count();
    let answered = statuses.len();
    if done >= quorum {
        Ok(None)
    } else if answered >= quorum {
        Ok(Some(lost_reason(statuses.into_iter())))
    } else if servers_n == 1 {
        Err(first_error.unwrap_or_else(|| error::protocol(backend, "no reply".into())))
    } else {
        Err(error::no_majority(
            backend,
            format!("only {answered} of {servers_n} servers answered the {what} of `{name}`"),
            first_error,
        ))
    }
}

/// Proclaims `value` as the value of `hold`, a candidate's, on every server: an
/// owner-checked write of its leader hash (see `proclaim.lua`), with a version above
/// every earlier proclaim of the hold, so that readers of several servers take the
/// newest value they see and a late retry never replaces a newer one; an entry gone
/// (evicted) comes back with the hold's term. Done when a majority of servers (the one
/// server, on `redis://`) found the hold theirs.
///
/// # Errors
/// When fewer than a majority of servers answered: the value may then be stored on some.
pub(crate) async fn proclaim(servers: &Servers, hold: &RedisHold, value: &[u8]) -> Result<Amended> {
    let backend = servers.backend;
    let Some(candidate) = &hold.keys.candidate else {
        return Err(lock_core::Error::unsupported(
            backend,
            format!(
                "proclaiming on `{}`, a hold that no campaign took",
                hold.name
            ),
        ));
    };
    let version = candidate.proclaims.fetch_add(1, Ordering::AcqRel) + 1;
    let call = servers
        .scripts
        .proclaim(&hold.keys, hold.token.as_str(), candidate, value, version);
    let deadline = servers.request_deadline();
    let replies = on_every_server(servers, hold, &call, deadline).await;
    Ok(
        match owner_checked(servers, replies, "proclaim", &hold.name)? {
            None => Amended::Done,
            Some(reason) => Amended::NotOwner(reason),
        },
    )
}
