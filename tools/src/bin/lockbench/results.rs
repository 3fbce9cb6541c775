//! What each run measured (kept run by run in the JSON), and the helpers its pages share
//! to show a figure; the pages themselves are `report.rs` and its sections.

use serde::Serialize;

use crate::contention::{ContentionRow, LoopRun};
use crate::election::{CampaignRun, NotifyRun, ServiceRun};
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
    pub(crate) fn handoff_floor_us(&self) -> Option<f64> {
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
    /// Two leader services taking turns (none without elections).
    pub(crate) service: Option<ServiceRun>,
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

    /// A leader service hand-over's p50 against the lock hand-off's p50 of this run.
    pub(crate) fn service_ratio(&self) -> Option<f64> {
        Some(self.service.as_ref()?.handover?.p50_us / self.handoff?.p50_us)
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
    /// Whether it grants several permits in one hold; without, the semaphore-many row
    /// says so.
    pub(crate) semaphores_many: bool,
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
}

/// One target as measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GoalRow {
    pub(crate) target: String,
    /// Median over the runs of the per-run figure.
    pub(crate) measured: Option<f64>,
    pub(crate) shown: String,
    pub(crate) goal: String,
    /// `None` when a backend or row it needs was not measured.
    pub(crate) pass: Option<bool>,
}
