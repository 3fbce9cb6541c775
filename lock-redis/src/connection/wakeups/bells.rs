//! A waiter's bell: what its wake-up channel rang so far (wake-ups, stand-by notices and
//! grants), and the wait for the next ring.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

/// What a bell has rung so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Rings {
    wake: u64,
    standby: u64,
    grants: u64,
    /// The latest grant.
    grant: Grant,
}

/// A release handed the lock to a queued waiter (see `release_q.lua`): the queued attempt
/// it was granted on, and its fencing token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) round: u64,
    pub(crate) fence: u64,
}

/// What a waiter was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ring {
    /// Try now.
    Wake,
    /// The waiter ahead was woken: try if it has not taken the lock within the hand-off
    /// window.
    Standby,
    /// The lock is the waiter's.
    Granted(Grant),
}

/// A message on a client's channel: what it rings and for which waiter (owner token):
/// `wake <token>`, `standby <token>` or `grant <token> <round> <fencing token>`.
pub(super) fn parse(message: &str) -> Option<(Ring, &str)> {
    match message.split_once(' ')? {
        ("wake", token) => Some((Ring::Wake, token)),
        ("standby", token) => Some((Ring::Standby, token)),
        ("grant", grant) => {
            let mut parts = grant.split(' ');
            let (token, round, fence) = (parts.next()?, parts.next()?, parts.next()?);
            let grant = Grant {
                round: round.parse().ok()?,
                fence: fence.parse().ok()?,
            };
            (parts.next().is_none()).then_some((Ring::Granted(grant), token))
        }
        _ => None,
    }
}

pub(super) fn ring(bell: &watch::Sender<Rings>, what: Ring) {
    bell.send_modify(|rings| match what {
        Ring::Wake => rings.wake = rings.wake.wrapping_add(1),
        Ring::Standby => rings.standby = rings.standby.wrapping_add(1),
        Ring::Granted(grant) => {
            rings.grants = rings.grants.wrapping_add(1);
            rings.grant = grant;
        }
    });
}

/// The receiving end of a bell.
pub(super) struct Bell {
    /// The rings already acted on.
    seen: Rings,
    bell: watch::Receiver<Rings>,
}

impl Bell {
    pub(super) fn new(bell: watch::Receiver<Rings>) -> Self {
        Bell {
            seen: Rings::default(),
            bell,
        }
    }

    /// Forgets the rings so far: [`Bell::rung`] waits for the next one.
    pub(super) fn mark(&mut self) {
        self.seen = *self.bell.borrow_and_update();
    }

    /// Waits for a ring after the last one seen (grants, then wake-ups, then stand-by
    /// notices).
    pub(super) async fn rung(&mut self) -> Ring {
        loop {
            let now = *self.bell.borrow_and_update();
            let seen = std::mem::replace(&mut self.seen, now);
            if now.grants != seen.grants {
                return Ring::Granted(now.grant);
            }
            if now.wake != seen.wake {
                return Ring::Wake;
            }
            if now.standby != seen.standby {
                return Ring::Standby;
            }
            if self.bell.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until woken, granted (then the grant) or until `nap` has passed; a stand-by
    /// notice shortens the wait to `window` from the notice.
    pub(super) async fn wait(&mut self, nap: Duration, window: Duration) -> Option<Grant> {
        let mut until = Instant::now() + nap;
        loop {
            tokio::select! {
                ring = self.rung() => match ring {
                    Ring::Granted(grant) => return Some(grant),
                    Ring::Wake => return None,
                    Ring::Standby => until = until.min(Instant::now() + window),
                },
                () = sleep_until(until) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_into_rings() {
        assert_eq!(parse("wake t1"), Some((Ring::Wake, "t1")));
        assert_eq!(parse("standby t1"), Some((Ring::Standby, "t1")));
        let grant = Grant {
            round: 3,
            fence: 1_795_795_434_202_429,
        };
        assert_eq!(
            parse("grant t1 3 1795795434202429"),
            Some((Ring::Granted(grant), "t1"))
        );
        for bad in [
            "grant t1 3",
            "grant t1 x 4",
            "grant t1 3 4 5",
            "ring t1",
            "wake",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
