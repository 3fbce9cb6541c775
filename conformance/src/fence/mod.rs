//! A fenced resource: the storage a lock protects, as a checker sees it.
//!
//! A holder opens a critical section with its fencing token ([`FencedResource::begin`]),
//! reads the counter, writes it back incremented ([`SectionHandle::write`]) and closes the
//! section. The resource accepts a begin or a write only with a token at least as high as
//! every token it has seen, like storage that checks fencing tokens, and records every
//! section on the monotonic clock. [`FencedResource::check`] then reports overlapping
//! sections, stale writes that were accepted, lost updates and takeover gaps.
//!
//! A section *claims* the lock while its holder is entitled to be inside. A holder that
//! watches its guard ([`FencedResource::hold_section`]) claims it for as long as the guard
//! vouches for the lock (not lost, before its validity deadline), whether or not the fence
//! accepts its write: a newer holder that begins meanwhile turns the older write away, and
//! that is an overlap at the lock even though the resource stayed consistent. A blind
//! section (a paused process that writes without looking, [`SectionHandle::write`]) claims
//! the lock only through an accepted write. Two sections overlap when both claim the lock
//! at the same time.
//!
//! Holders in other processes reach the same resource over loopback TCP through
//! [`FenceServer`], with [`FenceClient`].
//!
//! Layout: this file holds the resource, its ledger and its checker; `remote` its TCP
//! face and client (one line protocol); `tests` the unit tests of both. [`store`] is
//! apart: the checks every [`lock_core::fence::FencedStore`] runs on its real store.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lock_core::{FencingToken, LockGuard};
use tokio::time::Instant;

mod remote;
pub mod store;
#[cfg(test)]
mod tests;

pub use remote::{FenceClient, FenceServer};

/// One critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// The fencing token it was opened with.
    pub token: u64,
    /// When it was opened.
    pub start: Instant,
    /// When its write was accepted, if it was.
    pub written: Option<Instant>,
    /// When it was closed (`None` while open or abandoned).
    pub end: Option<Instant>,
    /// For a holder that watched its guard: until when the guard vouched for the lock
    /// during the section (at most `end`). `None` for a blind section.
    pub held_until: Option<Instant>,
}

impl Section {
    /// Until when the section claims the lock, if it does at all: a watched section while
    /// its guard vouched, a blind one through an accepted write until it closed (or `now`
    /// while open).
    fn claim_until(&self, now: Instant) -> Option<Instant> {
        let until = match self.held_until {
            Some(held) => held,
            None => self.written.map(|_| self.end.unwrap_or(now))?,
        };
        (until >= self.start).then_some(until)
    }
}

/// A begin or write rejected because its token is lower than one already seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}: the resource has seen {highest}")]
pub struct StaleToken {
    /// The token offered.
    pub offered: u64,
    /// The highest token seen so far.
    pub highest: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    highest: Option<u64>,
    sections: Vec<Section>,
    counter: u64,
    writes: u64,
    rejected_begins: usize,
    rejected_writes: usize,
}

impl Ledger {
    fn check_token(&self, token: u64) -> Result<(), StaleToken> {
        match self.highest {
            Some(highest) if token < highest => Err(StaleToken {
                offered: token,
                highest,
            }),
            _ => Ok(()),
        }
    }
}

/// The resource a lock protects, shared by every contender of a test.
#[derive(Debug, Clone, Default)]
pub struct FencedResource {
    ledger: Arc<Mutex<Ledger>>,
}

/// An open critical section.
#[derive(Debug)]
#[must_use = "end the section to record when it finished"]
pub struct SectionHandle {
    ledger: Arc<Mutex<Ledger>>,
    index: usize,
    token: u64,
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

impl SectionHandle {
    /// The counter's current value.
    pub fn read(&self) -> u64 {
        lock(&self.ledger).counter
    }

    /// Writes `value` if this section's token is still the highest seen (a holder that
    /// read, paused and lost its lock to a newer token is turned away here).
    ///
    /// # Errors
    /// [`StaleToken`] when a higher token was seen since the section began.
    pub fn write(&self, value: u64) -> Result<(), StaleToken> {
        let mut ledger = lock(&self.ledger);
        if let Err(stale) = ledger.check_token(self.token) {
            ledger.rejected_writes += 1;
            return Err(stale);
        }
        ledger.counter = value;
        ledger.writes += 1;
        let now = Instant::now();
        if let Some(section) = ledger.sections.get_mut(self.index) {
            section.written = Some(now);
        }
        Ok(())
    }

    /// Records the end of the section.
    pub fn end(self) {
        self.close(None);
    }

    /// Writes `value` as the holder of `guard` and ends the section: the write is made
    /// only if the guard still vouches for the lock (not lost, before its validity
    /// deadline); the section claims the lock until then, or until the guard stopped
    /// vouching. Returns whether a write was made and accepted.
    pub fn finish(self, value: u64, guard: &LockGuard) -> bool {
        let now = Instant::now();
        let vouches = !guard.state().is_lost() && now < guard.valid_until();
        let accepted = vouches && self.write(value).is_ok();
        let held_until = if vouches {
            Instant::now()
        } else {
            now.min(guard.valid_until())
        };
        self.close(Some(held_until));
        accepted
    }

    fn close(self, held_until: Option<Instant>) {
        let mut ledger = lock(&self.ledger);
        if let Some(section) = ledger.sections.get_mut(self.index) {
            let end = Instant::now();
            section.end = Some(end);
            section.held_until = held_until.map(|held| held.min(end));
        }
    }
}

impl FencedResource {
    /// A fresh resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens a critical section with `token`, or rejects a stale token.
    ///
    /// # Errors
    /// [`StaleToken`] if a higher token was seen before.
    pub fn begin(&self, token: FencingToken) -> Result<SectionHandle, StaleToken> {
        let mut ledger = lock(&self.ledger);
        if let Err(stale) = ledger.check_token(token.get()) {
            ledger.rejected_begins += 1;
            return Err(stale);
        }
        ledger.highest = Some(token.get());
        ledger.sections.push(Section {
            token: token.get(),
            start: Instant::now(),
            written: None,
            end: None,
            held_until: None,
        });
        Ok(SectionHandle {
            ledger: Arc::clone(&self.ledger),
            index: ledger.sections.len() - 1,
            token: token.get(),
        })
    }

    /// One full blind critical section: begin, read, `work`, write the incremented value,
    /// end. Returns whether the write was accepted.
    ///
    /// # Errors
    /// [`StaleToken`] when the begin is rejected.
    pub async fn increment<F: std::future::Future<Output = ()>>(
        &self,
        token: FencingToken,
        work: F,
    ) -> Result<bool, StaleToken> {
        let section = self.begin(token)?;
        let seen = section.read();
        work.await;
        let accepted = section.write(seen + 1).is_ok();
        section.end();
        Ok(accepted)
    }

    /// One full critical section of the holder of `guard`: begin with its fencing token,
    /// read, `work` (cut short if the lock is lost), then [`SectionHandle::finish`] with
    /// the incremented value. Returns whether the write was made and accepted.
    ///
    /// # Errors
    /// [`StaleToken`] when the begin is rejected.
    pub async fn hold_section<F: std::future::Future<Output = ()>>(
        &self,
        guard: &LockGuard,
        work: F,
    ) -> Result<bool, StaleToken> {
        let section = self.begin(guard.fencing_token())?;
        let seen = section.read();
        let mut watch = guard.watch();
        tokio::select! {
            () = work => {}
            _ = watch.lost() => {}
        }
        Ok(section.finish(seen + 1, guard))
    }

    /// Every section so far, in the order they began.
    pub fn sections(&self) -> Vec<Section> {
        lock(&self.ledger).sections.clone()
    }

    /// Checks the history and reports what it found.
    pub fn check(&self) -> FenceReport {
        let ledger = lock(&self.ledger);
        let mut sections = ledger.sections.clone();
        sections.sort_by_key(|s| s.start);
        let accepted: Vec<&Section> = sections.iter().filter(|s| s.written.is_some()).collect();
        let now = Instant::now();
        let claiming: Vec<(&Section, Instant)> = sections
            .iter()
            .filter_map(|s| Some((s, s.claim_until(now)?)))
            .collect();
        let mut overlaps = Vec::new();
        let mut tokens_backwards = Vec::new();
        let mut gaps = Vec::new();
        for (i, (a, a_until)) in claiming.iter().enumerate() {
            for (b, _) in &claiming[i + 1..] {
                // Sorted by start: b began after a; they overlap if b began while a
                // still claimed the lock.
                if b.start < *a_until {
                    overlaps.push((**a, **b));
                } else {
                    break;
                }
            }
        }
        for pair in accepted.windows(2) {
            if pair[1].token < pair[0].token {
                tokens_backwards.push((pair[0].token, pair[1].token));
            }
            if let Some(end) = pair[0].end {
                gaps.push(pair[1].start.saturating_duration_since(end));
            }
        }
        FenceReport {
            sections: sections.len(),
            accepted_writes: ledger.writes,
            counter: ledger.counter,
            rejected_begins: ledger.rejected_begins,
            rejected_writes: ledger.rejected_writes,
            overlaps,
            tokens_backwards,
            open_sections: sections.iter().filter(|s| s.end.is_none()).count(),
            gaps,
        }
    }
}

/// What [`FencedResource::check`] found.
#[derive(Debug, Clone)]
pub struct FenceReport {
    /// Critical sections opened.
    pub sections: usize,
    /// Writes accepted.
    pub accepted_writes: u64,
    /// Final counter value: equals `accepted_writes` unless updates were lost.
    pub counter: u64,
    /// Begins rejected for a stale token.
    pub rejected_begins: usize,
    /// Writes rejected for a stale token (a holder that lost its lock and came back).
    /// No stale write is ever accepted: the fence checks every write.
    pub rejected_writes: usize,
    /// Pairs of sections that claimed the lock at the same time (see the module docs).
    pub overlaps: Vec<(Section, Section)>,
    /// Consecutive accepted sections whose token went down.
    pub tokens_backwards: Vec<(u64, u64)>,
    /// Sections never closed (a crashed or cancelled holder).
    pub open_sections: usize,
    /// Time from the end of one accepted section to the start of the next.
    pub gaps: Vec<Duration>,
}

impl FenceReport {
    /// Updates lost by overlapping read-modify-write cycles.
    pub fn lost_updates(&self) -> u64 {
        self.accepted_writes.saturating_sub(self.counter)
    }

    /// No overlapping accepted sections, no lost update, no token going backwards.
    pub fn is_safe(&self) -> bool {
        self.overlaps.is_empty() && self.tokens_backwards.is_empty() && self.lost_updates() == 0
    }
}
