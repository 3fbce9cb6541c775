//! Owner-checked writes of a hold: release (compare-and-DEL plus a wake-up, or the
//! shared kinds' release), the downgrade of a writer's hold and the proclaim of a
//! candidate's value, each decided by a majority of answers.

use std::sync::atomic::Ordering;

use futures::future::join_all;
use lock_core::raw::backend::{Amended, BackendRelease};
use lock_core::{LockName, LostReason, Result};
use redis::ScriptInvocation;
use tokio::time::Instant;

use super::{lost_reason, queue_invocation, status, ttl_millis, RedisHold, SharedKeys, WakeKeys};
use crate::connection::Route;
use crate::error;
use crate::topology::Servers;

/// The queue's release of `hold` (see `release_q.lua`); with `leave`, its waiter also
/// leaves the queue. On Redis Cluster, a release refused while the slot migrates
/// (`TRYAGAIN`: the queue's keys are not all on one node) falls back to the plain release
/// of the lock key alone (see [`release_each`]).
fn release_q_invocation<'s>(
    servers: &'s Servers,
    hold: &RedisHold,
    leave: bool,
) -> ScriptInvocation<'s> {
    let mut invocation = queue_invocation(&servers.scripts.release_q, hold);
    invocation
        .arg(if leave { hold.waiter() } else { "" })
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(ttl_millis(servers.queue_times.window))
        .arg(hold.keys.leader_arg())
        .arg(hold.keys.changed_arg());
    servers.pass_break_mark(&mut invocation, &hold.keys.broken);
    invocation
}

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
    let (queued, channel) = match &hold.keys.wake {
        WakeKeys::Queue { .. } => (Some(release_q_invocation(servers, hold, leave)), ""),
        WakeKeys::Channel(channel) => (None, channel.as_str()),
    };
    let routes = servers.routes(&hold.keys.key);
    let cluster = servers.topology.shards().is_some();
    // On Redis Cluster the plain release is also the queue's release's fallback.
    let plain = (queued.is_none() || routes.len() > 1 || cluster).then(|| {
        let mut invocation = servers.scripts.release.prepare_invoke();
        invocation.key(&hold.keys.key);
        invocation
            .arg(hold.token.as_str())
            .arg(channel)
            .arg(hold.keys.leader_arg())
            .arg(hold.keys.changed_arg());
        servers.pass_break_mark(&mut invocation, &hold.keys.broken);
        invocation
    });
    let arbiter = servers.topology.arbiter();
    let selected = |i: &usize| only.is_none_or(|only| only[*i]);
    join_all((0..routes.len()).filter(selected).map(|i| {
        let route = routes[i];
        let (invocation, fallback) = match (&queued, &plain) {
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
                    match shards
                        .script_unless_busy::<i64>(slot, "release", deadline, invocation)
                        .await?
                    {
                        Some(status) => Ok(status),
                        None => route.script("release", deadline, fallback).await,
                    }
                }
                _ => route.script::<i64>("release", deadline, invocation).await,
            }
        }
    }))
    .await
}

/// The keys of the scripts of the shared kinds for `hold` (see `shared.lua`): lock,
/// fencing counter, queue, liveness, holders' table, break mark; with its owner token
/// as first argument.
fn shared_invocation<'a>(
    script: &'a redis::Script,
    hold: &RedisHold,
    shared: &SharedKeys,
) -> ScriptInvocation<'a> {
    let mut invocation = queue_invocation(script, hold);
    invocation.key(&shared.table).key(&hold.keys.broken);
    invocation
}

/// Runs a script of the shared kinds (`release_s.lua`, `downgrade.lua`) on the one
/// server that serves `hold` (shared kinds are not granted on RedLock).
async fn shared_call(
    servers: &Servers,
    hold: &RedisHold,
    what: &str,
    invocation: &ScriptInvocation<'_>,
    deadline: Instant,
) -> Vec<Result<i64>> {
    join_all(
        servers
            .routes(&hold.keys.key)
            .into_iter()
            .map(|route| async move { route.script::<i64>(what, deadline, invocation).await }),
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
    let mut invocation = shared_invocation(&servers.scripts.release_s, hold, shared);
    invocation
        .arg(if leave { hold.waiter() } else { "" })
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(&shared.changed);
    shared_call(servers, hold, "release", &invocation, deadline).await
}

/// Downgrades `hold`, a writer's, to a reader's in its place (`downgrade.lua`), granting
/// the readers queued behind it in the same step.
///
/// # Errors
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) for a hold that is no
/// writer's; connection errors, after which the downgrade may or may not be done.
pub(crate) async fn downgrade(servers: &Servers, hold: &RedisHold) -> Result<Amended> {
    let shared = match &hold.keys.shared {
        Some(shared) if shared.kind == "W" => shared,
        _ => {
            return Err(lock_core::Error::config(format!(
                "cannot downgrade `{}`: only a read-write lock's write hold downgrades",
                hold.name
            )))
        }
    };
    let mut invocation = shared_invocation(&servers.scripts.downgrade, hold, shared);
    invocation
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(&shared.changed);
    let deadline = servers.request_deadline();
    let replies = shared_call(servers, hold, "downgrade", &invocation, deadline).await;
    Ok(
        match owner_checked(servers, replies, "downgrade", &hold.name)? {
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
    let mut invocation = servers.scripts.proclaim.prepare_invoke();
    invocation
        .key(&hold.keys.key)
        .arg(hold.token.as_str())
        .arg(&candidate.leader)
        .arg(value)
        .arg(version)
        .arg(&candidate.changed)
        .arg(candidate.term.get().map_or(String::new(), u64::to_string));
    servers.pass_break_mark(&mut invocation, &hold.keys.broken);
    let deadline = servers.request_deadline();
    let routes = servers.routes(&hold.keys.key);
    let replies = join_all(routes.into_iter().map(|route| {
        let invocation = &invocation;
        async move { route.script::<i64>("proclaim", deadline, invocation).await }
    }))
    .await;
    Ok(
        match owner_checked(servers, replies, "proclaim", &hold.name)? {
            None => Amended::Done,
            Some(reason) => Amended::NotOwner(reason),
        },
    )
}
