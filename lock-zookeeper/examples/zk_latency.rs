//! Latency of the ZooKeeper backend next to the raw protocol floor on the same server:
//!
//! - acquire + release of an uncontended lock vs raw create (ephemeral sequential) + delete;
//! - hand-off (release sent -> the waiting client holds the lock) vs raw delete -> the
//!   predecessor watch fires and the waiter's children listing shows it first.
//!
//! `cargo run -p lock-zookeeper --example zk_latency [ITERATIONS]` starts a throwaway
//! standalone server (java + the Debian `zookeeper` package), or uses `ZK_HOSTS`
//! (`host:port,…`) when set. Prints p50 / p99 / p99.9 / max in microseconds. Timing only;
//! nothing is asserted.

use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use lab::harness::ZkServer;
use lock_core::{DistributedLockExt, LockName, LockOptions};
use lock_zookeeper::{lock_dir, ZkConfig, ZkLock};
use tokio::time::Instant;
use zookeeper_client as zk;

const BASE: &str = "/bench";

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn record(h: &mut Histogram<u64>, elapsed: Duration) {
    h.saturating_record(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
}

fn row(label: &str, h: &Histogram<u64>) {
    println!(
        "| {label:<40} | {:>7} | {:>7} | {:>7} | {:>7} | {:>6} |",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
        h.len()
    );
}

async fn raw_client(hosts: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .expect("raw client connects")
}

async fn lock_client(hosts: &str) -> lock_zookeeper::ZkLock {
    let mut config = ZkConfig::new(hosts.split(','));
    config.prefix = BASE.to_owned();
    let mut options = LockOptions::default();
    options.ttl = Duration::from_secs(10);
    config.options = options;
    ZkLock::connect(config).await.expect("lock client connects")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let (_server, hosts) = match std::env::var("ZK_HOSTS") {
        Ok(hosts) => (None, hosts),
        Err(_) => {
            let server = ZkServer::start().await.expect("start a ZooKeeper server");
            let hosts = server.connect_string();
            (Some(server), hosts)
        }
    };
    let open = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let dirs = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());

    // Raw floor: create ephemeral sequential + delete.
    let raw = raw_client(&hosts).await;
    let raw_dir = format!("{BASE}-raw");
    let _ = raw.create(&raw_dir, &[], &dirs).await;
    // Warm the server (JIT) up before measuring anything.
    for _ in 0..iterations.max(200) {
        let (_, seq) = raw
            .create(&format!("{raw_dir}/n-"), &[], &open)
            .await
            .expect("create");
        raw.delete(&format!("{raw_dir}/n-{seq}"), None)
            .await
            .expect("delete");
    }
    let mut raw_cycle = histogram();
    for _ in 0..iterations {
        let started = Instant::now();
        let (_, seq) = raw
            .create(&format!("{raw_dir}/n-"), &[], &open)
            .await
            .expect("create");
        raw.delete(&format!("{raw_dir}/n-{seq}"), None)
            .await
            .expect("delete");
        record(&mut raw_cycle, started.elapsed());
    }

    // distlock: acquire + release, uncontended.
    let a = Arc::new(lock_client(&hosts).await);
    let b = Arc::new(lock_client(&hosts).await);
    let name = LockName::new("bench-uncontended").expect("name");
    let mut cycle = histogram();
    for _ in 0..iterations {
        let started = Instant::now();
        let guard = a.lock(name.as_str()).await.expect("acquire");
        guard.release().await.expect("release");
        record(&mut cycle, started.elapsed());
    }

    // Raw hand-off: A's node deleted -> B's predecessor watch fires and B sees itself first.
    let other = raw_client(&hosts).await;
    let mut raw_handoff = histogram();
    for _ in 0..iterations {
        let (_, first) = raw
            .create(&format!("{raw_dir}/n-"), &[], &open)
            .await
            .expect("create");
        let (_, second) = other
            .create(&format!("{raw_dir}/n-"), &[], &open)
            .await
            .expect("create");
        let first = format!("n-{first}");
        let (_, _, watcher) = other
            .get_and_watch_data(&format!("{raw_dir}/{first}"))
            .await
            .expect("watch");
        let started = Instant::now();
        raw.delete(&format!("{raw_dir}/{first}"), None)
            .await
            .expect("delete");
        watcher.changed().await;
        let children = other.list_children(&raw_dir).await.expect("list");
        record(&mut raw_handoff, started.elapsed());
        assert_eq!(children.len(), 1);
        other
            .delete(&format!("{raw_dir}/n-{second}"), None)
            .await
            .expect("delete");
    }

    // distlock hand-off: release sent -> the queued waiter on another client holds it.
    let name = LockName::new("bench-handoff").expect("name");
    let dir = lock_dir(BASE, &name);
    let mut handoff = histogram();
    for _ in 0..iterations {
        let guard = a.lock(name.as_str()).await.expect("acquire");
        let waiter = tokio::spawn({
            let (b, name) = (Arc::clone(&b), name.clone());
            async move {
                let guard = b.lock(name.as_str()).await.expect("waiter acquires");
                (Instant::now(), guard)
            }
        });
        // Timing starts once the waiter is queued and watching.
        let queued_by = Instant::now() + Duration::from_secs(10);
        while raw.list_children(&dir).await.map_or(0, |c| c.len()) < 2 {
            assert!(Instant::now() < queued_by, "waiter never queued");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let started = Instant::now();
        guard.release().await.expect("release");
        let (acquired_at, next) = waiter.await.expect("waiter task");
        record(&mut handoff, acquired_at - started);
        next.release().await.expect("release");
    }

    println!("ZooKeeper {hosts}, {iterations} iterations, microseconds\n");
    println!(
        "| {:<40} | {:>7} | {:>7} | {:>7} | {:>7} | {:>6} |",
        "operation", "p50", "p99", "p99.9", "max", "n"
    );
    println!(
        "|{}|---------|---------|---------|---------|--------|",
        "-".repeat(42)
    );
    row("raw create(eph-seq) + delete", &raw_cycle);
    row("distlock acquire + release", &cycle);
    row("raw hand-off (delete -> watch + list)", &raw_handoff);
    row("distlock hand-off (release -> held)", &handoff);
}
