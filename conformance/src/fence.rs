//! A fenced resource: accepts a write only with a fencing token at least as high as every
//! token it accepted before, and records each accepted critical section on the monotonic
//! clock so a checker can prove that no two overlapped and no token went backwards.

use lock_core::FencingToken;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

/// One accepted critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// The fencing token it was accepted with.
    pub token: u64,
    /// When it was accepted.
    pub start: Instant,
    /// When it ended (`None` while open).
    pub end: Option<Instant>,
}

/// A write rejected because its token is lower than one already accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {offered}: the resource has accepted {highest}")]
pub struct StaleToken {
    /// The token offered.
    pub offered: u64,
    /// The highest token accepted so far.
    pub highest: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    highest: Option<u64>,
    sections: Vec<Section>,
    rejected: usize,
}

/// The resource a lock protects, shared by every contender of a test.
#[derive(Debug, Clone, Default)]
pub struct FencedResource {
    ledger: Arc<Mutex<Ledger>>,
}

/// An open critical section; [`SectionHandle::end`] closes it.
#[derive(Debug)]
#[must_use = "end the section to record when it finished"]
pub struct SectionHandle {
    ledger: Arc<Mutex<Ledger>>,
    index: usize,
}

impl SectionHandle {
    /// Records the end of the section.
    pub fn end(self) {
        let mut ledger = lock(&self.ledger);
        if let Some(section) = ledger.sections.get_mut(self.index) {
            section.end = Some(Instant::now());
        }
    }
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

impl FencedResource {
    /// A fresh resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a critical section with `token`, or rejects a stale token.
    ///
    /// # Errors
    /// [`StaleToken`] if a higher token was accepted before.
    pub fn begin(&self, token: FencingToken) -> Result<SectionHandle, StaleToken> {
        let mut ledger = lock(&self.ledger);
        if let Some(highest) = ledger.highest {
            if token.get() < highest {
                ledger.rejected += 1;
                return Err(StaleToken {
                    offered: token.get(),
                    highest,
                });
            }
        }
        ledger.highest = Some(token.get());
        ledger.sections.push(Section {
            token: token.get(),
            start: Instant::now(),
            end: None,
        });
        Ok(SectionHandle {
            ledger: Arc::clone(&self.ledger),
            index: ledger.sections.len() - 1,
        })
    }

    /// Checks the history and reports what it found.
    pub fn check(&self) -> FenceReport {
        let ledger = lock(&self.ledger);
        let mut sections = ledger.sections.clone();
        sections.sort_by_key(|s| s.start);
        let mut overlaps = Vec::new();
        let mut tokens_backwards = Vec::new();
        let mut open_sections = 0;
        for pair in sections.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            match a.end {
                Some(end) if end <= b.start => {}
                _ => overlaps.push((a, b)),
            }
            if b.token < a.token {
                tokens_backwards.push((a.token, b.token));
            }
        }
        for s in &sections {
            if s.end.is_none() {
                open_sections += 1;
            }
        }
        FenceReport {
            accepted: sections.len(),
            rejected_stale: ledger.rejected,
            overlaps,
            tokens_backwards,
            open_sections,
        }
    }
}

/// What [`FencedResource::check`] found.
#[derive(Debug, Clone)]
pub struct FenceReport {
    /// Critical sections accepted.
    pub accepted: usize,
    /// Writes rejected for a stale token.
    pub rejected_stale: usize,
    /// Pairs of accepted sections that overlapped in time.
    pub overlaps: Vec<(Section, Section)>,
    /// Consecutive accepted sections whose token went down.
    pub tokens_backwards: Vec<(u64, u64)>,
    /// Sections never ended.
    pub open_sections: usize,
}

impl FenceReport {
    /// Whether no accepted sections overlapped and no token went backwards.
    pub fn is_safe(&self) -> bool {
        self.overlaps.is_empty() && self.tokens_backwards.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_overlap_and_rejects_stale_tokens() {
        let resource = FencedResource::new();
        let a = resource.begin(FencingToken(1)).unwrap();
        let b = resource.begin(FencingToken(2)).unwrap();
        assert_eq!(
            resource.begin(FencingToken(1)).unwrap_err(),
            StaleToken {
                offered: 1,
                highest: 2
            }
        );
        b.end();
        a.end();
        let report = resource.check();
        assert_eq!(report.accepted, 2);
        assert_eq!(report.rejected_stale, 1);
        assert_eq!(report.overlaps.len(), 1);
        assert!(!report.is_safe());
    }

    #[test]
    fn sequential_sections_are_safe() {
        let resource = FencedResource::new();
        for token in [3, 3, 5] {
            resource.begin(FencingToken(token)).unwrap().end();
        }
        let report = resource.check();
        assert!(report.is_safe(), "{report:?}");
        assert_eq!(report.open_sections, 0);
    }
}
