//! lockbench end to end on the in-process backend (no servers): a short run writes a
//! report whose election tables have a row for the backend, and whose JSON holds every
//! election workload. Only that they ran is checked, never how fast.

use std::time::Duration;

use tokio::process::Command;

/// Bound on the whole benchmark run.
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The election workloads run on `memory` and land in report.md and report.json.
#[tokio::test(flavor = "multi_thread")]
async fn election_workloads_are_reported() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_lockbench"))
        .args([
            "--backends",
            "memory",
            "--runs",
            "1",
            "--duration",
            "200ms",
            "--warmup",
            "50ms",
            "--clients",
            "2",
            "--locks",
            "1",
            "--sweep",
            "--held",
            "10",
            "--takeover-rounds",
            "1",
            "--observers",
            "3",
            "--out",
        ])
        .arg(out.path())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUN_LIMIT, run)
        .await
        .expect("lockbench ends in time")
        .expect("lockbench runs");
    assert!(
        output.status.success(),
        "lockbench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    for heading in [
        "### Uncontended campaign",
        "### Failover after the leader is killed",
        "### Observer notification",
    ] {
        let section = md
            .split(heading)
            .nth(1)
            .unwrap_or_else(|| panic!("report.md has no `{heading}`:\n{md}"));
        let row = section
            .lines()
            .find(|l| l.starts_with("| memory |"))
            .unwrap_or_else(|| panic!("`{heading}` has no memory row:\n{md}"));
        assert!(!row.contains("no elections"), "{heading}: {row}");
    }

    let json = std::fs::read_to_string(out.path().join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report.json parses");
    let memory = &report["backends"][0];
    assert_eq!(memory["backend"], "memory");
    assert_eq!(memory["elections"], true);
    let run = &memory["runs"][0];
    assert!(
        run["campaign"]["cycles"].as_u64() > Some(0),
        "no campaign cycles: {run}"
    );
    assert!(
        run["notify"]["rounds"].as_u64() > Some(0),
        "no observed hand-overs: {run}"
    );
    assert_eq!(run["notify"]["observers"], 3);
    let failover = memory["failover"]["takeover_ms"]
        .as_array()
        .expect("failover rounds");
    assert_eq!(failover.len(), 1, "one failover round: {memory}");
}
