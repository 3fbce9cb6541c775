//! The Lua scripts of the protocol (the `.lua` files in `scripts/`) and how each is
//! called: the Rust files beside them put each script's keys and arguments in their
//! places and read its reply (`scripts/acquire.rs`: the acquires and RedLock's fencing
//! write; `scripts/release.rs`: release, downgrade, upgrade and proclaim;
//! `scripts/renew.rs`; `scripts/inspect.rs`: inspection, the force release and a
//! semaphore's resize; `scripts/fence.rs`: a fenced resource's write). A [`Call`] runs on a
//! connection's route. No other file spells a script's keys or arguments.

mod acquire;
mod fence;
mod inspect;
mod release;
mod renew;

pub(crate) use acquire::{AcquireReply, Ask, Queueing, Reading};
pub(crate) use fence::token_of;
pub(crate) use inspect::{LeaderView, View};
pub(crate) use renew::Renewal;

use std::time::Duration;

use lock_core::{FencingToken, Result};
use redis::{FromRedisValue, Script, ScriptInvocation};
use tokio::time::Instant;

use crate::config::ReplicaWait;
use crate::connection::{Route, Shards};
use crate::layout::{HoldKeys, WakeKeys};

/// The Lua scripts (sent as EVALSHA, loaded again on `NOSCRIPT`). Shared helpers are
/// prepended: `tokens.lua` to the scripts that grant (acquires, the queue's release),
/// `queue.lua` to the queue scripts, the inspection and the force release, `broken.lua`
/// to renewal, release and proclaim, `leader.lua` (elections) to the scripts that grant,
/// release or break, `kinds.lua` to the mutex acquires (a shared kind's name is a
/// conflict), `shared.lua` (permits, readers and writers) to their scripts and the
/// force release; and to every script that may wake waiters or tell an election's
/// observers, the command it publishes with (`PUBLISH`). The queue's acquire and release
/// start with their uncontended paths (`fast_acquire.lua`, `fast_release.lua`), which
/// return before the helpers they do not need are defined: the server pays for each
/// helper defined on every call.
pub(crate) struct Scripts {
    /// `redis` or `redlock`, for errors.
    backend: &'static str,
    /// Redis Cluster: see [`Scripts::new`].
    cluster: bool,
    acquire: Script,
    release: Script,
    acquire_q: Script,
    release_q: Script,
    renew: Script,
    fence_write: Script,
    /// A fenced resource's compare-and-set (`crate::fence`).
    fenced_store: Script,
    inspect: Script,
    force_release: Script,
    proclaim: Script,
    /// Shared kinds (permits, readers, writers): acquire, release, downgrade and upgrade.
    acquire_s: Script,
    release_s: Script,
    rekind: Script,
    /// A semaphore's resize.
    resize: Script,
}

impl Scripts {
    /// The scripts for one server or RedLock, or for Redis Cluster (`cluster`): there every
    /// wake-up is published on the shard of its name (`SPUBLISH`, to a channel in the
    /// name's hash slot), and renewal covers the holds of many slots in one call
    /// (`allow-cross-slot-keys`, the keys passed as arguments). `backend` names the
    /// backend in the errors of unexpected replies.
    pub(crate) fn new(backend: &'static str, cluster: bool) -> Self {
        let publish = if cluster {
            "local PUBLISH = 'SPUBLISH'\n"
        } else {
            "local PUBLISH = 'PUBLISH'\n"
        };
        let script = |parts: &[&str]| Script::new(&parts.concat());
        let tokens = include_str!("scripts/tokens.lua");
        let queue = include_str!("scripts/queue.lua");
        let broken = include_str!("scripts/broken.lua");
        let leader = include_str!("scripts/leader.lua");
        let shared = include_str!("scripts/shared.lua");
        let kinds = include_str!("scripts/kinds.lua");
        let shared_script = |body: &str| script(&[publish, tokens, queue, broken, shared, body]);
        Scripts {
            backend,
            cluster,
            acquire: script(&[
                publish,
                tokens,
                kinds,
                leader,
                include_str!("scripts/acquire.lua"),
            ]),
            release: script(&[publish, broken, leader, include_str!("scripts/release.lua")]),
            acquire_q: script(&[
                publish,
                tokens,
                include_str!("scripts/fast_acquire.lua"),
                kinds,
                queue,
                leader,
                include_str!("scripts/acquire_q.lua"),
            ]),
            release_q: script(&[
                publish,
                include_str!("scripts/fast_release.lua"),
                tokens,
                leader,
                queue,
                broken,
                include_str!("scripts/release_q.lua"),
            ]),
            renew: script(&[
                if cluster {
                    "#!lua flags=allow-cross-slot-keys\n"
                } else {
                    ""
                },
                broken,
                include_str!("scripts/renew.lua"),
            ]),
            fence_write: script(&[publish, include_str!("scripts/fence_write.lua")]),
            fenced_store: script(&[include_str!("scripts/fenced_store.lua")]),
            inspect: script(&[publish, queue, include_str!("scripts/inspect.lua")]),
            force_release: script(&[
                publish,
                tokens,
                queue,
                broken,
                leader,
                shared,
                include_str!("scripts/break.lua"),
            ]),
            proclaim: script(&[publish, broken, include_str!("scripts/proclaim.lua")]),
            acquire_s: shared_script(include_str!("scripts/acquire_s.lua")),
            release_s: shared_script(include_str!("scripts/release_s.lua")),
            rekind: shared_script(include_str!("scripts/rekind.lua")),
            resize: shared_script(include_str!("scripts/resize.lua")),
        }
    }

    /// A call of `script` with the keys and arguments `invocation` has, whose reply `read`
    /// reads.
    fn call<'s, T, R>(
        &self,
        what: &'static str,
        invocation: ScriptInvocation<'s>,
        read: fn(&'static str, T) -> Result<R>,
    ) -> Call<'s, T, R> {
        Call {
            what,
            backend: self.backend,
            invocation,
            read,
        }
    }

    /// A call whose reply is taken as it comes.
    fn plain<'s, T>(&self, what: &'static str, invocation: ScriptInvocation<'s>) -> Call<'s, T> {
        self.call(what, invocation, |_, reply| Ok(reply))
    }

    /// Adds a hold's break mark `broken` to a release or a proclaim:
    /// a key (after the others) on one server or RedLock, the last argument on Redis
    /// Cluster, where the script then declares no key that is hardly ever there (see
    /// `release.lua`).
    fn pass_break_mark(&self, invocation: &mut ScriptInvocation<'_>, broken: &str) {
        if self.cluster {
            invocation.arg(broken);
        } else {
            invocation.key(broken);
        }
    }
}

/// `script` for the hold of `keys`, with the keys of `queue.lua` (lock, fencing counter,
/// and with the queue its queue and liveness) and the owner `token` as first argument.
fn queue_invocation<'s>(script: &'s Script, keys: &HoldKeys, token: &str) -> ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    invocation.key(&keys.key).key(&keys.fence_key);
    if let WakeKeys::Queue { queue, live, .. } = &keys.wake {
        invocation.key(queue).key(live);
    }
    invocation.arg(token);
    invocation
}

/// A TTL in whole milliseconds (at least 1), as Redis takes it.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A fencing token floor as the acquire scripts take it: the decimal token, "" for none.
fn floor_arg(floor: Option<FencingToken>) -> String {
    floor
        .map(|floor| floor.get().to_string())
        .unwrap_or_default()
}

/// One script call, its keys and arguments in place: run it on a route, and its reply
/// (`T` as the client library reads it) comes back read as `R`.
pub(crate) struct Call<'s, T, R = T> {
    /// What the call does, for errors.
    what: &'static str,
    backend: &'static str,
    invocation: ScriptInvocation<'s>,
    read: fn(&'static str, T) -> Result<R>,
}

impl<T: FromRedisValue + Send, R> Call<'_, T, R> {
    /// Runs the call on `route` by `deadline` (see [`Route::script`]) and reads the reply.
    pub(crate) async fn on(&self, route: Route<'_>, deadline: Instant) -> Result<R> {
        let reply = route
            .script::<T>(self.what, deadline, &self.invocation)
            .await?;
        (self.read)(self.backend, reply)
    }
}

impl<R> Call<'_, Vec<i64>, R> {
    /// Runs an acquire on `route` by `deadline` and, on a grant, waits for `wait`'s
    /// replicas (see [`Route::acquire_script`]): the reply, and how many replicas
    /// acknowledged it (`None` without `WAIT`).
    pub(crate) async fn on_replicated(
        &self,
        route: Route<'_>,
        deadline: Instant,
        wait: Option<ReplicaWait>,
    ) -> Result<(R, Option<i64>)> {
        let (reply, acked) = route
            .acquire_script(deadline, &self.invocation, wait)
            .await?;
        Ok(((self.read)(self.backend, reply)?, acked))
    }
}

impl Call<'_, i64> {
    /// Runs the call on the primary of Redis Cluster slot `slot` by `deadline`; `None`
    /// when the slot migrates and the keys are not all on one node (`TRYAGAIN`).
    pub(crate) async fn unless_busy(
        &self,
        shards: &Shards,
        slot: u16,
        deadline: Instant,
    ) -> Result<Option<i64>> {
        shards
            .script_unless_busy(slot, self.what, deadline, &self.invocation)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_go_in_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 1);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
    }
}
