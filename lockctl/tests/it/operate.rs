//! `lockctl status`, `list` and `break` against real servers of every backend (and a dual
//! lock), and `run`'s flock conventions (-n, -w, -E, -c, --ttl, exit codes, environment)
//! against a real Redis.
//!
//! A holder and a waiter run in this process through the library; lockctl runs as its
//! own process, as an operator would run it.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use distlock::{DistributedLock, DistributedLockExt, LockState, LostReason, ReleaseOutcome};
use harness::{or_skip, EtcdServer, PostgresServer, RedisNodes, RedisServer, ZkServer};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::time::{timeout, Instant};

use crate::common::{lockctl, text};

/// The holders' lease: the broken one notices at its next renewal, a third of it.
const TTL: &str = "3s";
/// Bound on every wait for a lock.
const WAIT: Duration = Duration::from_secs(30);

/// The JSON that `output` printed, which must have exited with `code`.
fn json(output: &Output, code: i32) -> Value {
    assert_eq!(output.status.code(), Some(code), "{}", text(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(output)))
}

/// Whether the owner token `shown` is `guard`'s (a dual lock stores it behind its mark).
fn is_owner(shown: &Value, guard: &distlock::LockGuard) -> bool {
    shown
        .as_str()
        .is_some_and(|shown| shown.ends_with(guard.owner_token().as_str()))
}

/// `status`, `list` and `break` on the lock service at `url` (without a query).
async fn operate(url: &str) {
    let locked_url = format!("{url}?ttl={TTL}");
    let connect = |url: String| async move {
        let client: Arc<dyn DistributedLock> =
            distlock::connect(&url).await.expect("connect a client");
        client
    };
    let holder = connect(locked_url.clone()).await;
    let waiter = connect(locked_url.clone()).await;
    let prefix = format!("ops/{}/", uuid::Uuid::new_v4().simple());
    let name = format!("{prefix}nightly-backup");
    let guard = holder.lock(&name).await.expect("acquire");
    let waiting = {
        let (waiter, name) = (Arc::clone(&waiter), name.clone());
        tokio::spawn(async move { waiter.lock_timeout(&name, WAIT).await })
    };

    // status: the holder, then the waiter once it queued.
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let seen = json(&lockctl(url, &["status", &name, "--json"]).await, 0);
        if seen["waiters"].as_array().is_some_and(|w| w.len() == 1) || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(seen["name"], name.as_str(), "{seen}");
    assert_eq!(seen["held"], true, "{seen}");
    assert!(is_owner(&seen["holder"]["owner_token"], &guard), "{seen}");
    let shown_token = seen["holder"]["fencing_token"].as_u64();
    assert!(
        shown_token.is_none_or(|t| t <= guard.fencing_token().get()),
        "{seen}"
    );
    assert!(
        seen["holder"]["lease_left_ms"]
            .as_u64()
            .is_none_or(|ms| ms <= 3000),
        "{seen}"
    );
    assert_eq!(seen["waiters"].as_array().map(Vec::len), Some(1), "{seen}");
    let human = lockctl(url, &["status", &name]).await;
    assert_eq!(human.status.code(), Some(0), "{}", text(&human));
    let stdout = String::from_utf8_lossy(&human.stdout);
    assert!(stdout.starts_with(&format!("{name}: held\n")), "{stdout}");
    assert!(stdout.contains(guard.owner_token().as_str()), "{stdout}");
    assert!(stdout.contains("waiters: 1, in queue order:"), "{stdout}");

    // list: the held name under its prefix, with its holder in the long form.
    let listed = json(&lockctl(url, &["list", &prefix, "--json"]).await, 0);
    assert_eq!(listed, serde_json::json!([{ "name": name }]), "{listed}");
    let long = lockctl(url, &["list", "-l", &prefix]).await;
    let stdout = String::from_utf8_lossy(&long.stdout);
    assert!(
        stdout.starts_with(&name) && stdout.contains(guard.owner_token().as_str()),
        "{}",
        text(&long)
    );
    let other = format!("ops/{}/", uuid::Uuid::new_v4().simple());
    let empty = json(&lockctl(url, &["list", &other, "--json"]).await, 0);
    assert_eq!(empty, serde_json::json!([]), "{empty}");

    // break without --force touches nothing.
    let refused = lockctl(url, &["break", &name]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--force"),
        "{}",
        text(&refused)
    );
    let would = json(&lockctl(url, &["break", &name, "--json"]).await, 2);
    assert!(is_owner(&would["holder"]["owner_token"], &guard), "{would}");
    assert_eq!(guard.state(), LockState::Held);

    // break --force: the waiter gets the lock at once, the broken guard is Lost: Broken.
    let broken = json(
        &lockctl(url, &["break", &name, "--force", "--json"]).await,
        0,
    );
    assert!(
        is_owner(&broken["broken"]["owner_token"], &guard),
        "{broken}"
    );
    let successor = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter gets the broken lock promptly")
        .expect("waiter task")
        .expect("waiter acquires");
    let reason = timeout(
        Duration::from_secs(3) + Duration::from_secs(5),
        guard.lost(),
    )
    .await
    .expect("the broken guard turns Lost by its next renewal");
    assert_eq!(reason.without_side(), LostReason::Broken, "{reason}");
    let seen = json(&lockctl(url, &["status", &name, "--json"]).await, 0);
    assert!(
        is_owner(&seen["holder"]["owner_token"], &successor),
        "{seen}"
    );
    assert_eq!(
        successor.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));

    // A free name: status exits 3, break finds nothing.
    let free = lockctl(url, &["status", &name]).await;
    assert_eq!(free.status.code(), Some(3), "{}", text(&free));
    assert!(
        String::from_utf8_lossy(&free.stdout).starts_with(&format!("{name}: free")),
        "{}",
        text(&free)
    );
    let nothing = json(
        &lockctl(url, &["break", &name, "--force", "--json"]).await,
        3,
    );
    assert_eq!(nothing["broken"], Value::Null, "{nothing}");
    let listed = json(&lockctl(url, &["list", &prefix, "--json"]).await, 0);
    assert_eq!(listed, serde_json::json!([]), "{listed}");

    // Bad input: a typed error, exit 1.
    let bad = lockctl(url, &["status", ""]).await;
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
}

/// Runs `lockctl ARGS...` with no `--url` and no `LOCK_URL`, its runtime directory
/// `runtime` (so the machine-local default is `runtime/distlock`).
async fn lockctl_local(runtime: &std::path::Path, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command
        .env_remove("LOCK_URL")
        .env("XDG_RUNTIME_DIR", runtime)
        .args(args)
        .kill_on_drop(true);
    timeout(crate::common::LOCKCTL_WAIT, command.output())
        .await
        .expect("lockctl ends in time")
        .expect("lockctl runs")
}

/// With no `--url` and no `LOCK_URL`, the commands that look at locks use the
/// machine-local directory (a free name is free there: exit 3), except `migration`,
/// which needs the migration's URL (exit 2); `memory://` (which sees this process's locks
/// alone) is a usage error, not a confident "free".
#[tokio::test]
async fn operator_commands_use_the_machine_local_directory() {
    let runtime = tempfile::tempdir().expect("a runtime directory");
    for (args, code) in [
        (&["status", "x"][..], 3),
        (&["list"][..], 0),
        (&["break", "x", "--force"][..], 3),
        (&["leader", "x"][..], 3),
    ] {
        let output = lockctl_local(runtime.path(), args).await;
        assert_eq!(
            output.status.code(),
            Some(code),
            "{args:?}: {}",
            text(&output)
        );
    }
    let migration = ["migration", "check", "--step", "old-to-dual", "x"];
    let output = lockctl_local(runtime.path(), &migration).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--url or set LOCK_URL"),
        "{}",
        text(&output)
    );
    let commands: [&[&str]; 6] = [
        &["status", "x"],
        &["list"],
        &["break", "x", "--force"],
        &["leader", "x"],
        &["observe", "x"],
        &migration,
    ];
    for args in commands {
        let output = lockctl("memory://", args).await;
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", text(&output));
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("memory://"),
            "{}",
            text(&output)
        );
    }
}

/// With no `--url` and no `LOCK_URL`, the commands that take a lock use the
/// machine-local directory: two lockctl processes exclude each other there, and so do
/// lockctl and flock(1) on the lock's file; `memory://` given on purpose still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_commands_without_a_url_exclude_on_this_machine() {
    let runtime = tempfile::tempdir().expect("a runtime directory");
    let ran = runtime.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let run = ["run", "-n", "nightly", "-c", touch.as_str()];
    let output = lockctl_local(runtime.path(), &run).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(ran.exists(), "run ran its command");
    std::fs::remove_file(&ran).expect("reset");

    let holding = {
        let runtime = runtime.path().to_owned();
        tokio::spawn(
            async move { lockctl_local(&runtime, &["hold", "nightly", "--for", "3s"]).await },
        )
    };
    let lock_file = runtime.path().join("distlock/nightly");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let flock = std::process::Command::new("flock")
            .args(["-n"])
            .arg(&lock_file)
            .arg("true")
            .status()
            .expect("flock(1) runs");
        if flock.code() == Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "lockctl hold never held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for args in [
        &run[..],
        &["try", "nightly"][..],
        &["elect", "-n", "nightly", "-c", touch.as_str()][..],
    ] {
        let output = lockctl_local(runtime.path(), args).await;
        assert_eq!(
            output.status.code(),
            Some(75),
            "{args:?}: {}",
            text(&output)
        );
    }
    assert!(!ran.exists(), "a command ran beside the holder");
    let held = holding.await.expect("hold task");
    assert_eq!(held.status.code(), Some(0), "{}", text(&held));
    let output = lockctl_local(runtime.path(), &["try", "nightly"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));

    // Named on purpose, the process-local lock is taken.
    let output = lockctl("memory://", &run).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_list_and_break_on_redis() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    operate(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_list_and_break_on_redlock() {
    let Some(nodes) = or_skip(RedisNodes::start().await) else {
        return;
    };
    operate(&nodes.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_list_and_break_on_zookeeper() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    operate(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_list_and_break_on_etcd() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    operate(&format!("{}/locks", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_list_and_break_on_postgres() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    operate(&server.url()).await;
}

/// An election on etcd: `status`, `list -l` and `break` show the leader's and the
/// waiting candidate's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_values_on_etcd() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    election_values(&format!("{}/locks", server.url())).await;
}

/// The same on PostgreSQL, whose `entries` rows keep each candidate's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_values_on_postgres() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    election_values(&server.url()).await;
}

/// An election at `url` (without a query): `status`, `list -l` and `break` show the
/// leader's and the waiting candidate's values.
async fn election_values(url: &str) {
    let url = url.to_owned();
    let client = distlock::connect(&format!("{url}?ttl={TTL}"))
        .await
        .expect("connect a client");
    let other = distlock::connect(&format!("{url}?ttl={TTL}"))
        .await
        .expect("connect a client");
    let prefix = format!("ops/{}/", uuid::Uuid::new_v4().simple());
    let name = format!("{prefix}scheduler");
    let on_leader = distlock::Election::new(client, &name).expect("election");
    let on_other = distlock::Election::new(other, &name).expect("election");
    let leadership = on_leader
        .campaign_with("10.0.0.1:8080", &distlock::AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let waiting = tokio::spawn(async move {
        on_other
            .campaign_with("10.0.0.2:8080", &distlock::AcquireOptions::timeout(WAIT))
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let seen = json(&lockctl(&url, &["status", &name, "--json"]).await, 0);
        if seen["waiters"].as_array().is_some_and(|w| w.len() == 1) || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(seen["holder"]["value"], "10.0.0.1:8080", "{seen}");
    assert_eq!(
        seen["holder"]["fencing_token"].as_u64(),
        Some(leadership.term().get()),
        "{seen}"
    );
    assert_eq!(seen["waiters"][0]["value"], "10.0.0.2:8080", "{seen}");
    let human = lockctl(&url, &["status", &name]).await;
    let stdout = String::from_utf8_lossy(&human.stdout);
    assert!(stdout.contains(r#"value "10.0.0.1:8080""#), "{stdout}");
    assert!(stdout.contains(r#"value "10.0.0.2:8080""#), "{stdout}");
    let long = lockctl(&url, &["list", "-l", &prefix]).await;
    let stdout = String::from_utf8_lossy(&long.stdout);
    assert!(
        stdout.starts_with(&name) && stdout.contains(r#"value "10.0.0.1:8080""#),
        "{}",
        text(&long)
    );
    let broken = json(
        &lockctl(&url, &["break", &name, "--force", "--json"]).await,
        0,
    );
    assert_eq!(broken["broken"]["value"], "10.0.0.1:8080", "{broken}");
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting candidate leads after the break")
        .expect("campaign task")
        .expect("campaign")
        .expect("leads");
    let seen = json(&lockctl(&url, &["status", &name, "--json"]).await, 0);
    assert_eq!(seen["holder"]["value"], "10.0.0.2:8080", "{seen}");
    next.resign().await.expect("resign");
    drop(leadership);
}

/// `hold` and `try` on the lock service at `url` (without a query): `try` is turned away
/// (75, or -E) while `hold` holds, and takes and releases the lock once it is free.
async fn hold_and_try(url: &str) {
    let name = format!("hold/{}", uuid::Uuid::new_v4().simple());
    let holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--url", url, "hold", "--ttl", TTL, &name, "--for", "4s"])
        .kill_on_drop(true)
        .output();
    let holder = tokio::spawn(holder);
    let deadline = Instant::now() + WAIT;
    while lockctl(url, &["status", &name]).await.status.code() != Some(0) {
        assert!(Instant::now() < deadline, "lockctl hold never held {name}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let busy = lockctl(url, &["try", &name]).await;
    assert_eq!(busy.status.code(), Some(75), "{}", text(&busy));
    let busy = lockctl(url, &["try", "-E", "9", &name]).await;
    assert_eq!(busy.status.code(), Some(9), "{}", text(&busy));
    let held = timeout(WAIT, holder)
        .await
        .expect("hold ends after --for")
        .expect("task")
        .expect("lockctl hold");
    assert_eq!(held.status.code(), Some(0), "{}", text(&held));
    let free = lockctl(url, &["try", &name]).await;
    assert_eq!(free.status.code(), Some(0), "{}", text(&free));
    let after = lockctl(url, &["status", &name]).await;
    assert_eq!(
        after.status.code(),
        Some(3),
        "try released it: {}",
        text(&after)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_and_try_on_postgres() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    hold_and_try(&server.url()).await;
}

/// `run`'s flock conventions, on a real Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_follows_flock_conventions() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let url = server.url();
    let name = format!("flock/{}", uuid::Uuid::new_v4().simple());
    let run = |args: &'static [&'static str]| {
        let (url, name) = (url.clone(), name.clone());
        async move {
            let mut all = vec!["run"];
            all.extend_from_slice(args);
            let split = all.iter().position(|a| *a == "NAME").expect("a NAME slot");
            all[split] = &name;
            lockctl(&url, &all).await
        }
    };

    // The command's environment and exit status, with the command after the name.
    let output = run(&[
        "NAME",
        "sh",
        "-c",
        "echo \"$DISTLOCK_LOCK_NAME $DISTLOCK_FENCING_TOKEN\"; exit 7",
    ])
    .await;
    assert_eq!(output.status.code(), Some(7), "{}", text(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    let (shown_name, token) = printed.trim().split_once(' ').expect("name and token");
    assert_eq!(shown_name, name);
    assert!(token.parse::<u64>().is_ok(), "{printed}");
    // -c: a shell command line; death by signal N is 128 + N.
    let output = run(&["-c", "kill -TERM $$", "NAME"]).await;
    assert_eq!(output.status.code(), Some(128 + 15), "{}", text(&output));
    // Not found; found but not executable (a directory).
    let output = run(&["NAME", "/nonexistent/command"]).await;
    assert_eq!(output.status.code(), Some(127), "{}", text(&output));
    let output = run(&["NAME", "--", "/"]).await;
    assert_eq!(output.status.code(), Some(126), "{}", text(&output));

    // -w 0 is -n: a free lock is taken.
    let output = run(&["-w", "0", "NAME", "true"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));

    // Held elsewhere: -n fails at once, -E picks the code, -w waits that long.
    let client = distlock::connect(&url).await.expect("connect");
    let held = client.lock(&name).await.expect("acquire");
    let started = Instant::now();
    let output = run(&["-n", "NAME", "true"]).await;
    assert_eq!(output.status.code(), Some(75), "{}", text(&output));
    let output = run(&["-n", "-E", "9", "NAME", "true"]).await;
    assert_eq!(output.status.code(), Some(9), "{}", text(&output));
    let output = run(&["-w", "0", "NAME", "true"]).await;
    assert_eq!(output.status.code(), Some(75), "{}", text(&output));
    let waited_from = Instant::now();
    let output = run(&["-w", "0.5", "NAME", "true"]).await;
    assert_eq!(output.status.code(), Some(75), "{}", text(&output));
    assert!(waited_from.elapsed() >= Duration::from_millis(500));
    assert!(started.elapsed() < WAIT);
    held.release().await.expect("release");

    // --ttl: the lease the server keeps is the one asked for. The command runs until
    // lockctl forwards it a SIGTERM.
    let mut holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--url", &url, "run", "--ttl", "4s", &name, "--", "sleep", "60",
        ])
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl starts");
    let deadline = Instant::now() + WAIT;
    let lease = loop {
        let seen = lockctl(&url, &["status", &name, "--json"]).await;
        if seen.status.code() == Some(0) {
            break json(&seen, 0)["holder"]["lease_left_ms"].as_u64();
        }
        assert!(Instant::now() < deadline, "lockctl run never held {name}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lease = lease.expect("Redis shows the lease left");
    assert!((1000..=4000).contains(&lease), "lease left {lease} ms");
    let pid = Pid::from_raw(i32::try_from(holder.id().expect("pid")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("signal lockctl");
    let status = timeout(WAIT, holder.wait())
        .await
        .expect("lockctl ends after the signal")
        .expect("wait for lockctl");
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command's death by SIGTERM"
    );
}
