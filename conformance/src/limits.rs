//! A checker for primitives that grant several holds at once: a semaphore's permits, a
//! read-write lock's readers. Each holder records the span it was inside, on the
//! monotonic clock, while its guard vouched for its hold; [`HoldLog::check`] then finds
//! the most holders inside at once (a hold of several permits counts as that many) and
//! any writer (an exclusive hold) beside anyone, or two upgradeable readers side by
//! side, and [`HoldLog::beyond`] the moments more were inside than a limit that changes
//! over time (a semaphore resized).
//!
//! A fenced resource ([`crate::FencedResource`]) cannot judge these: holders of one
//! semaphore hold side by side with different fencing tokens, so no single "highest
//! token" orders their writes.

use std::future::Future;
use std::sync::{Arc, Mutex};

use lock_core::LockGuard;
use tokio::time::Instant;

/// One holder's time inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Whether the hold was exclusive (a writer).
    pub exclusive: bool,
    /// Whether the hold was an upgradeable reader's (from its grant to the release of the
    /// writer it became, if it did): beside readers, beside no other such span.
    pub upgradeable: bool,
    /// How many places it took: its permits, 1 for any other hold.
    pub weight: u32,
    /// When it went in.
    pub start: Instant,
    /// When it came out, or its validity deadline if that came first.
    pub end: Instant,
}

/// What [`HoldLog::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitReport {
    /// Spans recorded.
    pub spans: usize,
    /// The most holders inside at one moment (a hold of several permits counts as that
    /// many).
    pub most_at_once: usize,
    /// Pairs of spans where an exclusive hold overlapped another hold, or two upgradeable
    /// ones overlapped.
    pub exclusive_overlaps: Vec<(Span, Span)>,
    /// Spans whose guard no longer vouched for the hold when it came out.
    pub unvouched: usize,
}

/// The spans of every holder of one test, shared by its tasks.
#[derive(Debug, Clone, Default)]
pub struct HoldLog {
    spans: Arc<Mutex<Vec<Span>>>,
    unvouched: Arc<Mutex<Vec<Instant>>>,
}

impl HoldLog {
    /// An empty log.
    pub fn new() -> Self {
        HoldLog::default()
    }

    /// Runs `work` inside, as the holder of `guard` (`exclusive` for a writer), and
    /// records the span: from now until `work` ends, cut at the guard's validity deadline;
    /// a guard that no longer vouches at the end is counted as unvouched.
    pub async fn inside<T>(
        &self,
        guard: &LockGuard,
        exclusive: bool,
        work: impl Future<Output = T>,
    ) -> T {
        self.spend(guard, exclusive, 1, work).await
    }

    /// As [`HoldLog::inside`], for a hold of `permits` permits: it counts as that many.
    pub async fn inside_many<T>(
        &self,
        guard: &LockGuard,
        permits: u32,
        work: impl Future<Output = T>,
    ) -> T {
        self.spend(guard, false, permits, work).await
    }

    async fn spend<T>(
        &self,
        guard: &LockGuard,
        exclusive: bool,
        weight: u32,
        work: impl Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = work.await;
        self.record(guard, start, exclusive, false, weight);
        out
    }

    /// Records the span of an upgradeable reader's hold, from `start` (its grant) until
    /// now, `guard` being the writer it has just become (or still the reader): no writer
    /// and no other upgradeable reader may be beside it, the wait of the upgrade included.
    /// The writer's own span, recorded next by [`HoldLog::inside`], follows it without a
    /// gap.
    pub fn upgradeable_since(&self, guard: &LockGuard, start: Instant) {
        self.record(guard, start, false, true, 1);
    }

    fn record(
        &self,
        guard: &LockGuard,
        start: Instant,
        exclusive: bool,
        upgradeable: bool,
        weight: u32,
    ) {
        let end = Instant::now().min(guard.valid_until());
        let vouched = guard.is_held();
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        spans.push(Span {
            exclusive,
            upgradeable,
            weight,
            start,
            // A guard that stopped vouching claims nothing past its start.
            end: if vouched { end } else { start },
        });
        if !vouched {
            self.unvouched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(start);
        }
    }

    /// The spans' starts and ends as events (+weight, -weight) in time order, ends
    /// before starts at the same instant: touching spans do not overlap.
    fn events(spans: &[Span]) -> Vec<(Instant, i64)> {
        let mut events: Vec<(Instant, i64)> = Vec::with_capacity(spans.len() * 2);
        for span in spans {
            events.push((span.start, i64::from(span.weight)));
            events.push((span.end, -i64::from(span.weight)));
        }
        events.sort();
        events
    }

    /// The moments at which more were inside than `limit` allowed then, with how many
    /// were: a semaphore's number over time, across a resize. Looked at every start of
    /// a span and at each of `changes`, where the limit changes.
    pub fn beyond(
        &self,
        limit: impl Fn(Instant) -> usize,
        changes: &[Instant],
    ) -> Vec<(Instant, usize)> {
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut events = Self::events(&spans);
        events.extend(changes.iter().map(|at| (*at, 0)));
        // Ends, then the changes, then the starts of one instant.
        events.sort();
        let mut inside = 0i64;
        let mut beyond = Vec::new();
        for (at, step) in events {
            inside += step;
            let now = usize::try_from(inside).unwrap_or(0);
            if step >= 0 && now > limit(at) {
                beyond.push((at, now));
            }
        }
        beyond
    }

    /// The most holders at once and every exclusive overlap.
    pub fn check(&self) -> LimitReport {
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (mut inside, mut most) = (0i64, 0i64);
        for (_, step) in Self::events(&spans) {
            inside += step;
            most = most.max(inside);
        }
        let overlaps = |a: &Span, b: &Span| a.start < b.end && b.start < a.end;
        let mut exclusive_overlaps = Vec::new();
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                let apart = a.exclusive || b.exclusive || (a.upgradeable && b.upgradeable);
                if apart && overlaps(a, b) {
                    exclusive_overlaps.push((*a, *b));
                }
            }
        }
        LimitReport {
            spans: spans.len(),
            most_at_once: usize::try_from(most).unwrap_or(0),
            exclusive_overlaps,
            unvouched: self
                .unvouched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len(),
        }
    }
}
