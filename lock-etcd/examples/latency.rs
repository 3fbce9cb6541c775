//! Latency of the etcd backend next to the raw protocol floor on the same server.
//!
//! Starts a throwaway single-member etcd on a free loopback port (or uses
//! `ETCD_ENDPOINT=host:port` if set) and prints p50 / p99 / max of:
//! - raw: one put-if-absent transaction with a lease, then one delete (the floor of an
//!   uncontended acquire + release);
//! - acquire + release: `try_lock` then `release` through distlock;
//! - raw push: a delete until a watcher on the key sees the event (the floor of a
//!   hand-off);
//! - hand-off: release sent until the queued waiter (another client) holds the lock.
//!
//! ```text
//! cargo run --release -p lock-etcd --example latency [ITERATIONS]
//! ```

use std::time::Duration;

use conformance::harness::{or_skip, EtcdServer};
use etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use hdrhistogram::Histogram;
use lock_core::{DistributedLockExt, LockOptions};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::time::{sleep, Instant};

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn histogram() -> Result<Histogram<u64>, Failure> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

fn record(histogram: &mut Histogram<u64>, elapsed: Duration) -> Result<(), Failure> {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    histogram.record(micros.max(1))?;
    Ok(())
}

fn report(what: &str, histogram: &Histogram<u64>) {
    let ms = |micros: u64| micros as f64 / 1000.0;
    println!(
        "| {what:<32} | {:>6} | {:>8.3} | {:>8.3} | {:>8.3} |",
        histogram.len(),
        ms(histogram.value_at_quantile(0.5)),
        ms(histogram.value_at_quantile(0.99)),
        ms(histogram.max()),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Failure> {
    let iterations: u64 = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 1000,
    };
    let hand_offs = (iterations / 4).max(10);
    let _server;
    let endpoint = match std::env::var("ETCD_ENDPOINT") {
        Ok(endpoint) => endpoint,
        Err(_) => {
            let Some(server) = or_skip(EtcdServer::start().await) else {
                return Ok(());
            };
            let endpoint = server.addr().to_string();
            _server = server;
            endpoint
        }
    };
    let raw = Client::connect([format!("http://{endpoint}")], None).await?;
    let config = || EtcdConfig::new([endpoint.clone()]).with_prefix("bench");
    let a = EtcdBackend::connect(config().with_options(LockOptions::default())).await?;
    let b = EtcdBackend::connect(config().with_options(LockOptions::default())).await?;

    // Raw floor: put-if-absent with a lease, then delete.
    let lease = raw.lease_client().grant(30, None).await?.id();
    let mut raw_cycle = histogram()?;
    for i in 0..iterations + iterations / 10 {
        let key = format!("bench-raw/{lease:x}");
        let started = Instant::now();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        raw.kv_client().txn(txn).await?;
        raw.kv_client().delete(key.as_str(), None).await?;
        if i >= iterations / 10 {
            record(&mut raw_cycle, started.elapsed())?;
        }
    }

    // distlock: uncontended try_lock + release.
    let mut cycle = histogram()?;
    for i in 0..iterations + iterations / 10 {
        let started = Instant::now();
        let guard = a.try_lock("cycle").await?.ok_or("lock unexpectedly held")?;
        guard.release().await?;
        if i >= iterations / 10 {
            record(&mut cycle, started.elapsed())?;
        }
    }

    // Raw push floor: delete until a watcher sees it.
    let mut raw_push = histogram()?;
    let mut watch = raw
        .watch_client()
        .watch(
            "bench-push",
            Some(WatchOptions::new().with_filters([WatchFilterType::NoPut])),
        )
        .await?;
    for _ in 0..hand_offs {
        raw.kv_client().put("bench-push", "", None).await?;
        let started = Instant::now();
        raw.kv_client().delete("bench-push", None).await?;
        loop {
            let answer = watch.message().await?.ok_or("watch ended")?;
            if answer
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                break;
            }
        }
        record(&mut raw_push, started.elapsed())?;
    }

    // distlock hand-off: release sent until the queued waiter holds the lock.
    let b = std::sync::Arc::new(b);
    let mut hand_off = histogram()?;
    for _ in 0..hand_offs {
        let held = a.lock("handoff").await?;
        let waiter = tokio::spawn({
            let b = std::sync::Arc::clone(&b);
            async move {
                let guard = b.lock("handoff").await;
                (Instant::now(), guard)
            }
        });
        // Let the waiter queue and watch its predecessor.
        sleep(Duration::from_millis(15)).await;
        let released = Instant::now();
        held.release().await?;
        let (acquired, guard) = waiter.await?;
        record(&mut hand_off, acquired.saturating_duration_since(released))?;
        guard?.release().await?;
    }

    println!("etcd at {endpoint}, {iterations} cycles, {hand_offs} hand-offs (ms)\n");
    println!("| operation                        |      n |      p50 |      p99 |      max |");
    println!("|----------------------------------|--------|----------|----------|----------|");
    report("raw txn put + delete", &raw_cycle);
    report("distlock try_lock + release", &cycle);
    report("raw delete -> watch event", &raw_push);
    report("distlock hand-off", &hand_off);
    Ok(())
}
