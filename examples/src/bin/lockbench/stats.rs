//! Latency histograms and their summaries.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// A latency histogram in nanoseconds, 1 µs to 100 s, 3 significant digits.
#[derive(Debug, Clone)]
pub(crate) struct Latencies(Histogram<u64>);

impl Latencies {
    pub(crate) fn new() -> Self {
        Latencies(Histogram::new_with_bounds(1_000, 100_000_000_000, 3).expect("valid bounds"))
    }

    pub(crate) fn record(&mut self, value: Duration) {
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        self.0.saturating_record(nanos.max(1_000));
    }

    pub(crate) fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    pub(crate) fn summary(&self) -> Option<Summary> {
        if self.0.is_empty() {
            return None;
        }
        let us = |nanos: u64| nanos as f64 / 1_000.0;
        Some(Summary {
            count: self.0.len(),
            p50_us: us(self.0.value_at_quantile(0.50)),
            p99_us: us(self.0.value_at_quantile(0.99)),
            p999_us: us(self.0.value_at_quantile(0.999)),
            max_us: us(self.0.max()),
            mean_us: self.0.mean() / 1_000.0,
        })
    }
}

/// Percentiles of one latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Summary {
    pub(crate) count: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) mean_us: f64,
}

/// Formats microseconds for a table: `412 µs`, `1.23 ms`, `2.5 s`.
pub(crate) fn fmt_us(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1_000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}
