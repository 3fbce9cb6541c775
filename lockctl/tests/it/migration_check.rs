//! `lockctl migration check` against a real ZooKeeper (old side) and Redis (new side): it
//! reports an old-only holder before `dual-to-new` and a new-only holder before
//! `dual-to-old`, nothing once they are gone or when only dual clients hold, and that a
//! name a new-only client took can no longer go back to old-only (its token gap).

use std::process::Output;

use distlock::DistributedLockExt;
use harness::{or_skip, RedisServer, ZkServer};

use crate::common::{lockctl, text};

/// Runs `lockctl --url URL migration check --step STEP --watch 600ms NAME [--json]`.
async fn check(url: &str, step: &str, name: &str, json: bool) -> Output {
    let mut args = vec![
        "migration",
        "check",
        "--step",
        step,
        "--watch",
        "600ms",
        "--interval",
        "100ms",
        name,
    ];
    if json {
        args.push("--json");
    }
    lockctl(url, &args).await
}

#[tokio::test]
async fn check_reports_single_side_clients_until_they_stop() {
    let Some(zk) = or_skip(ZkServer::start().await) else {
        return;
    };
    let Some(redis) = or_skip(RedisServer::start().await) else {
        return;
    };
    let (old_url, new_url) = (format!("{}/migration-check", zk.url()), redis.url());
    let dual_url = format!("dual:{old_url}|{new_url}");
    let name = format!("check-{}", uuid::Uuid::new_v4().simple());
    let old_only = distlock::connect(&old_url).await.expect("zk client");
    let dual = distlock::connect(&dual_url).await.expect("dual client");
    let new_only = distlock::connect(&new_url).await.expect("redis client");

    let held = old_only.lock(&name).await.unwrap();
    let output = check(&dual_url, "dual-to-new", &name, false).await;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("NOT clear"), "{}", text(&output));
    assert!(
        stdout.contains("old-only Holder") && stdout.contains("from session 0x"),
        "{}",
        text(&output)
    );
    assert!(
        stdout.contains(held.owner_token().as_str()),
        "{}",
        text(&output)
    );
    held.release().await.unwrap();

    let held = dual.lock(&name).await.unwrap();
    for step in ["dual-to-new", "dual-to-old"] {
        let output = check(&dual_url, step, &name, false).await;
        assert_eq!(output.status.code(), Some(0), "{step}: {}", text(&output));
    }
    held.release().await.unwrap();

    let held = new_only.lock(&name).await.unwrap();
    let output = check(&dual_url, "dual-to-old", &name, true).await;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(&output)));
    assert_eq!(report["unmarked"][0]["side"], "new", "{report}");
    assert_eq!(report["unmarked"][0]["role"], "holder", "{report}");
    held.release().await.unwrap();

    // The new-only holder is gone, but its token came from the Redis clock, far above
    // ZooKeeper's zxids: a step back to old-only could hand out lower tokens.
    let output = check(&dual_url, "dual-to-old", &name, true).await;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["unmarked"], serde_json::json!([]), "{report}");
    assert_eq!(report["token_gaps"][0]["name"], name.as_str(), "{report}");
    let output = check(&dual_url, "dual-to-new", &name, false).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let output = check(&old_url, "dual-to-old", &name, false).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("dual:"),
        "{}",
        text(&output)
    );
}
