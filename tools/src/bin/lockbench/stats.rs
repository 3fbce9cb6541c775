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

/// The median of `values` (the mean of the middle two for an even count), if any.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// Field-by-field medians of the summaries present (one per run).
pub(crate) fn median_summary(runs: impl IntoIterator<Item = Option<Summary>>) -> Option<Summary> {
    let runs: Vec<Summary> = runs.into_iter().flatten().collect();
    let of = |pick: fn(&Summary) -> f64| median(runs.iter().map(pick));
    let mut counts: Vec<u64> = runs.iter().map(|s| s.count).collect();
    counts.sort_unstable();
    Some(Summary {
        // The middle count (the upper one of two).
        count: *counts.get(counts.len() / 2)?,
        p50_us: of(|s| s.p50_us)?,
        p99_us: of(|s| s.p99_us)?,
        p999_us: of(|s| s.p999_us)?,
        max_us: of(|s| s.max_us)?,
        mean_us: of(|s| s.mean_us)?,
    })
}

/// Formats a rate or count with thousands separators: `32,337`.
pub(crate) fn fmt_count(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([f64::NAN]), None);
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(super::fmt_count(5.4), "5");
        assert_eq!(super::fmt_count(999.0), "999");
        assert_eq!(super::fmt_count(32_337.2), "32,337");
        assert_eq!(super::fmt_count(1_234_567.0), "1,234,567");
    }
}
