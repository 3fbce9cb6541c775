//! One attempt at a time per name among a process's waiters of a directory: a release
//! wakes every waiter of the name, and without a turnstile each would re-try, so a
//! hand-over among `n` waiters cost `n` attempts (64 waiters of one name made a few dozen
//! hand-overs a second). A woken waiter takes the name's turn; the others wait for it to
//! finish, then try only if its attempt does not answer their wake-up: an attempt that
//! began after a waiter's wake-up and was refused by the kernel shows the name taken for
//! every waiter of its class, and an exclusive grant shows it taken for all. A waiter
//! that is cancelled, or whose attempt answers nothing (a grant of a shared kind, a
//! reader giving way to an earlier writer, an error), hands the turn on.
//!
//! Waiters of other processes still each try on the wake-up (each process has a turnstile
//! of its own; the kernel decides between them).
//!
//! Kept in this crate rather than lock-core: what answers a wake-up is the directory
//! watch's order of inotify events ([`crate::wakeup`]) and what a refused `flock` proves
//! for a class of kinds. The other backends' waiters queue on their server (ZooKeeper and
//! etcd wake only the next in line; Redis waiters are woken per release message and
//! re-try a script that grants the head of the queue), so they share no such notion.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use lock_core::raw::backend::HoldKind;
use lock_core::raw::plumbing::lock_unpoisoned;
use tokio::sync::Notify;

/// Kinds that the same refusal refuses: a refused exclusive `flock` (the lock file held)
/// refuses every exclusive waiter, a refused shared one every reader, a semaphore whose
/// slots are all taken every permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Exclusive = 0,
    Shared = 1,
    Permit = 2,
}

impl Class {
    pub(crate) fn of(kind: &HoldKind) -> Self {
        match kind {
            HoldKind::Read | HoldKind::Upgradeable => Class::Shared,
            HoldKind::Permit { .. } => Class::Permit,
            _ => Class::Exclusive,
        }
    }
}

/// What an attempt showed to the waiters woken before it began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing: the others may still get in (a shared grant, giving way, an error).
    Nothing,
    /// The kernel refused the `flock`s: so it would every waiter of the class.
    Refused,
    /// An exclusive grant: every waiter would be refused.
    HeldExclusively,
}

#[derive(Debug, Default)]
struct Gate {
    trying: bool,
    /// By class: the latest wake-up an attempt answered.
    answered: [u64; 3],
}

/// The turnstile of one name.
#[derive(Debug)]
pub(crate) struct Turnstile {
    gate: Mutex<Gate>,
    handed_on: Notify,
    clock: Arc<AtomicU64>,
}

impl Turnstile {
    /// The turn for a waiter of `class` woken at `woke` (a tick of the directory's
    /// clock), once no other waiter of the process tries; `None` when an attempt that
    /// began at or after `woke` answered it.
    pub(crate) async fn turn(self: &Arc<Self>, class: Class, woke: u64) -> Option<Turn> {
        loop {
            let handed_on = self.handed_on.notified();
            tokio::pin!(handed_on);
            handed_on.as_mut().enable();
            {
                let mut gate = lock_unpoisoned(&self.gate);
                if gate.answered[class as usize] >= woke {
                    return None;
                }
                if !gate.trying {
                    gate.trying = true;
                    return Some(Turn {
                        turnstile: Arc::clone(self),
                        class,
                        began: self.clock.load(Ordering::SeqCst),
                        answer: Answer::Nothing,
                    });
                }
            }
            handed_on.await;
        }
    }
}

/// The name's turn: one attempt, begun after every wake-up up to [`Turn::began`].
/// Dropping it (at once when the attempt is cancelled) hands the turn on.
#[derive(Debug)]
pub(crate) struct Turn {
    turnstile: Arc<Turnstile>,
    class: Class,
    began: u64,
    answer: Answer,
}

impl Turn {
    /// Records what the attempt showed; the turn is handed on when it drops.
    pub(crate) fn answers(&mut self, answer: Answer) {
        self.answer = answer;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut gate = lock_unpoisoned(&self.turnstile.gate);
        gate.trying = false;
        let class = self.class as usize;
        let classes = match self.answer {
            Answer::Nothing => 0..0,
            Answer::Refused => class..class + 1,
            Answer::HeldExclusively => 0..gate.answered.len(),
        };
        for class in classes {
            gate.answered[class] = gate.answered[class].max(self.began);
        }
        drop(gate);
        self.turnstile.handed_on.notify_waiters();
    }
}

/// The turnstiles of a directory's names in this process.
#[derive(Debug, Default)]
pub(crate) struct Turnstiles {
    by_stem: HashMap<String, Weak<Turnstile>>,
    prune_at: usize,
}

impl Turnstiles {
    /// The turnstile of `stem`, shared with the process's other waiters of it.
    pub(crate) fn of(&mut self, stem: &str, clock: &Arc<AtomicU64>) -> Arc<Turnstile> {
        if let Some(shared) = self.by_stem.get(stem).and_then(Weak::upgrade) {
            return shared;
        }
        if self.by_stem.len() >= self.prune_at {
            self.by_stem
                .retain(|_, turnstile| turnstile.strong_count() > 0);
            self.prune_at = (2 * self.by_stem.len()).max(64);
        }
        let made = Arc::new(Turnstile {
            gate: Mutex::default(),
            handed_on: Notify::new(),
            clock: Arc::clone(clock),
        });
        self.by_stem.insert(stem.to_owned(), Arc::downgrade(&made));
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turnstile() -> (Arc<Turnstile>, Arc<AtomicU64>) {
        let clock = Arc::new(AtomicU64::new(0));
        (Turnstiles::default().of("name", &clock), clock)
    }

    /// A waiter woken while another tries gets the turn once that one is dropped
    /// (cancelled) without an answer; a refusal that began after its wake-up answers it.
    #[tokio::test]
    async fn a_dropped_turn_hands_on_and_a_later_refusal_answers() {
        let (turnstile, clock) = turnstile();
        clock.store(5, Ordering::SeqCst);
        let trying = turnstile.turn(Class::Exclusive, 5).await.expect("free");
        let waiting = tokio::spawn({
            let turnstile = Arc::clone(&turnstile);
            async move { turnstile.turn(Class::Exclusive, 5).await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one attempt at a time");
        drop(trying);
        assert!(
            waiting.await.expect("task"),
            "the cancelled turn was handed on"
        );

        clock.store(6, Ordering::SeqCst);
        let mut refused = turnstile.turn(Class::Exclusive, 6).await.expect("free");
        refused.answers(Answer::Refused);
        drop(refused);
        assert!(turnstile.turn(Class::Exclusive, 5).await.is_none());
        assert!(
            turnstile.turn(Class::Shared, 5).await.is_some(),
            "other class"
        );
        assert!(
            turnstile.turn(Class::Exclusive, 7).await.is_some(),
            "woken later"
        );
    }
}
