//! lockbench end to end on the in-process backend (no servers): a short run writes a
//! report whose election, semaphore (one permit a hold, or several), read-write and
//! multi-lock tables have a row for the backend, and whose JSON holds every one of those workloads. Only that they ran, and
//! ran sanely, is checked, never how fast.

use std::time::Duration;

use tokio::process::Command;

/// Bound on the whole benchmark run.
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The election and primitive workloads run on `memory` and land in report.md and
/// report.json.
#[tokio::test(flavor = "multi_thread")]
async fn election_and_primitive_workloads_are_reported() {
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
        "### Semaphore: 4 permits, 64 contenders",
        "### Semaphore, several permits a hold: 8 permits, 64 contenders",
        "### Read-write lock: 2 clients, 10% writes",
        "### Multi-lock of 3 names",
    ] {
        let row = memory_row(&md, heading);
        for absent in ["no elections", "not offered", "not measured"] {
            assert!(!row.contains(absent), "{heading}: {row}");
        }
    }
    // The read-write lock is compared with the 2-on-1 mutex row of the same run.
    let rw = memory_row(&md, "### Read-write lock");
    assert!(rw.contains('x'), "no ratio to the mutex: {rw}");
    // The semaphore of several permits a hold, with the single-permit one of the same run.
    let many = memory_row(&md, "### Semaphore, several permits a hold");
    assert!(many.contains('x'), "no ratio to the semaphore: {many}");

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

    let primitives = &run["primitives"];
    let semaphore = &primitives["semaphore"];
    assert!(semaphore["cycles"].as_u64() > Some(0), "{semaphore}");
    assert_eq!(semaphore["clients"], 64);
    let in_use = semaphore["max_in_use"].as_u64().expect("max_in_use");
    assert!((1..=4).contains(&in_use), "permits in use: {semaphore}");
    assert_eq!(semaphore["errors"], 0, "{semaphore}");

    let many = &primitives["semaphore_many"];
    assert!(many["cycles"].as_u64() > Some(0), "{many}");
    assert_eq!(many["clients"], 64);
    let in_use = many["max_in_use"].as_u64().expect("max_in_use");
    assert!((1..=8).contains(&in_use), "permits in use: {many}");
    let by_count = many["acquire_by_count"].as_array().expect("acquire by k");
    assert_eq!(by_count.len(), 4, "{many}");
    assert!(
        many["permits_per_sec"].as_f64() >= many["cycles_per_sec"].as_f64(),
        "{many}"
    );
    assert_eq!(many["errors"], 0, "{many}");

    let rwlock = &primitives["rwlock"];
    assert!(rwlock["cycles"].as_u64() > Some(0), "{rwlock}");
    assert_eq!(rwlock["clients"], 2);
    assert!(
        rwlock["read_acquire"]["count"].as_u64() > Some(0),
        "no reads: {rwlock}"
    );
    assert_eq!(rwlock["errors"], 0, "{rwlock}");

    let multi = &primitives["multi"];
    assert!(multi["multi_cycle"]["count"].as_u64() > Some(0), "{multi}");
    assert!(
        multi["sequential_cycle"]["count"].as_u64() > Some(0),
        "{multi}"
    );
    let contended = &primitives["multi_contended"];
    assert!(contended["cycles"].as_u64() > Some(0), "{contended}");
    assert_eq!(contended["errors"], 0, "{contended}");
}

/// The memory row of the table under `heading` in `md`.
fn memory_row<'a>(md: &'a str, heading: &str) -> &'a str {
    let section = md
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("report.md has no `{heading}`:\n{md}"));
    section
        .lines()
        .find(|l| l.starts_with("| memory |"))
        .unwrap_or_else(|| panic!("`{heading}` has no memory row:\n{md}"))
}
