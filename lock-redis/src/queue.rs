//! The FIFO waiter queue: the queued acquire's script call and reply, and a waiter's naps.
//!
//! The waiter queue on one server: waiters take a ticket in a sorted set beside the lock
//! key (`acquire_q.lua`), a free key goes only to the head, and a release wakes the head
//! alone on its client's channel (`release_q.lua`).
//!
//! Liveness of the queue: a waiter re-runs its acquire at least every `recheck`, which
//! also keeps its entry alive; an entry not renewed for [`QueueTimes::stay`](crate::config::QueueTimes::stay) is dropped by
//! the next script that looks. A woken head has [`QueueTimes::window`](crate::config::QueueTimes::window) to take
//! the lock,
//! after which the waiter behind it (told to stand by) drops it and takes over, so a
//! crashed head stalls the queue for about one window. A waiter that finds the key free
//! behind a head nobody woke (the holder's key expired, or the woken head and its
//! stand-by are both dead) wakes that head itself and looks again after the window, so
//! each dead head costs about one window after a recheck. A cancelled acquire leaves at
//! once (the cleanup of what its attempts left) and wakes the next head when the key is free.

use std::time::Duration;

use lock_core::{FencingToken, Result};
use redis::ScriptInvocation;

use crate::error;
use crate::hold::{floor_arg, pttl_wait, queue_invocation, ttl_millis, RedisHold, SharedKeys};
use crate::topology::Servers;

/// A reply of `acquire_q.lua`, or of `acquire.lua` on one server (never queued).
pub(crate) enum Reply {
    Granted {
        fence: u64,
    },
    /// Refused; `place` in the queue (0 = head), `None` when not queued.
    Refused {
        pttl: i64,
        place: Option<u64>,
    },
    /// The name is another kind (`acquire_s.lua`): the code of what it is (see
    /// [`kind_named`](crate::hold::kind_named)).
    Conflict {
        theirs: i64,
    },
}

impl Reply {
    /// A reply of `acquire.lua` on one server: `[1, fencing token]` or `[0, PTTL]`.
    pub(crate) fn parse_plain(backend: &'static str, reply: &[i64]) -> Result<Reply> {
        match *reply {
            [1, fence] => u64::try_from(fence)
                .map(|fence| Reply::Granted { fence })
                .map_err(|_| error::protocol(backend, format!("negative fencing token {fence}"))),
            [_, pttl] => Ok(Reply::Refused { pttl, place: None }),
            _ => Err(error::protocol(
                backend,
                format!("unexpected reply of the acquire: {reply:?}"),
            )),
        }
    }

    /// A reply of `acquire_q.lua`.
    pub(crate) fn parse(backend: &'static str, reply: &[i64]) -> Result<Reply> {
        match *reply {
            [1, fence, ..] => u64::try_from(fence)
                .map(|fence| Reply::Granted { fence })
                .map_err(|_| error::protocol(backend, format!("negative fencing token {fence}"))),
            [0, pttl, _, place] => Ok(Reply::Refused {
                pttl,
                place: u64::try_from(place).ok(),
            }),
            [-1, theirs] => Ok(Reply::Conflict { theirs }),
            _ => Err(error::protocol(
                backend,
                format!("unexpected reply of the queued acquire: {reply:?}"),
            )),
        }
    }
}

/// The first lease of a hold a release hands to a queued waiter of `ttl` (see
/// [`QueueTimes::grant`](crate::config::QueueTimes::grant)).
pub(crate) fn grant_lease(servers: &Servers, ttl: Duration) -> Duration {
    servers.queue_times.grant.min(ttl)
}

/// The queued acquire for `hold` (see `acquire_q.lua`): with `count` it takes the next
/// fencing token on a grant (no lower than `floor`); with `wait` a refused waiter
/// queues. One that finds the key free behind a head nobody woke wakes it, as a
/// release does. A candidate's grant also stores its entry (see `leader.lua`). With
/// `grant_round`, a refused waiter may be handed the lock by a release (see `grant_head`
/// in `queue.lua`) on this round of its acquire.
pub(crate) fn acquire_q_invocation<'s>(
    servers: &'s Servers,
    hold: &RedisHold,
    ttl_ms: u64,
    count: bool,
    wait: bool,
    floor: Option<FencingToken>,
    grant_round: Option<u64>,
) -> ScriptInvocation<'s> {
    let mut invocation = queue_invocation(&servers.scripts.acquire_q, hold);
    invocation
        .arg(ttl_millis(Duration::from_millis(ttl_ms)))
        .arg(u8::from(count))
        .arg(hold.waiter())
        .arg(ttl_millis(servers.queue_times.stay))
        .arg(u8::from(wait))
        .arg(floor_arg(floor))
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(ttl_millis(servers.queue_times.window));
    if let Some(candidate) = &hold.keys.candidate {
        invocation
            .key(&candidate.leader)
            .arg(candidate.value.as_slice())
            .arg(&candidate.changed);
    } else if grant_round.is_some() {
        invocation.arg("").arg("");
    }
    if let Some(round) = grant_round {
        let lease = grant_lease(servers, Duration::from_millis(ttl_ms));
        let mut grant = format!("{round}:{}:{}", ttl_millis(lease), floor_arg(floor)).into_bytes();
        if let Some(candidate) = &hold.keys.candidate {
            grant.push(b':');
            grant.extend_from_slice(&candidate.value);
        }
        invocation.arg(grant);
    }
    invocation
}

/// The queued acquire of a hold of a shared kind, a permit, a reader or a writer (see
/// `acquire_s.lua`): granted by the rule of
/// [`HoldKind::granted_behind`](lock_core::raw::backend::HoldKind::granted_behind), queued when
/// refused and `wait`, refused with a conflict when the name is another kind.
pub(crate) fn acquire_s_invocation<'s>(
    servers: &'s Servers,
    hold: &RedisHold,
    shared: &SharedKeys,
    ttl_ms: u64,
    wait: bool,
    floor: Option<FencingToken>,
    grant_round: Option<u64>,
) -> ScriptInvocation<'s> {
    let mut invocation = queue_invocation(&servers.scripts.acquire_s, hold);
    invocation
        .key(&shared.table)
        .arg(ttl_ms)
        .arg(hold.waiter())
        .arg(ttl_millis(servers.queue_times.stay))
        .arg(u8::from(wait))
        .arg(floor_arg(floor))
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(&shared.kind)
        .arg(&shared.changed);
    if let Some(round) = grant_round {
        let lease = grant_lease(servers, Duration::from_millis(ttl_ms));
        invocation.arg(round).arg(ttl_millis(lease));
    }
    invocation
}

/// How long a waiter at `place` in the queue (`None`: not queued) sleeps unless woken,
/// when the holder's key expires in `pttl` ms (-2: the key is free).
pub(crate) fn queued_nap(servers: &Servers, place: Option<u64>, pttl: i64) -> Duration {
    let recheck = servers.config.options.recheck;
    match place {
        // The head waits for the holder's expiry or a wake-up.
        Some(0) => pttl_wait(pttl).min(recheck),
        // The key is free while the head was woken to take it (by a release, or by
        // this attempt): a waiter behind it looks again once the head's window is over,
        // in case the stand-by notice was missed or the head and its stand-by are both
        // dead; each look wakes the next head, so dead heads are passed over in about
        // one window each.
        Some(_) if pttl == -2 => servers.queue_times.window,
        // The others wait for a wake-up, showing up at least every recheck to stay.
        _ => recheck,
    }
    .max(Duration::from_millis(1))
}
