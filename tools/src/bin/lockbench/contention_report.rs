//! The report's section on the contended workloads: the throughput grid (clients × lock
//! names), the queue-length sweep on one name, and the errors they counted.

use std::fmt::Write as _;

use crate::report::{cell, Report, SWEEP_SVG};
use crate::stats::fmt_count;

impl Report {
    pub(crate) fn throughput_md(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "\n## Throughput: C clients (one connection each) over L lock names\n"
        );
        let _ = writeln!(
            md,
            "| backend | C | L | cycles/s (runs) | cycle p50 | cycle p99 | errors (all runs) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.backends {
            for &clients in &self.throughput_clients {
                for &locks in &self.throughput_locks {
                    let cycle = b.summary_of(|r| r.contention(clients, locks)?.run.cycle);
                    let _ = writeln!(
                        md,
                        "| {} | {clients} | {locks} | {} | {} | {} | {} |",
                        b.backend,
                        b.spread(|r| Some(r.contention(clients, locks)?.run.cycles_per_sec))
                            .show(fmt_count),
                        cell(cycle, |s| s.p50_us),
                        cell(cycle, |s| s.p99_us),
                        b.contention_errors(clients, locks).0,
                    );
                }
            }
        }
    }

    pub(crate) fn sweep_md(&self, md: &mut String) {
        if self.sweep.is_empty() {
            return;
        }
        let _ = writeln!(md, "\n## Queue length: N contenders on one lock name\n");
        let _ = writeln!(
            md,
            "Each contender is a client with its own connection. Cells: cycles/s · cycle \
             p99 (medians). Waits still pending when the measurement ends are cut and not \
             counted.\n\n![cycles/s and p99 by queue length]({SWEEP_SVG})\n"
        );
        let header: Vec<String> = self.sweep.iter().map(|n| format!("N = {n}")).collect();
        let _ = writeln!(md, "| backend | {} |", header.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(self.sweep.len()));
        for b in &self.backends {
            let cells: Vec<String> = self
                .sweep
                .iter()
                .map(|&n| {
                    let rate = b.median_of(|r| Some(r.contention(n, 1)?.run.cycles_per_sec));
                    let p99 = b.summary_of(|r| r.contention(n, 1)?.run.cycle);
                    match rate {
                        Some(rate) => {
                            format!("{}/s · {}", fmt_count(rate), cell(p99, |s| s.p99_us))
                        }
                        None => "–".into(),
                    }
                })
                .collect();
            let _ = writeln!(md, "| {} | {} |", b.backend, cells.join(" | "));
        }
    }

    /// Contended rows that saw errors, with the first error of each.
    pub(crate) fn errors_md(&self, md: &mut String) {
        let mut shapes: Vec<(usize, usize)> = self.sweep.iter().map(|&n| (n, 1)).collect();
        for &clients in &self.throughput_clients {
            for &locks in &self.throughput_locks {
                shapes.push((clients, locks));
            }
        }
        shapes.sort_unstable();
        shapes.dedup();
        let mut lines = Vec::new();
        for b in &self.backends {
            for &(clients, locks) in &shapes {
                if let (count @ 1.., first) = b.contention_errors(clients, locks) {
                    lines.push(format!(
                        "- {}, {clients} clients on {locks} names: {count} errors over the runs; first: {}",
                        b.backend,
                        first.unwrap_or("?")
                    ));
                }
            }
        }
        if !lines.is_empty() {
            let _ = writeln!(
                md,
                "\nErrors in the contended workloads (counted; the workload carried on):\n"
            );
            for line in lines {
                let _ = writeln!(md, "{line}");
            }
        }
    }
}
