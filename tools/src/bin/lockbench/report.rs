//! The Markdown page for people, where every figure is the median over the runs of what
//! `results.rs` holds.
//!
//! Its sections on the contended workloads and on leader election are in
//! `contention_report.rs` and `election_report.rs`, like `primitives_report.rs`.

use std::fmt::Write as _;
use std::path::Path;

use crate::results::{cell, fmt_ratio, Report, RunReport, SWEEP_SVG};
use crate::stats::fmt_us;
use crate::Flavour;

impl Report {
    pub(crate) fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# lockbench report\n");
        let _ = writeln!(
            md,
            "Machine: {}. Started {}; the whole benchmark took {:.0} s. {} run{} of every \
             workload; warm-up {:.1} s, then {:.1} s per measurement. Latencies are \
             client-observed on loopback.\n\n\
             Every figure is the **median over the runs** of that figure (min–max of the \
             runs in brackets where it helps). A ratio is computed **within each run** — the \
             library against the raw floor measured in the same run on the same runtime, \
             one backend against another in the same pass — and then its median is taken. \
             Takeover, election failover and renewal are measured once. report.json keeps \
             every run.\n",
            self.machine,
            self.started,
            self.elapsed_s,
            self.runs,
            if self.runs == 1 { "" } else { "s" },
            self.warmup_s,
            self.duration_s
        );
        for (backend, why) in &self.skipped {
            let _ = writeln!(md, "- **{backend} skipped**: {why}");
        }
        if !self.skipped.is_empty() {
            md.push('\n');
        }
        self.goals_md(&mut md);
        self.uncontended_md(&mut md);
        self.handoff_md(&mut md);
        self.throughput_md(&mut md);
        self.sweep_md(&mut md);
        self.dual_md(&mut md);
        self.errors_md(&mut md);
        self.once_md(&mut md);
        self.election_md(&mut md);
        crate::primitives_report::markdown(self, &mut md);
        let notes: Vec<String> = self
            .backends
            .iter()
            .flat_map(|b| b.notes.iter().map(move |n| format!("- {}: {n}", b.backend)))
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(md, "\n## Notes\n");
            for note in notes {
                let _ = writeln!(md, "{note}");
            }
        }
        md
    }

    fn goals_md(&self, md: &mut String) {
        if self.goals.is_empty() {
            return;
        }
        let _ = writeln!(md, "## Targets\n");
        let _ = writeln!(md, "| target | measured | goal | |");
        let _ = writeln!(md, "|---|---|---|---|");
        for goal in &self.goals {
            let mark = match goal.pass {
                Some(true) => "pass",
                Some(false) => "**miss**",
                None => "not measured",
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {mark} |",
                goal.target, goal.shown, goal.goal
            );
        }
        md.push('\n');
    }

    fn uncontended_md(&self, md: &mut String) {
        let _ = writeln!(md, "## Uncontended acquire + release (one client)\n");
        let _ = writeln!(
            md,
            "Library and raw floor run on the same runtime, taking turns in four slices of \
             the measurement.\n"
        );
        let _ = writeln!(
            md,
            "| backend | runtime | p50 | p99 | p99.9 | max | raw floor p50 | ratio (runs) | floor |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        for b in &self.backends {
            for runtime in Flavour::ALL {
                let library = b.summary_of(|r| r.uncontended_on(runtime)?.library);
                let floor = b.summary_of(|r| r.uncontended_on(runtime)?.floor_cycle);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    b.backend,
                    runtime.label(),
                    cell(library, |s| s.p50_us),
                    cell(library, |s| s.p99_us),
                    cell(library, |s| s.p999_us),
                    cell(library, |s| s.max_us),
                    cell(floor, |s| s.p50_us),
                    b.spread(|r| r.uncontended_ratio(runtime)).show(fmt_ratio),
                    b.floor.as_deref().unwrap_or("none (baseline)"),
                );
            }
        }
    }

    fn handoff_md(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "\n## Hand-off: release sent → next waiter holds the lock\n"
        );
        let _ = writeln!(
            md,
            "The raw hand-off is the floor's: a raw waiter queued behind a raw hold, woken by \
             the server's push (Redis: a message the release script publishes; ZooKeeper: the \
             watch on the holder's node, then a listing; etcd: a watch on the key's delete, \
             then a put-if-absent; PostgreSQL: a NOTIFY the release statement sends, on the \
             waiter's LISTEN connection, then the upsert), until it holds.\n"
        );
        let _ = writeln!(
            md,
            "| backend | waiters | p50 | p99 | p99.9 | max | raw hand-off p50 | raw hand-off p99 | raw acquire + release p50 | ratio (runs) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for b in &self.backends {
            let handoff = b.summary_of(|r| r.handoff);
            let raw = b.summary_of(|r| r.handoff_floor);
            let floor = b.median_of(|r| r.uncontended_on(Flavour::MultiThread)?.handoff_floor_us());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                b.backend,
                b.handoff_waiters,
                cell(handoff, |s| s.p50_us),
                cell(handoff, |s| s.p99_us),
                cell(handoff, |s| s.p999_us),
                cell(handoff, |s| s.max_us),
                cell(raw, |s| s.p50_us),
                cell(raw, |s| s.p99_us),
                floor.map_or_else(|| "–".into(), fmt_us),
                b.spread(RunReport::handoff_ratio).show(fmt_ratio),
            );
        }
    }

    fn once_md(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "\n## Takeover after the holder process is killed (SIGKILL)\n"
        );
        let _ = writeln!(md, "| backend | TTL | takeover per round |");
        let _ = writeln!(md, "|---|---|---|");
        for b in &self.backends {
            if let Some(t) = &b.takeover {
                let rounds: Vec<String> = t
                    .takeover_ms
                    .iter()
                    .map(|ms| format!("{ms:.0} ms"))
                    .collect();
                let _ = writeln!(
                    md,
                    "| {} | {:.0} ms | {} |",
                    b.backend,
                    t.ttl_ms,
                    rounds.join(", ")
                );
            }
        }
        let _ = writeln!(md, "\n## Renewal: one client holding K locks\n");
        let _ = writeln!(
            md,
            "| backend | K | TTL | server requests per renewal interval | renewal round trip p50 / max | client bytes per held lock | still held |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.backends {
            for row in &b.renewal {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.0} ms | {} | {} | {} | {}/{} |",
                    b.backend,
                    row.held_locks,
                    row.ttl_ms,
                    row.requests_per_interval
                        .map_or_else(|| "–".into(), |r| format!("{r:.1}")),
                    row.round_trip.map_or_else(
                        || "–".into(),
                        |s| format!("{} / {}", fmt_us(s.p50_us), fmt_us(s.max_us))
                    ),
                    row.bytes_per_lock
                        .map_or_else(|| "–".into(), |r| format!("{r:.0}")),
                    row.still_held,
                    row.held_locks
                );
            }
        }
    }

    /// Writes `report.md`, `report.json`, `latency.svg` and the queue-length chart into `dir`.
    pub(crate) fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)?;
        std::fs::write(dir.join("latency.svg"), crate::svg::latency(self))?;
        std::fs::write(dir.join(SWEEP_SVG), crate::svg::sweep(self))?;
        Ok(())
    }
}
