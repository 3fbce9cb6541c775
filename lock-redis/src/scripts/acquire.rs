//! How the acquire scripts are called (`acquire.lua`, `acquire_q.lua`, `acquire_s.lua`)
//! and RedLock's fencing write-back (`fence_write.lua`), and what they reply.

use std::time::Duration;

use lock_core::{FencingToken, Result};
use redis::ScriptInvocation;

use super::{floor_arg, queue_invocation, ttl_millis, Call, Scripts};
use crate::config::QueueTimes;
use crate::error;
use crate::layout::{HoldKeys, SharedKeys};

/// What an acquire asks for: the hold of `keys` with owner `token` for `ttl`, its fencing
/// token no lower than `floor`.
pub(crate) struct Ask<'a> {
    pub(crate) keys: &'a HoldKeys,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) floor: Option<FencingToken>,
}

/// How a queued acquire waits.
pub(crate) struct Queueing<'a> {
    /// A refused waiter queues (else it only learns it is refused).
    pub(crate) wait: bool,
    /// What precedes a client id in the waiter's wake-up channel.
    pub(crate) channel: &'a str,
    pub(crate) times: &'a QueueTimes,
    /// The round of the acquire on which a release may hand a refused waiter the lock
    /// (see `grant_head` in `queue.lua`); `None`: it takes the lock itself.
    pub(crate) grant_round: Option<u64>,
}

impl Scripts {
    /// `acquire.lua` where one server decides: `SET NX PX`, and a grant takes the next
    /// fencing token, `max(counter + 1, server clock in µs)`, and stores it. With a
    /// floor, the floor takes the place of the clock (see `tokens.lua`). A candidate's
    /// grant also stores its entry (see `leader.lua`).
    pub(crate) fn acquire(&self, ask: &Ask<'_>) -> Call<'_, Vec<i64>, AcquireReply> {
        let invocation = self.plain_acquire(ask, true);
        self.call("acquire", invocation, AcquireReply::plain)
    }

    /// `acquire.lua` in a RedLock round: a grant only reads `max(counter, server clock in
    /// µs)` (the floor in place of the clock), and RedLock writes the token back through a
    /// majority ([`Scripts::fence_write`]).
    pub(crate) fn acquire_reading(&self, ask: &Ask<'_>) -> Call<'_, Vec<i64>, Reading> {
        let invocation = self.plain_acquire(ask, false);
        self.call("acquire", invocation, Reading::parse)
    }

    fn plain_acquire(&self, ask: &Ask<'_>, count: bool) -> ScriptInvocation<'_> {
        let mut invocation = self.acquire.prepare_invoke();
        invocation
            .key(&ask.keys.key)
            .key(&ask.keys.fence_key)
            .arg(ask.token)
            .arg(ttl_millis(ask.ttl))
            .arg(u8::from(count))
            .arg(floor_arg(ask.floor));
        if let Some(candidate) = &ask.keys.candidate {
            invocation
                .key(&candidate.leader)
                .arg(candidate.value.as_slice())
                .arg(&candidate.changed);
        }
        invocation
    }

    /// `acquire_q.lua` where one server decides: granted in arrival order, taking the
    /// next fencing token (no lower than the floor); a refused waiter queues when it
    /// waits. One that finds the key free behind a head nobody woke wakes it, as a
    /// release does. A candidate's grant also stores its entry (see `leader.lua`).
    pub(crate) fn acquire_q(
        &self,
        ask: &Ask<'_>,
        queueing: &Queueing<'_>,
    ) -> Call<'_, Vec<i64>, AcquireReply> {
        let invocation = self.queued_acquire(ask, queueing, true);
        self.call("acquire", invocation, AcquireReply::queued)
    }

    /// `acquire_q.lua` on the RedLock server that orders the waiters: a grant reads the
    /// fencing counter as [`Scripts::acquire_reading`] does.
    pub(crate) fn acquire_q_reading(
        &self,
        ask: &Ask<'_>,
        queueing: &Queueing<'_>,
    ) -> Call<'_, Vec<i64>, Reading> {
        let invocation = self.queued_acquire(ask, queueing, false);
        self.call("acquire", invocation, Reading::parse)
    }

    fn queued_acquire(
        &self,
        ask: &Ask<'_>,
        queueing: &Queueing<'_>,
        count: bool,
    ) -> ScriptInvocation<'_> {
        let ttl = Duration::from_millis(ttl_millis(ask.ttl));
        let times = queueing.times;
        let mut invocation = queue_invocation(&self.acquire_q, ask.keys, ask.token);
        invocation
            .arg(ttl_millis(ttl))
            .arg(u8::from(count))
            .arg(ask.keys.waiter())
            .arg(ttl_millis(times.stay))
            .arg(u8::from(queueing.wait))
            .arg(floor_arg(ask.floor))
            .arg(queueing.channel)
            .arg(ttl_millis(times.window));
        let candidate = ask.keys.candidate.as_ref();
        if let Some(candidate) = candidate {
            invocation
                .key(&candidate.leader)
                .arg(candidate.value.as_slice())
                .arg(&candidate.changed);
        } else if queueing.grant_round.is_some() {
            invocation.arg("").arg("");
        }
        if let Some(round) = queueing.grant_round {
            let lease = ttl_millis(times.grant_for(ttl));
            let mut grant = format!("{round}:{lease}:{}", floor_arg(ask.floor)).into_bytes();
            if let Some(candidate) = candidate {
                grant.push(b':');
                grant.extend_from_slice(&candidate.value);
            }
            invocation.arg(grant);
        }
        invocation
    }

    /// `acquire_s.lua`: the queued acquire of a hold of a shared kind, a permit, a reader
    /// or a writer (`shared`), granted by the rule of
    /// [`HoldKind::granted_behind`](lock_core::raw::backend::HoldKind::granted_behind), queued
    /// when refused and waiting, refused with a conflict when the name is another kind.
    pub(crate) fn acquire_s(
        &self,
        ask: &Ask<'_>,
        queueing: &Queueing<'_>,
        shared: &SharedKeys,
    ) -> Call<'_, Vec<i64>, AcquireReply> {
        let times = queueing.times;
        let mut invocation = queue_invocation(&self.acquire_s, ask.keys, ask.token);
        invocation
            .key(&shared.table)
            .arg(ttl_millis(ask.ttl))
            .arg(ask.keys.waiter())
            .arg(ttl_millis(times.stay))
            .arg(u8::from(queueing.wait))
            .arg(floor_arg(ask.floor))
            .arg(queueing.channel)
            .arg(&shared.kind)
            .arg(&shared.changed);
        if let Some(round) = queueing.grant_round {
            let ttl = Duration::from_millis(ttl_millis(ask.ttl));
            invocation.arg(round).arg(ttl_millis(times.grant_for(ttl)));
        }
        self.call("acquire", invocation, AcquireReply::queued)
    }

    /// `fence_write.lua`, RedLock's round 2 on one server: stores fencing token `fence`
    /// where the lock of `keys` is still `token`'s and the counter is below it (set if
    /// greater); a candidate's entry gets it as its term. 1: stored.
    pub(crate) fn fence_write(&self, keys: &HoldKeys, token: &str, fence: u64) -> Call<'_, i64> {
        let mut invocation = self.fence_write.prepare_invoke();
        invocation
            .key(&keys.key)
            .key(&keys.fence_key)
            .arg(token)
            .arg(fence);
        if let Some(candidate) = &keys.candidate {
            invocation.key(&candidate.leader).arg(&candidate.changed);
        }
        self.plain("write the fencing counter", invocation)
    }
}

/// The reply of an acquire where one server decides.
pub(crate) enum AcquireReply {
    Granted {
        fence: u64,
    },
    /// Refused; `place` in the queue (0 = head), `None` when not queued.
    Refused {
        pttl: i64,
        place: Option<u64>,
    },
    /// The name is another kind: the code of what it is (see
    /// [`kind_named`](crate::layout::kind_named)).
    Conflict {
        theirs: i64,
    },
}

impl AcquireReply {
    /// A reply of `acquire.lua`: `[1, fencing token]`, `[0, PTTL]` or `[-1, kind code]`.
    fn plain(backend: &'static str, reply: Vec<i64>) -> Result<AcquireReply> {
        match *reply {
            [1, fence] => Self::granted(backend, fence),
            [-1, theirs] => Ok(AcquireReply::Conflict { theirs }),
            [_, pttl] => Ok(AcquireReply::Refused { pttl, place: None }),
            _ => Err(error::protocol(
                backend,
                format!("unexpected reply of the acquire: {reply:?}"),
            )),
        }
    }

    /// A reply of `acquire_q.lua` or `acquire_s.lua`: `[1, fencing token, …]`, `[0, PTTL,
    /// _, place]` or `[-1, kind code]`.
    fn queued(backend: &'static str, reply: Vec<i64>) -> Result<AcquireReply> {
        match *reply {
            [1, fence, ..] => Self::granted(backend, fence),
            [0, pttl, _, place] => Ok(AcquireReply::Refused {
                pttl,
                place: u64::try_from(place).ok(),
            }),
            [-1, theirs] => Ok(AcquireReply::Conflict { theirs }),
            _ => Err(error::protocol(
                backend,
                format!("unexpected reply of the queued acquire: {reply:?}"),
            )),
        }
    }

    fn granted(backend: &'static str, fence: i64) -> Result<AcquireReply> {
        u64::try_from(fence)
            .map(|fence| AcquireReply::Granted { fence })
            .map_err(|_| error::protocol(backend, format!("negative fencing token {fence}")))
    }
}

/// One server's reply to a RedLock acquire ([`Scripts::acquire_reading`],
/// [`Scripts::acquire_q_reading`]).
pub(crate) struct Reading {
    pub(crate) won: bool,
    pub(crate) pttl: i64,
    /// `max(fencing counter, server clock in µs)`, or the counter alone with a floor.
    pub(crate) reading: u64,
    /// Place in the queue (the server that orders the waiters), when queued.
    pub(crate) place: Option<u64>,
    /// The kind code of another kind that holds the name on this server (refused).
    pub(crate) conflict: Option<i64>,
}

impl Reading {
    fn parse(backend: &'static str, reply: Vec<i64>) -> Result<Reading> {
        let (won, pttl, reading, place) = match *reply {
            [-1, theirs] => {
                return Ok(Reading {
                    won: false,
                    pttl: -2,
                    reading: 0,
                    place: None,
                    conflict: Some(theirs),
                })
            }
            [1, _, reading, ..] => (true, 0, reading, None),
            [0, pttl, reading] => (false, pttl, reading, None),
            [0, pttl, reading, place] => (false, pttl, reading, u64::try_from(place).ok()),
            _ => {
                return Err(error::protocol(
                    backend,
                    format!("unexpected reply of a RedLock acquire: {reply:?}"),
                ))
            }
        };
        let reading = u64::try_from(reading)
            .map_err(|_| error::protocol(backend, format!("negative fencing reading {reading}")))?;
        Ok(Reading {
            won,
            pttl,
            reading,
            place,
            conflict: None,
        })
    }
}
