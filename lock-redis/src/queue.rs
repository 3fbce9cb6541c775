//! The FIFO waiter queue on one server, seen from a waiter: how long it naps between
//! attempts. Waiters take a ticket in a sorted set beside the lock key (`acquire_q.lua`),
//! a free key goes only to the head, and a release wakes the head alone on its client's
//! channel (`release_q.lua`).
//!
//! Liveness of the queue: a waiter re-runs its acquire at least every `recheck`, which
//! also keeps its entry alive; an entry not renewed for
//! [`QueueTimes::stay`](crate::config::QueueTimes::stay) is dropped by the next script
//! that looks. A woken head has [`QueueTimes::window`](crate::config::QueueTimes::window)
//! to take the lock, after which the waiter behind it (told to stand by) drops it and
//! takes over, so a crashed head stalls the queue for about one window. A waiter that
//! finds the key free behind a head nobody woke (the holder's key expired, or the woken
//! head and its stand-by are both dead) wakes that head itself and looks again after the
//! window, so each dead head costs about one window after a recheck. A cancelled acquire
//! leaves at once (the cleanup of what its attempts left) and wakes the next head when
//! the key is free.

use std::time::Duration;

use crate::topology::Servers;

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

/// How long to wait before retrying a lock whose holder's key expires in `pttl` ms.
pub(crate) fn pttl_wait(pttl: i64) -> Duration {
    match u64::try_from(pttl) {
        // Wait until just past the expiry.
        Ok(ms) => Duration::from_millis(ms.saturating_add(1)),
        // -1: a key without expiry (written by someone else); -2: gone already.
        Err(_) if pttl == -1 => Duration::MAX,
        Err(_) => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_the_holders_expiry() {
        assert_eq!(pttl_wait(250), Duration::from_millis(251));
        assert_eq!(pttl_wait(-1), Duration::MAX);
        assert_eq!(pttl_wait(-2), Duration::ZERO);
    }
}
