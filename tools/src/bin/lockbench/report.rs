//! The report: what each run measured (kept run by run in the JSON), and the Markdown page
//! for people, where every figure is the median over the runs.
//!
//! Its sections on the contended workloads and on leader election are in
//! `contention_report.rs` and `election_report.rs`, like `primitives_report.rs`.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::contention::{ContentionRow, LoopRun};
use crate::election::{CampaignRun, NotifyRun};
use crate::goals::GoalRow;
use crate::primitives::{Primitive, PrimitivesRun};
use crate::stats::{fmt_us, median, median_summary, Summary};
use crate::workloads::{RenewalRow, Takeover};
use crate::Flavour;

/// Workload 1 of one run on one runtime flavour: library and floor side by side.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct UncontendedRun {
    pub(crate) runtime: Flavour,
    pub(crate) library: Option<Summary>,
    pub(crate) floor_cycle: Option<Summary>,
    pub(crate) floor_acquire: Option<Summary>,
    pub(crate) floor_release: Option<Summary>,
}

impl UncontendedRun {
    /// Library p50 against the floor's p50 of the same run and runtime.
    fn ratio(&self) -> Option<f64> {
        Some(self.library?.p50_us / self.floor_cycle?.p50_us)
    }

    /// Raw acquire p50 + raw release p50: the floor of a hand-off.
    fn handoff_floor_us(&self) -> Option<f64> {
        Some(self.floor_acquire?.p50_us + self.floor_release?.p50_us)
    }
}

/// Everything one run measured on one backend.
#[derive(Debug, Default, Serialize)]
pub(crate) struct RunReport {
    pub(crate) uncontended: Vec<UncontendedRun>,
    pub(crate) handoff: Option<Summary>,
    /// Raw hand-offs on the floor, a raw waiter woken by the server's push (none where the
    /// floor has no push of its own).
    pub(crate) handoff_floor: Option<Summary>,
    /// The throughput grid and the queue-length sweep; a (C, L) pair both ask for is
    /// measured once.
    pub(crate) contention: Vec<ContentionRow>,
    /// The uncontended campaign (none without elections).
    pub(crate) campaign: Option<CampaignRun>,
    /// Observers following hand-overs of leadership (none without elections).
    pub(crate) notify: Option<NotifyRun>,
    /// Semaphore, read-write lock and multi-lock workloads.
    pub(crate) primitives: PrimitivesRun,
}

impl RunReport {
    /// Workload 1 of this run on `runtime`.
    pub(crate) fn uncontended_on(&self, runtime: Flavour) -> Option<&UncontendedRun> {
        self.uncontended.iter().find(|u| u.runtime == runtime)
    }

    /// The row of `clients` clients over `locks` names.
    pub(crate) fn contention(&self, clients: usize, locks: usize) -> Option<&ContentionRow> {
        self.contention
            .iter()
            .find(|r| r.run.clients == clients && r.locks == locks)
    }

    /// Library p50 against the floor p50, both measured in this run on `runtime`.
    pub(crate) fn uncontended_ratio(&self, runtime: Flavour) -> Option<f64> {
        self.uncontended_on(runtime)?.ratio()
    }

    /// Hand-off p50 against raw acquire + raw release p50 of this run (both on the
    /// multi-thread runtime, where the hand-off runs).
    pub(crate) fn handoff_ratio(&self) -> Option<f64> {
        Some(
            self.handoff?.p50_us
                / self
                    .uncontended_on(Flavour::MultiThread)?
                    .handoff_floor_us()?,
        )
    }

    /// Campaign + resign p50 against the uncontended lock's acquire + release p50 of this
    /// run (both on the multi-thread runtime).
    pub(crate) fn campaign_ratio(&self) -> Option<f64> {
        Some(
            self.campaign.as_ref()?.cycle?.p50_us
                / self.uncontended_on(Flavour::MultiThread)?.library?.p50_us,
        )
    }
}

/// Everything measured for one backend.
#[derive(Debug, Default, Serialize)]
pub(crate) struct BackendReport {
    pub(crate) backend: String,
    pub(crate) floor: Option<String>,
    pub(crate) handoff_waiters: usize,
    /// One entry per run, in order.
    pub(crate) runs: Vec<RunReport>,
    /// Measured once (its rounds are listed one by one).
    pub(crate) takeover: Option<Takeover>,
    /// Measured once.
    pub(crate) renewal: Vec<RenewalRow>,
    /// Whether the backend grants election candidates; without, the election rows say so.
    pub(crate) elections: bool,
    /// Observers of the notification workload.
    pub(crate) observers: usize,
    /// Whether the backend grants semaphore permits; without, the semaphore row says so.
    pub(crate) semaphores: bool,
    /// Whether it grants read-write locks; without, the read-write row says so.
    pub(crate) rwlocks: bool,
    /// Failover after a killed leader, measured once (its rounds are listed one by one).
    pub(crate) failover: Option<Takeover>,
    pub(crate) notes: Vec<String>,
}

impl BackendReport {
    /// The median over the runs of a per-run figure.
    pub(crate) fn median_of(&self, per_run: impl Fn(&RunReport) -> Option<f64>) -> Option<f64> {
        median(self.runs.iter().filter_map(per_run))
    }

    /// Per-run figures, their median, and their spread when there are several.
    pub(crate) fn spread(&self, per_run: impl Fn(&RunReport) -> Option<f64>) -> Spread {
        Spread(self.runs.iter().filter_map(per_run).collect())
    }

    pub(crate) fn summary_of(
        &self,
        per_run: impl Fn(&RunReport) -> Option<Summary>,
    ) -> Option<Summary> {
        median_summary(self.runs.iter().map(per_run))
    }

    /// Errors of the (C, L) row summed over the runs, with the first one seen.
    pub(crate) fn contention_errors(&self, clients: usize, locks: usize) -> (u64, Option<&str>) {
        self.loop_errors(|r| Some(&r.contention(clients, locks)?.run))
    }

    /// Errors of a contended row (`pick`ed from each run) summed over the runs, with the
    /// first one seen.
    pub(crate) fn loop_errors<'a>(
        &'a self,
        pick: impl Fn(&'a RunReport) -> Option<&'a LoopRun>,
    ) -> (u64, Option<&'a str>) {
        self.runs
            .iter()
            .filter_map(pick)
            .fold((0, None), |(n, first), row| {
                (n + row.errors, first.or(row.first_error.as_deref()))
            })
    }
}

/// One figure over the runs.
pub(crate) struct Spread(pub(crate) Vec<f64>);

impl Spread {
    /// `median` alone for one run, `median (min–max)` for several.
    pub(crate) fn show(&self, fmt: fn(f64) -> String) -> String {
        let Some(mid) = median(self.0.iter().copied()) else {
            return "–".into();
        };
        if self.0.len() < 2 {
            return fmt(mid);
        }
        let lo = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{} ({}–{})", fmt(mid), fmt(lo), fmt(hi))
    }
}

/// The whole run.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) machine: String,
    pub(crate) started: String,
    pub(crate) runs: usize,
    pub(crate) warmup_s: f64,
    pub(crate) duration_s: f64,
    /// Wall time of the whole benchmark, servers included.
    pub(crate) elapsed_s: f64,
    pub(crate) throughput_clients: Vec<usize>,
    pub(crate) throughput_locks: Vec<usize>,
    pub(crate) sweep: Vec<usize>,
    /// The semaphore, read-write lock and multi-lock workloads run.
    pub(crate) primitives: Vec<Primitive>,
    pub(crate) backends: Vec<BackendReport>,
    pub(crate) skipped: Vec<(String, String)>,
    /// The targets, computed from the runs.
    pub(crate) goals: Vec<GoalRow>,
}

/// File name of the queue-length chart, next to `latency.svg`.
pub(crate) const SWEEP_SVG: &str = "queue-sweep.svg";

pub(crate) fn cell(summary: Option<Summary>, pick: fn(&Summary) -> f64) -> String {
    summary.map_or_else(|| "–".to_owned(), |s| fmt_us(pick(&s)))
}

pub(crate) fn fmt_ratio(r: f64) -> String {
    format!("{r:.2}x")
}

impl Report {
    /// The backend labelled `label`, if it was measured.
    pub(crate) fn backend(&self, label: &str) -> Option<&BackendReport> {
        self.backends.iter().find(|b| b.backend == label)
    }

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
             then a put-if-absent), until it holds.\n"
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
