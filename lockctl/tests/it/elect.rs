//! `lockctl elect`, `leader` and `observe` against real servers of every backend: a
//! leader elected from the shell, a library candidate waiting behind it, a `-n` candidate
//! turned away, the hand-over when the shell leader is stopped, and an observer that sees
//! each leader once, in increasing terms.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, DistributedLock, Election};
use harness::{or_skip, EtcdServer, PostgresServer, RedisServer, ZkServer};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{sleep, timeout, Instant};

use crate::common::{lockctl, text};

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(30);

/// `lockctl leader NAME --json` until its leader's value is `value` (`None`: nobody).
async fn leader_until(url: &str, name: &str, value: Option<&str>) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let output = lockctl(url, &["leader", name, "--json"]).await;
        let shown: Value =
            serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(&output)));
        let expected_code = if value.is_some() { 0 } else { 3 };
        if shown["leader"]["value"].as_str() == value {
            assert_eq!(
                output.status.code(),
                Some(expected_code),
                "{}",
                text(&output)
            );
            return shown;
        }
        assert!(Instant::now() < deadline, "leader never {value:?}: {shown}");
        sleep(Duration::from_millis(100)).await;
    }
}

async fn elect_leader_and_observe(url: &str) {
    let name = format!("elect/{}", uuid::Uuid::new_v4().simple());
    let dir = std::env::temp_dir().join(format!("lockctl-elect-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let term_file = dir.join("term");

    // Nobody leads yet.
    let shown = leader_until(url, &name, None).await;
    assert_eq!(shown["leader"], Value::Null, "{shown}");

    // An observer, as its own process, a line per change.
    let mut observer = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", url, "observe", &name, "--json"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl observe");
    let mut lines = BufReader::new(observer.stdout.take().expect("stdout")).lines();
    let first = timeout(WAIT, lines.next_line())
        .await
        .expect("observe prints the current state")
        .expect("read")
        .expect("a line");
    assert_eq!(
        serde_json::from_str::<Value>(&first).expect("JSON")["leader"],
        Value::Null
    );

    // A leader elected from the shell; its command learns the term.
    let script = format!(
        "echo \"$DISTLOCK_LEADER_TERM\" > {}; exec sleep 60",
        term_file.display()
    );
    let mut elected = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--url", url, "elect", "--ttl", "3s", "--value", "alpha", &name, "-c", &script,
        ])
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl elect");
    let shown = leader_until(url, &name, Some("alpha")).await;
    let alpha_term = shown["leader"]["term"].as_u64().expect("a term");
    let deadline = Instant::now() + WAIT;
    let written = loop {
        let written = std::fs::read_to_string(&term_file).unwrap_or_default();
        if !written.trim().is_empty() || Instant::now() > deadline {
            break written;
        }
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        written.trim(),
        alpha_term.to_string(),
        "DISTLOCK_LEADER_TERM"
    );

    // A library candidate waits behind it; a -n candidate is turned away (exit 75).
    let client: Arc<dyn DistributedLock> = distlock::connect(url).await.expect("connect");
    let election = Election::new(Arc::clone(&client), &name).expect("election");
    let waiting = {
        let election = election.clone();
        tokio::spawn(async move {
            election
                .campaign_with("beta", &AcquireOptions::timeout(WAIT))
                .await
        })
    };
    let refused = lockctl(
        url,
        &["elect", "-n", "--value", "gamma", &name, "--", "true"],
    )
    .await;
    assert_eq!(refused.status.code(), Some(75), "{}", text(&refused));
    assert!(!waiting.is_finished(), "beta must wait while alpha leads");

    // Stopping the shell leader stops its command and hands over to beta.
    let pid = Pid::from_raw(i32::try_from(elected.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("signal lockctl elect");
    let status = timeout(WAIT, elected.wait())
        .await
        .expect("elect ends")
        .expect("wait");
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command died of the forwarded SIGTERM"
    );
    let beta = waiting
        .await
        .expect("campaign task")
        .expect("campaign")
        .expect("beta leads after alpha");
    assert!(beta.term().get() > alpha_term, "terms increase");
    let status = lockctl(url, &["status", &name, "--json"]).await;
    let status: Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(status["holder"]["value"], "beta", "{status}");

    // The observer saw alpha, then beta, terms never going back.
    let mut seen = Vec::new();
    let deadline = Instant::now() + WAIT;
    while seen.last().map(|(value, _): &(String, u64)| value.as_str()) != Some("beta") {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = timeout(left, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("observer stopped at {seen:?}"))
            .expect("read")
            .expect("a line");
        let change: Value = serde_json::from_str(&line).expect("JSON");
        if let Some(leader) = change["leader"].as_object() {
            let value = leader["value"].as_str().expect("value").to_owned();
            seen.push((value, leader["term"].as_u64().expect("term")));
        }
    }
    assert_eq!(
        seen.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(),
        ["alpha", "beta"],
        "{seen:?}"
    );
    assert!(
        seen.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "{seen:?}"
    );

    // SIGINT ends the observer with 0.
    let pid = Pid::from_raw(i32::try_from(observer.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGINT).expect("signal lockctl observe");
    let status = timeout(WAIT, observer.wait())
        .await
        .expect("observe ends")
        .expect("wait");
    assert_eq!(status.code(), Some(0));

    beta.resign().await.expect("resign");
    client.close().await.expect("close");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_leader_and_observe_on_redis() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    elect_leader_and_observe(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_leader_and_observe_on_zookeeper() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    elect_leader_and_observe(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_leader_and_observe_on_etcd() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    elect_leader_and_observe(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_leader_and_observe_on_postgres() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    elect_leader_and_observe(&server.url()).await;
}

/// Two `lockctl elect --requeue` take turns: each runs its command on every term it leads
/// (the commands never overlap, terms rise in the order they ran), both lead again and
/// again, and SIGTERM ends each, leaving nobody leading.
async fn requeue_runs_the_command_each_term(url: &str) {
    let name = format!("requeue/{}", uuid::Uuid::new_v4().simple());
    let dir = std::env::temp_dir().join(format!("lockctl-requeue-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log = dir.join("log");
    let script = r#"mkdir "$D/running" || echo overlap >> "$D/log"
echo "$V $DISTLOCK_LEADER_TERM" >> "$D/log"
sleep 0.2
rmdir "$D/running""#;
    let mut candidates = Vec::new();
    for value in ["a", "b"] {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(["--url", url, "elect", "--requeue", "--value", value, &name])
            .args(["--", "sh", "-c", script])
            .env("D", &dir)
            .env("V", value)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("lockctl elect --requeue");
        candidates.push(child);
    }
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + WAIT;
    while lines().len() < 8 {
        assert!(Instant::now() < deadline, "terms so far: {:?}", lines());
        sleep(Duration::from_millis(50)).await;
    }
    for child in &candidates {
        let pid = Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid"));
        kill(pid, Signal::SIGTERM).expect("SIGTERM");
    }
    for mut child in candidates {
        let status = timeout(WAIT, child.wait())
            .await
            .expect("lockctl ends on SIGTERM")
            .expect("status");
        assert!(
            matches!(status.code(), Some(0 | 143)),
            "exit {status:?}: as the command did, or 128 + SIGTERM between terms"
        );
    }
    let seen = lines();
    assert!(!seen.iter().any(|line| line == "overlap"), "{seen:?}");
    let terms: Vec<(String, u64)> = seen
        .iter()
        .map(|line| {
            let (value, term) = line.split_once(' ').expect("value and term");
            (value.to_owned(), term.parse().expect("a term"))
        })
        .collect();
    assert!(
        terms.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "terms rise in the order the commands ran: {terms:?}"
    );
    for value in ["a", "b"] {
        let led = terms.iter().filter(|(v, _)| v == value).count();
        assert!(led >= 2, "{value} led {led} terms: {terms:?}");
    }
    leader_until(url, &name, None).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_runs_the_command_each_term_on_redis() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    requeue_runs_the_command_each_term(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_runs_the_command_each_term_on_zookeeper() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    requeue_runs_the_command_each_term(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_runs_the_command_each_term_on_postgres() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    requeue_runs_the_command_each_term(&server.url()).await;
}
