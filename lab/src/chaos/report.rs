//! What a scenario run found ([`ScenarioReport`], with the assertion of a promise) and
//! how the reliability report stores it ([`ReportRow`], one JSON line per run).

use std::fmt;
use std::time::Duration;

use lock_core::LostReason;

use super::{ChaosTarget, Expect, Plan, Topology};
use conformance::fence::FenceReport;

/// What one scenario run found.
#[derive(Debug, Clone)]
pub struct ScenarioReport {
    /// Scenario name.
    pub scenario: &'static str,
    /// The backend deployment.
    pub target: String,
    /// What the fenced resource saw.
    pub fence: FenceReport,
    /// Whether the victim's write (after the fault) was accepted.
    pub victim_write_accepted: Option<bool>,
    /// Whether the victim was told it lost the lock, and why.
    pub victim_lost: Option<LostReason>,
    /// Victim's guard stopped vouching (lost signal or validity deadline, whichever came
    /// first) → next accepted section of another holder, in ms (positive: the victim knew
    /// before anyone else got in; negative: mutual exclusion was lost at the lock and only
    /// the fence protected the resource).
    pub lost_signal_lead_ms: Option<f64>,
    /// Fault injected → next accepted section of another holder.
    pub takeover: Option<Duration>,
    /// After healing, a fresh client acquired the lock within this long.
    pub recovery: Option<Duration>,
    /// Waiters that got no grant within their scenario's generous limit, described: a
    /// hang, whatever the topology promises (asserted empty).
    pub stalled_waiters: Vec<String>,
    /// Fault → a replica promoted in the primary's place (failover scenarios).
    pub promotion: Option<Duration>,
    /// From the moment the victim could first learn its hold was gone (the promotion, or
    /// the end of a partition) to its guard turning Lost.
    pub lost_after: Option<Duration>,
    /// Guards that should have turned Lost but had not within TTL plus a bound,
    /// described (asserted empty).
    pub lost_late: Vec<String>,
    /// Errors worth a look (not assertions).
    pub notes: Vec<String>,
}

impl fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0),
            )
        };
        write!(
            f,
            "{} on {}: {} sections, {} writes accepted, counter {}, {} stale writes rejected, \
             {} overlaps, victim write accepted {:?}, victim lost {:?}, lost-signal lead {}, \
             takeover {}, longest gap {}, recovery {}, promotion {}, lost after {}",
            self.scenario,
            self.target,
            self.fence.sections,
            self.fence.accepted_writes,
            self.fence.counter,
            self.fence.rejected_writes,
            self.fence.overlaps.len(),
            self.victim_write_accepted,
            self.victim_lost,
            self.lost_signal_lead_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0} ms")),
            ms(self.takeover),
            ms(self.fence.gaps.iter().max().copied()),
            ms(self.recovery),
            ms(self.promotion),
            ms(self.lost_after),
        )?;
        for stalled in &self.stalled_waiters {
            write!(f, "\n  stalled: {stalled}")?;
        }
        for late in &self.lost_late {
            write!(f, "\n  lost late: {late}")?;
        }
        for note in &self.notes {
            write!(f, "\n  note: {note}")?;
        }
        Ok(())
    }
}

impl ScenarioReport {
    /// Asserts what `expect` promises, with the report in the message.
    pub fn assert_meets(&self, expect: Expect) {
        let context = format!("{self}\n  overlaps: {:?}", self.fence.overlaps);
        assert!(
            self.fence.tokens_backwards.is_empty(),
            "fencing tokens went backwards: {context}"
        );
        assert_eq!(self.fence.lost_updates(), 0, "lost updates: {context}");
        if expect == Expect::Safe {
            assert!(self.fence.is_safe(), "mutual exclusion violated: {context}");
            if let Some(lead) = self.lost_signal_lead_ms {
                assert!(
                    lead > 0.0,
                    "another holder got in before the victim's guard stopped vouching: {context}"
                );
            }
        }
        assert!(
            self.stalled_waiters.is_empty(),
            "a waiter hung or was never seen waiting: {context}"
        );
        assert!(
            self.lost_late.is_empty(),
            "a lost hold was not reported Lost in time: {context}"
        );
        assert!(
            self.recovery.is_some(),
            "the lock was stuck after the faults healed: {context}"
        );
    }
}

/// One scenario run as the reliability report stores it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ReportRow {
    /// Scenario name.
    pub scenario: String,
    /// Backend deployment.
    pub target: String,
    /// Topology, as text.
    pub topology: String,
    /// What the topology promises, as text.
    pub expectation: String,
    /// Whether the scenario ran (it may not apply).
    pub ran: bool,
    /// Overlapping accepted sections.
    pub violations: usize,
    /// Stale writes the fence rejected.
    pub stale_rejected: usize,
    /// Lost updates.
    pub lost_updates: u64,
    /// Accepted writes.
    pub writes: u64,
    /// Victim's lost signal → next holder, ms (positive: told first).
    pub lost_signal_lead_ms: Option<f64>,
    /// Fault → next holder, ms.
    pub takeover_ms: Option<f64>,
    /// Longest time between two accepted sections, ms.
    pub longest_gap_ms: Option<f64>,
    /// Time for a fresh client to get the lock after the faults healed, ms.
    pub recovery_ms: Option<f64>,
    /// Fault → a replica promoted in the primary's place, ms.
    #[serde(default)]
    pub promotion_ms: Option<f64>,
    /// The victim could first learn its hold was gone → its guard turned Lost, ms.
    #[serde(default)]
    pub lost_after_ms: Option<f64>,
    /// Nemesis seed.
    pub seed: u64,
    /// Notes.
    pub notes: Vec<String>,
}

pub(super) fn record(
    scenario: &str,
    target: &dyn ChaosTarget,
    topology: &Topology,
    expect: Expect,
    plan: Plan,
    report: Option<&ScenarioReport>,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let row = ReportRow {
        scenario: scenario.to_owned(),
        target: target.label(),
        topology: format!("{topology:?}"),
        expectation: format!("{expect:?}"),
        ran: report.is_some(),
        violations: report.map_or(0, |r| r.fence.overlaps.len()),
        stale_rejected: report.map_or(0, |r| r.fence.rejected_writes + r.fence.rejected_begins),
        lost_updates: report.map_or(0, |r| r.fence.lost_updates()),
        writes: report.map_or(0, |r| r.fence.accepted_writes),
        lost_signal_lead_ms: report.and_then(|r| r.lost_signal_lead_ms),
        takeover_ms: report.and_then(|r| r.takeover).map(ms),
        longest_gap_ms: report
            .and_then(|r| r.fence.gaps.iter().max().copied())
            .map(ms),
        recovery_ms: report.and_then(|r| r.recovery).map(ms),
        promotion_ms: report.and_then(|r| r.promotion).map(ms),
        lost_after_ms: report.and_then(|r| r.lost_after).map(ms),
        seed: plan.seed,
        notes: report.map_or_else(Vec::new, |r| {
            let stalled = r.stalled_waiters.iter().map(|s| format!("stalled: {s}"));
            let late = r.lost_late.iter().map(|s| format!("lost late: {s}"));
            stalled.chain(late).chain(r.notes.iter().cloned()).collect()
        }),
    };
    record_row(&row);
}

/// Appends `row` to `$CHAOS_REPORT_DIR/<scenario>.jsonl` for the reliability report, when
/// that is set. Fault tests outside [`SCENARIOS`](super::SCENARIOS) (e.g. on whole processes) report
/// through this too; the report lists them after the scenarios.
pub fn record_row(row: &ReportRow) {
    let Ok(dir) = std::env::var("CHAOS_REPORT_DIR") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{}.jsonl", row.scenario));
    let line = match serde_json::to_string(row) {
        Ok(line) => line,
        Err(err) => {
            eprintln!("[chaos] cannot encode the report row: {err}");
            return;
        }
    };
    use std::io::Write as _;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{line}"));
    if let Err(err) = written {
        eprintln!("[chaos] cannot write {}: {err}", path.display());
    }
}
