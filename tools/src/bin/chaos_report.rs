//! Turns the JSON lines the fault scenarios wrote (`CHAOS_REPORT_DIR`) into the
//! reliability report: `reliability.md` and `reliability.json` in the same directory.
//!
//! ```text
//! chaos_report chaos-report
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use lab::chaos::matrix::DEPLOYMENTS;
use lab::chaos::{Primitive, ReportRow, SCENARIOS};

/// Dual deployments (`dual:<old>|<new>`) in report order: the pair, then the faulted
/// side(s).
const DUAL_DEPLOYMENTS: &[&str] = &[
    "zookeeper→redis: old",
    "zookeeper→redis: new",
    "zookeeper→redis: both",
    "etcd→redis: old",
    "etcd→redis: new",
    "etcd→redis: both",
];

/// The backend a target label names (`redis://…`, `zookeeper 127.0.0.1:…`, `etcd …`).
fn backend(label: &str) -> &str {
    label.split([':', ' ']).next().unwrap_or("?")
}

/// The primitive a row's scenario ran with (a `Kinded` target's label ends with it), or
/// `None` for the lock.
fn primitive(row: &ReportRow) -> Option<Primitive> {
    Primitive::ALL
        .into_iter()
        .find(|p| row.target.ends_with(&format!(" {}", p.label())))
}

/// The report column of a row: its deployment, with the primitive it ran (` semaphore`).
fn column(row: &ReportRow) -> String {
    match primitive(row) {
        Some(p) => format!("{} {}", deployment(row), p.label()),
        None => deployment(row),
    }
}

fn deployment(row: &ReportRow) -> String {
    if let Some(sides) = row.target.strip_prefix("dual ") {
        // Label `dual <old label> | <new label>`, topology `Dual { …, faults: Old }`.
        let (old, new) = sides.split_once(" | ").unwrap_or((sides, "?"));
        let faults = row
            .topology
            .rsplit_once("faults: ")
            .map_or("?", |(_, rest)| rest.trim_end_matches([' ', '}']));
        return format!(
            "{}→{}: {}",
            backend(old),
            backend(new),
            faults.to_lowercase()
        );
    }
    let clustered = row.topology.starts_with("Quorum");
    if row.topology.starts_with("Replicated") {
        // `Replicated { shards: 1, replicas: 2, acked: 0 }`: behind Sentinel (one shard),
        // with or without acknowledged grants.
        let acked = !row.topology.contains("acked: 0 ");
        let kind = if row.topology.contains("shards: 1,") {
            "sentinel"
        } else {
            "cluster"
        };
        return if acked {
            format!("{kind}+wait")
        } else {
            kind.to_owned()
        };
    }
    match backend(&row.target) {
        "redlock" => "redlock-5".to_owned(),
        "zookeeper" if clustered => "zookeeper-3".to_owned(),
        "etcd" if clustered => "etcd-3".to_owned(),
        other => other.to_owned(),
    }
}

/// The verdict of one cell from its runs: safe, fenced, VIOLATION (with the count of runs
/// when there were several), – when the scenario does not apply, empty when it was not
/// run. A deployment that promises only fencing there is graded fenced even when its runs
/// saw no second grant (the race went its way): the grade is the weaker of what the runs
/// saw and what the deployment promises.
fn verdict(runs: Option<&Vec<&ReportRow>>) -> String {
    let Some(runs) = runs else {
        return String::new();
    };
    let ran: Vec<&&ReportRow> = runs.iter().filter(|r| r.ran).collect();
    if ran.is_empty() {
        return "–".to_owned();
    }
    let unsafe_runs = ran
        .iter()
        .filter(|r| r.violations > 0 || r.lost_updates > 0)
        .count();
    let lock_lost = ran
        .iter()
        .any(|r| r.lost_signal_lead_ms.is_some_and(|lead| lead <= 0.0) || r.expectation != "Safe");
    let verdict = match (unsafe_runs, lock_lost) {
        (0, false) => "safe",
        (0, true) => "fenced",
        _ => "VIOLATION",
    };
    if ran.len() > 1 {
        format!("{verdict} ({}×)", ran.len())
    } else {
        verdict.to_owned()
    }
}

type Cells<'a> = BTreeMap<(String, String), Vec<&'a ReportRow>>;

/// The runs of each cell: by scenario and [`column()`].
fn cells(rows: &[ReportRow]) -> Cells<'_> {
    let mut cells: Cells<'_> = BTreeMap::new();
    for row in rows {
        cells
            .entry((row.scenario.clone(), column(row)))
            .or_default()
            .push(row);
    }
    cells
}

/// A table of `scenarios` (rows) by `deployments` (columns).
fn table<'a>(
    md: &mut String,
    scenarios: impl Iterator<Item = &'a str>,
    deployments: &[&str],
    cells: &Cells<'_>,
) {
    let _ = write!(md, "| scenario |");
    for d in deployments {
        let _ = write!(md, " {d} |");
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|{}", "---|".repeat(deployments.len()));
    for scenario in scenarios {
        let _ = write!(md, "| {scenario} |");
        for d in deployments {
            let cell = verdict(cells.get(&(scenario.to_owned(), (*d).to_owned())));
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
}

/// One table per primitive (the scenarios through `lab::chaos::Kinded`), on the
/// deployments whose chaos suites run it; the deployments whose capabilities do not grant
/// it are named as not offered.
fn primitive_tables(md: &mut String, rows: &[ReportRow], cells: &Cells<'_>) {
    for p in Primitive::ALL {
        let mut columns: Vec<String> = DEPLOYMENTS
            .iter()
            .filter(|d| d.runs(p))
            .map(|d| format!("{} {}", d.name, p.label()))
            .collect();
        let found: std::collections::BTreeSet<String> = rows
            .iter()
            .filter(|r| primitive(r) == Some(p))
            .map(column)
            .collect();
        columns.retain(|c| found.contains(c));
        let new: Vec<String> = found.into_iter().filter(|c| !columns.contains(c)).collect();
        columns.extend(new);
        if columns.is_empty() {
            continue;
        }
        let _ = writeln!(md, "\n## The scenarios on a {}\n", p.label());
        let not_offered: Vec<&str> = DEPLOYMENTS
            .iter()
            .filter(|d| !d.grants.contains(&p))
            .map(|d| d.name)
            .collect();
        if !not_offered.is_empty() {
            let _ = writeln!(
                md,
                "Not offered on {} (the deployment's capabilities do not grant it).\n",
                not_offered.join(", ")
            );
        }
        let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
        table(md, SCENARIOS.iter().copied(), &columns, cells);
    }
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.0}"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: chaos_report DIR (the CHAOS_REPORT_DIR of a chaos run)")?,
    );
    let mut rows: Vec<ReportRow> = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            for line in std::fs::read_to_string(&path)?.lines() {
                rows.push(serde_json::from_str(line)?);
            }
        }
    }
    if rows.is_empty() {
        return Err(format!("no scenario results in {}", dir.display()).into());
    }
    let cells = cells(&rows);

    let mut md = String::new();
    let _ = writeln!(md, "# distlock reliability report\n");
    let _ = writeln!(
        md,
        "Every scenario ran against real servers with faults injected (fault proxy, SIGKILL, \
         SIGSTOP, restarts). Each cell: **safe** (no overlapping accepted critical sections, \
         no lost update, and every victim knew it had lost the lock before anyone else got \
         it), **fenced** (another client got the lock while the victim's guard still vouched \
         for it, or the deployment documents that it can; the fence rejected every stale \
         write), \
         **VIOLATION** (overlapping accepted sections or lost updates), or – (does not \
         apply). `n×` counts runs.\n"
    );
    // The scenarios in their order, then fault tests of whole processes (lockctl).
    let others: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r.scenario.as_str())
        .filter(|s| !SCENARIOS.contains(s))
        .collect();
    // The known deployments in their order, then any other that ran (a new topology).
    let known: Vec<&str> = DEPLOYMENTS.iter().map(|d| d.name).collect();
    let mut singles: Vec<String> = known.iter().map(|d| (*d).to_owned()).collect();
    let new: std::collections::BTreeSet<String> = rows
        .iter()
        .filter(|r| !r.target.starts_with("dual ") && primitive(r).is_none())
        .map(deployment)
        .filter(|d| !known.contains(&d.as_str()))
        .collect();
    singles.extend(new);
    let singles: Vec<&str> = singles.iter().map(String::as_str).collect();
    table(
        &mut md,
        SCENARIOS.iter().copied().chain(others),
        &singles,
        &cells,
    );
    primitive_tables(&mut md, &rows, &cells);
    let mut duals: Vec<&str> = DUAL_DEPLOYMENTS.to_vec();
    let found: std::collections::BTreeSet<String> = rows
        .iter()
        .filter(|r| r.target.starts_with("dual "))
        .map(deployment)
        .collect();
    duals.retain(|d| found.contains(*d));
    duals.extend(
        found
            .iter()
            .map(String::as_str)
            .filter(|d| !DUAL_DEPLOYMENTS.contains(d)),
    );
    if !duals.is_empty() {
        let _ = writeln!(md, "\n## Dual deployments\n");
        let _ = writeln!(
            md,
            "The dual lock (`dual:<old>|<new>`, a hold on the old backend then on the new \
             one) under the same scenarios. A column names the pair and the side the faults \
             hit (links, servers, keys removed early; the other side is left alone), or both. \
             With one side healthy the dual promises safety in every scenario that applies to \
             the faulted side; with both faulted, the stronger of the two sides' promises.\n"
        );
        table(&mut md, SCENARIOS.iter().copied(), &duals, &cells);
    }

    let _ = writeln!(md, "\n## Details\n");
    let _ = writeln!(
        md,
        "| scenario | deployment | promise | overlaps | stale writes rejected | lost updates | \
         writes | lost-signal lead ms | takeover ms | longest gap ms | recovery ms | \
         promotion ms | lost after ms | seed |"
    );
    let _ = writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for ((scenario, d), runs) in &cells {
        for r in runs.iter().filter(|r| r.ran) {
            let promise = if r.expectation == "Safe" {
                "safe"
            } else {
                "fenced only"
            };
            let _ = writeln!(
                md,
                "| {scenario} | {d} | {promise} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} \
                 | {} |",
                r.violations,
                r.stale_rejected,
                r.lost_updates,
                r.writes,
                ms(r.lost_signal_lead_ms),
                ms(r.takeover_ms),
                ms(r.longest_gap_ms),
                ms(r.recovery_ms),
                ms(r.promotion_ms),
                ms(r.lost_after_ms),
                r.seed
            );
        }
    }
    let promises: BTreeMap<(String, String), String> = rows
        .iter()
        .filter(|r| r.expectation != "Safe" && r.ran)
        .map(|r| ((r.scenario.clone(), column(r)), r.expectation.clone()))
        .collect();
    if !promises.is_empty() {
        let _ = writeln!(md, "\n## Where a backend promises only fencing\n");
        for ((scenario, d), why) in promises {
            let _ = writeln!(md, "- {scenario} on {d}: {why}");
        }
    }
    std::fs::write(dir.join("reliability.md"), &md)?;
    std::fs::write(
        dir.join("reliability.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    println!("{md}");
    println!(
        "Written to {0}/reliability.md and {0}/reliability.json",
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, topology: &str, expectation: &str, lead: Option<f64>) -> ReportRow {
        ReportRow {
            scenario: "sentinel_split_brain".to_owned(),
            target: target.to_owned(),
            topology: topology.to_owned(),
            expectation: expectation.to_owned(),
            ran: true,
            violations: 0,
            stale_rejected: 0,
            lost_updates: 0,
            writes: 1,
            lost_signal_lead_ms: lead,
            takeover_ms: None,
            longest_gap_ms: None,
            recovery_ms: None,
            promotion_ms: None,
            lost_after_ms: None,
            seed: 1,
            notes: Vec::new(),
        }
    }

    #[test]
    fn replicated_deployments_get_columns_of_their_own() {
        let sentinel = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/distlock";
        let plain = row(
            sentinel,
            "Replicated { shards: 1, replicas: 2, acked: 0 }",
            "Safe",
            None,
        );
        let wait = row(
            sentinel,
            "Replicated { shards: 1, replicas: 2, acked: 1 }",
            "Safe",
            None,
        );
        let cluster = row(
            "redis+cluster://x",
            "Replicated { shards: 3, replicas: 1, acked: 0 }",
            "Safe",
            None,
        );
        let tls = row(
            "zookeeper-tls 127.0.0.1:3",
            "Single { durable: true }",
            "Safe",
            None,
        );
        assert_eq!(deployment(&plain), "sentinel");
        assert_eq!(deployment(&wait), "sentinel+wait");
        assert_eq!(deployment(&cluster), "cluster");
        assert_eq!(deployment(&tls), "zookeeper-tls");
    }

    #[test]
    fn a_primitive_has_a_table_of_its_own_and_is_not_offered_where_not_granted() {
        let single = "Single { durable: false }";
        let lock = row("redis://127.0.0.1:1", single, "Safe", None);
        let semaphore = row("redis://127.0.0.1:1 semaphore", single, "Safe", None);
        assert_eq!(column(&lock), "redis");
        assert_eq!(column(&semaphore), "redis semaphore");
        let rows = vec![lock, semaphore];
        let mut md = String::new();
        primitive_tables(&mut md, &rows, &cells(&rows));
        assert!(md.contains("## The scenarios on a semaphore"), "{md}");
        assert!(md.contains("Not offered on redlock-5"), "{md}");
        assert!(md.contains("| redis semaphore |"), "{md}");
        assert!(!md.contains("election"), "{md}");
    }

    #[test]
    fn a_cell_is_the_weaker_of_what_was_seen_and_what_is_promised() {
        let topology = "Replicated { shards: 1, replicas: 2, acked: 0 }";
        let grade = |expectation: &str, lead| {
            let r = row("redis+sentinel://x", topology, expectation, lead);
            verdict(Some(&vec![&r]))
        };
        assert_eq!(grade("Safe", Some(10.0)), "safe");
        assert_eq!(grade("Safe", Some(-10.0)), "fenced");
        assert_eq!(
            grade("FencedOnly(\"replication is asynchronous\")", Some(10.0)),
            "fenced"
        );
        let mut overlap = row("redis+sentinel://x", topology, "FencedOnly(\"x\")", None);
        overlap.violations = 1;
        assert_eq!(verdict(Some(&vec![&overlap])), "VIOLATION");
    }
}
