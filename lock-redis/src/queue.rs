//! The waiter queue on one server: waiters take a ticket in a sorted set beside the lock
//! key (`acquire_q.lua`), a free key goes only to the head, and a release wakes the head
//! alone on its client's channel (`release_q.lua`).
//!
//! Liveness of the queue: a waiter re-runs its acquire at least every `recheck`, which
//! also keeps its entry alive; an entry not renewed for [`QueueTimes::stay`] is dropped by
//! the next script that looks. A woken head has [`QueueTimes::window`] to take the lock,
//! after which the waiter behind it (told to stand by) drops it and takes over, so a
//! crashed head stalls the queue for about one window. A waiter that finds the key free
//! behind a head nobody woke (the holder's key expired, or the woken head and its
//! stand-by are both dead) wakes that head itself and looks again after the window, so
//! each dead head costs about one window after a recheck. A cancelled acquire leaves at
//! once (the cleanup of [`Abandoned`]) and wakes the next head when the key is free.

use std::time::Duration;

use lock_core::raw::{AcquireRequest, Acquired, CleanupOnDrop};
use lock_core::{FencingToken, Result};
use tokio::time::Instant;

use crate::backend::{pttl_wait, Abandoned, Attempt, Inner};
use crate::error;
use crate::hold::{floor_arg, ttl_millis, RedisHold, WakeKeys};

/// Shortest hand-off window of a woken head.
const MIN_WINDOW: Duration = Duration::from_millis(20);

/// The times of the queue, from the client's options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueTimes {
    /// How long an entry stays without its waiter showing up: two rechecks and a
    /// request timeout (a live waiter shows up every recheck).
    pub(crate) stay: Duration,
    /// How long a woken head has to take the lock: a quarter of the recheck interval,
    /// at least 20 ms and at most the request timeout.
    pub(crate) window: Duration,
}

impl QueueTimes {
    pub(crate) fn new(recheck: Duration, request_timeout: Duration) -> Self {
        QueueTimes {
            stay: recheck.saturating_mul(2).saturating_add(request_timeout),
            window: (recheck / 4).max(MIN_WINDOW).min(request_timeout),
        }
    }
}

/// A reply of `acquire_q.lua`.
enum Reply {
    Granted {
        fence: u64,
    },
    /// Refused; `place` in the queue (0 = head), `None` when not queued.
    Refused {
        pttl: i64,
        place: Option<u64>,
    },
}

impl Reply {
    fn parse(backend: &'static str, reply: &[i64]) -> Result<Reply> {
        match *reply {
            [1, fence, ..] => u64::try_from(fence)
                .map(|fence| Reply::Granted { fence })
                .map_err(|_| error::protocol(backend, format!("negative fencing token {fence}"))),
            [0, pttl, _, place] => Ok(Reply::Refused {
                pttl,
                place: u64::try_from(place).ok(),
            }),
            _ => Err(error::protocol(
                backend,
                format!("unexpected reply of the queued acquire: {reply:?}"),
            )),
        }
    }
}

/// `script` for `hold`, with the keys of `queue.lua` and the owner token as first argument.
fn queue_invocation<'a>(
    script: &'a redis::Script,
    hold: &RedisHold,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    invocation.key(&hold.keys.key).key(&hold.keys.fence_key);
    if let WakeKeys::Queue { queue, live, .. } = &hold.keys.wake {
        invocation.key(queue).key(live);
    }
    invocation.arg(hold.token.as_str());
    invocation
}

impl Inner {
    /// The queued acquire for `hold` (see `acquire_q.lua`): with `count` it takes the next
    /// fencing token on a grant (no lower than `floor`); with `wait` a refused waiter
    /// queues. One that finds the key free behind a head nobody woke wakes it, as a
    /// release does.
    pub(crate) fn acquire_q_invocation(
        &self,
        hold: &RedisHold,
        ttl_ms: u64,
        count: bool,
        wait: bool,
        floor: Option<FencingToken>,
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = queue_invocation(&self.scripts.acquire_q, hold);
        invocation
            .arg(ttl_millis(Duration::from_millis(ttl_ms)))
            .arg(u8::from(count))
            .arg(hold.waiter())
            .arg(ttl_millis(self.queue_times.stay))
            .arg(u8::from(wait))
            .arg(floor_arg(floor))
            .arg(self.channel_prefix_for(&hold.keys.key))
            .arg(ttl_millis(self.queue_times.window));
        invocation
    }

    /// The release of `hold` (see `release_q.lua`); with `leave`, its waiter also leaves
    /// the queue. On Redis Cluster, a release refused while the slot migrates (`TRYAGAIN`:
    /// the queue's keys are not all on one node) falls back to the plain release of the
    /// lock key alone (see [`Inner::release_each`]).
    pub(crate) fn release_q_invocation(
        &self,
        hold: &RedisHold,
        leave: bool,
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = queue_invocation(&self.scripts.release_q, hold);
        invocation
            .arg(if leave { hold.waiter() } else { "" })
            .arg(self.channel_prefix_for(&hold.keys.key))
            .arg(ttl_millis(self.queue_times.window));
        self.pass_break_mark(&mut invocation, hold);
        invocation
    }

    /// How long a waiter at `place` in the queue (`None`: not queued) sleeps unless woken,
    /// when the holder's key expires in `pttl` ms (-2: the key is free).
    pub(crate) fn queued_nap(&self, place: Option<u64>, pttl: i64) -> Duration {
        let recheck = self.config.options.recheck;
        match place {
            // The head waits for the holder's expiry or a wake-up.
            Some(0) => pttl_wait(pttl).min(recheck),
            // The key is free while the head was woken to take it (by a release, or by
            // this attempt): a waiter behind it looks again once the head's window is over,
            // in case the stand-by notice was missed or the head and its stand-by are both
            // dead; each look wakes the next head, so dead heads are passed over in about
            // one window each.
            Some(_) if pttl == -2 => self.queue_times.window,
            // The others wait for a wake-up, showing up at least every recheck to stay.
            _ => recheck,
        }
        .max(Duration::from_millis(1))
    }

    /// One attempt on a single server through the queue: granted in arrival order; a
    /// refused waiter stays queued (its cleanup armed, to leave the queue should the
    /// acquire end) unless it does not `wait`.
    pub(crate) async fn attempt_queued(
        &self,
        hold: &RedisHold,
        request: &AcquireRequest<'_>,
        pending: &mut CleanupOnDrop<Abandoned>,
    ) -> Result<Attempt> {
        let ttl_ms = ttl_millis(request.ttl);
        let invocation =
            self.acquire_q_invocation(hold, ttl_ms, true, request.wait, request.fence_at_least);
        let requested_at = Instant::now();
        pending.state_mut().arm(hold);
        let reply = self.acquire_on_server(hold, &invocation, pending).await?;
        match Reply::parse(self.backend, &reply)? {
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
            } => Ok(Attempt::Queued(self.queued_nap(Some(place), pttl))),
            Reply::Refused { pttl, place: None } => {
                pending.state_mut().disarm(hold);
                Ok(Attempt::Held(pttl_wait(pttl)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_times_follow_the_options() {
        let times = QueueTimes::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(times.stay, Duration::from_secs(7));
        assert_eq!(times.window, Duration::from_millis(250));
        let fast = QueueTimes::new(Duration::from_millis(40), Duration::from_millis(15));
        assert_eq!(fast.window, Duration::from_millis(15));
        let slow = QueueTimes::new(Duration::from_millis(40), Duration::from_secs(5));
        assert_eq!(slow.window, MIN_WINDOW);
    }
}
