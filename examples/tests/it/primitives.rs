//! The examples of each primitive (`semaphore`, `semaphore_many`, `rwlock`, `multi_lock`,
//! `leader`) as a user runs them, on `memory://` and on a real Redis server: each exits 0
//! (having closed its client) and prints what it teaches.
//!
//! Without Redis the tests on it print a loud notice and pass, unless
//! `LOCK_TEST_STRICT=1`, where they fail.

use std::future::Future;

use harness::{or_skip, RedisServer};

use crate::run::{example, stdout};

/// Runs `check` on the URL of a fresh Redis server.
async fn on_redis<F: Future<Output = ()>>(check: impl FnOnce(String) -> F) {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    check(server.url()).await;
}

/// Six jobs, two permits: each job encodes and writes with its permit's token, and two
/// encode at once, never more.
async fn semaphore(url: String) {
    let printed = stdout(&example(env!("CARGO_BIN_EXE_semaphore"), &url).await);
    assert_eq!(
        printed.matches(": encoding with permit token").count(),
        6,
        "{printed}"
    );
    assert_eq!(printed.matches(": write Ok(())").count(), 6, "{printed}");
    assert!(
        printed.contains("6 jobs encoded, at most 2 at once with 2 permits"),
        "{printed}"
    );
}

/// A training run takes 3 of 4 GPUs in one hold among inference jobs taking 1, never more
/// than 4 in use; the pool then grows to 6, taken in one hold.
async fn semaphore_many(url: String) {
    let printed = stdout(&example(env!("CARGO_BIN_EXE_semaphore_many"), &url).await);
    assert_eq!(
        printed.matches("training: 3 GPUs in one hold").count(),
        1,
        "{printed}"
    );
    assert_eq!(printed.matches(": 1 GPU, token").count(), 6, "{printed}");
    let most: u32 = printed
        .split_once("at most ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .expect("the most in use");
    assert!((3..=4).contains(&most), "{printed}");
    assert!(
        printed.contains("grown to 6 GPUs: all in one hold"),
        "{printed}"
    );
}

/// The writer's fenced write is accepted, it downgrades, and the three readers that
/// queued behind it all read what it wrote; the checker reads beside a reader, upgrades
/// and its fenced write is accepted.
async fn rwlock(url: String) {
    let printed = stdout(&example(env!("CARGO_BIN_EXE_rwlock"), &url).await);
    for line in [
        "writer: wrote version 2 with token",
        "writer: downgraded to a reader",
        "released: readers and writer done",
        "checker: reads version 2 beside another reader",
        "checker: upgraded, wrote version 3 with token",
    ] {
        assert!(printed.contains(line), "{line}:\n{printed}");
    }
    assert_eq!(printed.matches(": Ok(())").count(), 2, "{printed}");
    assert_eq!(printed.matches(": read version 2").count(), 3, "{printed}");
    assert!(!printed.contains("version 1"), "{printed}");
}

/// Four transfers both ways, each holding both accounts: every fenced write accepted,
/// and the balances come out as the transfers add up.
async fn multi_lock(url: String) {
    let printed = stdout(&example(env!("CARGO_BIN_EXE_multi_lock"), &url).await);
    assert_eq!(printed.matches("(Ok(()), Ok(()))").count(), 4, "{printed}");
    assert!(
        printed.contains("alice 100, bob 100, total 200"),
        "{printed}"
    );
}

/// Three candidates each lead once, in increasing terms, writing the schedule fenced with
/// their term, and step down.
async fn leader(url: String) {
    let printed = stdout(&example(env!("CARGO_BIN_EXE_leader"), &url).await);
    assert_eq!(printed.matches("stepped down").count(), 3, "{printed}");
    let terms: Vec<u64> = printed
        .lines()
        .filter_map(|line| line.split_once(": leading, term ")?.1.split(',').next())
        .map(|term| term.parse().expect("a term"))
        .collect();
    assert_eq!(terms.len(), 3, "{printed}");
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    assert_eq!(
        printed.matches("schedule written: Ok(())").count(),
        3,
        "{printed}"
    );
}

/// Two services take turns: every compaction's write is accepted in a rising term, each
/// service leads at least twice, and both end after resigning.
async fn leader_service(url: String) {
    let printed = stdout(&example(env!("CARGO_BIN_EXE_leader_service"), &url).await);
    let terms: Vec<u64> = printed
        .lines()
        .filter_map(|line| line.strip_prefix("compaction in term ")?.split(':').next())
        .map(|term| term.parse().expect("a term"))
        .collect();
    assert!(terms.len() >= 4, "{printed}");
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    assert_eq!(
        printed.matches(": Ok(())").count(),
        terms.len(),
        "{printed}"
    );
    for n in 1..=2 {
        let elected = printed
            .lines()
            .filter(|line| line.contains(&format!("-{n}: elected")))
            .count();
        assert!(elected >= 2, "service {n} led {elected} terms: {printed}");
    }
    assert_eq!(
        printed.matches("service ended after").count(),
        2,
        "{printed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_service_on_memory() {
    leader_service("memory://".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_service_on_redis() {
    on_redis(leader_service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_on_memory() {
    semaphore("memory://".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_on_redis() {
    on_redis(semaphore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_many_on_memory() {
    semaphore_many("memory://".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_many_on_redis() {
    on_redis(semaphore_many).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_on_memory() {
    rwlock("memory://".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_on_redis() {
    on_redis(rwlock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_on_memory() {
    multi_lock("memory://".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_on_redis() {
    on_redis(multi_lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_on_memory() {
    leader("memory://".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_on_redis() {
    on_redis(leader).await;
}
