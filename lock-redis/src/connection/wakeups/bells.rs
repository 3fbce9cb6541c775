//! A waiter's bell: what its wake-up channel rang so far (wake-ups and stand-by notices),
//! and the wait for the next ring.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

/// What a bell has rung so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Rings {
    wake: u64,
    standby: u64,
}

/// What a waiter was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ring {
    /// Try now.
    Wake,
    /// The waiter ahead was woken: try if it has not taken the lock within the hand-off
    /// window.
    Standby,
}

pub(super) fn ring(bell: &watch::Sender<Rings>, what: Ring) {
    bell.send_modify(|rings| match what {
        Ring::Wake => rings.wake = rings.wake.wrapping_add(1),
        Ring::Standby => rings.standby = rings.standby.wrapping_add(1),
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

    /// Waits for a ring after the last one seen (wake-ups before stand-by notices).
    pub(super) async fn rung(&mut self) -> Ring {
        loop {
            let now = *self.bell.borrow_and_update();
            let seen = std::mem::replace(&mut self.seen, now);
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

    /// Waits until woken or until `nap` has passed; a stand-by notice shortens the wait to
    /// `window` from the notice.
    pub(super) async fn wait(&mut self, nap: Duration, window: Duration) {
        let mut until = Instant::now() + nap;
        loop {
            tokio::select! {
                ring = self.rung() => match ring {
                    Ring::Wake => return,
                    Ring::Standby => until = until.min(Instant::now() + window),
                },
                () = sleep_until(until) => return,
            }
        }
    }
}
