//! `lockctl run --permits N`, `--shared` and `--exclusive` against real servers of every
//! backend: permit holders up to N and a -n beyond them turned away, a disagreement on N
//! refused, several permits in one hold (`--take K`) or its refusal, readers together, a writer turned away beside them and then served in its
//! turn, and `status` showing every holder with its kind.

use std::time::Duration;

use harness::{or_skip, EtcdServer, PostgresServer, RedisServer, ZkServer};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::process::Child;
use tokio::time::{sleep, timeout, Instant};

use crate::common::{lockctl, text};

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(30);

/// `lockctl --url URL run ARGS...` as its own process, left running.
fn spawn_run(url: &str, args: &[&str]) -> Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", url, "run", "--ttl", "3s"])
        .args(args)
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl run")
}

/// `lockctl status NAME --json` until it shows `n` holders; returns it.
async fn holders_reach(url: &str, name: &str, n: usize) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let output = lockctl(url, &["status", name, "--json"]).await;
        let shown: Value =
            serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(&output)));
        let holders = shown["holders"].as_array().map_or(0, Vec::len);
        if holders == n {
            return shown;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never had {n} holders: {shown}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// Stops `child` with SIGTERM and waits for it.
async fn stop(mut child: Child) {
    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("signal lockctl run");
    timeout(WAIT, child.wait())
        .await
        .expect("run ends")
        .expect("wait");
}

async fn permits_and_sides(url: &str) {
    let semaphore = format!("pool/{}", uuid::Uuid::new_v4().simple());
    let holders = [
        spawn_run(url, &["--permits", "2", &semaphore, "--", "sleep", "60"]),
        spawn_run(url, &["--permits", "2", &semaphore, "--", "sleep", "60"]),
    ];
    let shown = holders_reach(url, &semaphore, 2).await;
    for holder in shown["holders"].as_array().expect("holders") {
        assert_eq!(holder["kind"], "permit", "{shown}");
        assert_eq!(holder["permits"], 2, "{shown}");
    }
    let full = lockctl(
        url,
        &["run", "--permits", "2", "-n", &semaphore, "--", "true"],
    )
    .await;
    assert_eq!(
        full.status.code(),
        Some(75),
        "no third permit: {}",
        text(&full)
    );
    let other = lockctl(
        url,
        &["run", "--permits", "3", "-n", &semaphore, "--", "true"],
    )
    .await;
    assert_eq!(other.status.code(), Some(1), "{}", text(&other));
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("2 permits"),
        "the disagreement is named: {}",
        text(&other)
    );
    let status = lockctl(url, &["status", &semaphore]).await;
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains("held by 2") && shown.contains("permit of 2"),
        "{shown}"
    );
    for holder in holders {
        stop(holder).await;
    }
    holders_reach(url, &semaphore, 0).await;
    take_several(url).await;

    let table = format!("table/{}", uuid::Uuid::new_v4().simple());
    let readers = [
        spawn_run(url, &["--shared", &table, "--", "sleep", "60"]),
        spawn_run(url, &["-s", &table, "--", "sleep", "60"]),
    ];
    let shown = holders_reach(url, &table, 2).await;
    for holder in shown["holders"].as_array().expect("holders") {
        assert_eq!(holder["kind"], "read", "{shown}");
    }
    let refused = lockctl(url, &["run", "--exclusive", "-n", &table, "--", "true"]).await;
    assert_eq!(
        refused.status.code(),
        Some(75),
        "no writer beside readers: {}",
        text(&refused)
    );
    let writer = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", url, "run", "-x", "-w", "30", &table, "--", "true"])
        .kill_on_drop(true)
        .output();
    let writer = tokio::spawn(writer);
    let deadline = Instant::now() + WAIT;
    loop {
        let output = lockctl(url, &["status", &table, "--json"]).await;
        let shown: Value = serde_json::from_slice(&output.stdout).expect("JSON");
        if shown["waiters"].as_array().is_some_and(|w| !w.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the writer never queued: {shown}"
        );
        sleep(Duration::from_millis(100)).await;
    }
    let late = lockctl(url, &["run", "-s", "-n", &table, "--", "true"]).await;
    assert_eq!(
        late.status.code(),
        Some(75),
        "a reader never overtakes a waiting writer: {}",
        text(&late)
    );
    assert!(!writer.is_finished(), "the writer waits for the readers");
    for reader in readers {
        stop(reader).await;
    }
    let wrote = timeout(WAIT, writer)
        .await
        .expect("the writer is served")
        .expect("task")
        .expect("lockctl run -x");
    assert_eq!(wrote.status.code(), Some(0), "{}", text(&wrote));
    holders_reach(url, &table, 0).await;
}

/// `run --permits 3 --take 2`: one hold of 2 permits, shown with its count; a second
/// `--take 2` is turned away while a `--take 1` fits; `--take 4` of 3 is a usage error. A
/// backend that cannot take several permits in one hold (ZooKeeper) exits 1 saying so.
async fn take_several(url: &str) {
    let semaphore = format!("pool/{}", uuid::Uuid::new_v4().simple());
    let run_once = |take: &'static str| {
        let semaphore = semaphore.clone();
        async move {
            let args = [
                "run",
                "--permits",
                "3",
                "--take",
                take,
                "-n",
                &semaphore,
                "--",
                "true",
            ];
            lockctl(url, &args).await
        }
    };
    let too_many = run_once("4").await;
    assert_eq!(too_many.status.code(), Some(2), "{}", text(&too_many));
    let two = spawn_run(
        url,
        &[
            "--permits",
            "3",
            "--take",
            "2",
            &semaphore,
            "--",
            "sleep",
            "60",
        ],
    );
    // ZooKeeper keeps Curator's layout, one lease node per permit.
    if url.starts_with("zk") {
        let refused = timeout(WAIT, two.wait_with_output())
            .await
            .expect("lockctl ends")
            .expect("wait");
        assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
        let again = run_once("2").await;
        assert_eq!(again.status.code(), Some(1), "{}", text(&again));
        assert!(
            String::from_utf8_lossy(&again.stderr).contains("several permits"),
            "the refusal says why: {}",
            text(&again)
        );
        return;
    }
    let shown = holders_reach(url, &semaphore, 1).await;
    assert_eq!(shown["holders"][0]["count"], 2, "{shown}");
    let busy = run_once("2").await;
    assert_eq!(
        busy.status.code(),
        Some(75),
        "2 of 3 with 2 taken: {}",
        text(&busy)
    );
    let one = run_once("1").await;
    assert_eq!(
        one.status.code(),
        Some(0),
        "the third permit: {}",
        text(&one)
    );
    stop(two).await;
    holders_reach(url, &semaphore, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_sides_on_redis() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    permits_and_sides(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_sides_on_zookeeper() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    permits_and_sides(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_sides_on_etcd() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    permits_and_sides(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_sides_on_postgres() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    permits_and_sides(&server.url()).await;
}
