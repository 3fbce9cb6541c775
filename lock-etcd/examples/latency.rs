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
//! The `contention` mode instead runs CLIENTS clients (default 8), each in a loop of
//! `lock` + `release` on ONE name for SECONDS seconds (default 3), and prints the cycles
//! per second, p50 / p99 / max of one cycle (queueing included), and of the hand-off
//! under contention (release sent until the next holder has the lock).
//!
//! ```text
//! cargo run --release -p lock-etcd --example latency [ITERATIONS]
//! cargo run --release -p lock-etcd --example latency contention [CLIENTS [SECONDS]]
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use hdrhistogram::Histogram;
use lab::harness::{or_skip, EtcdServer};
use lock_core::{DistributedLockExt, LockOptions};
use lock_etcd::{EtcdConfig, EtcdLock};
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let contention = args.first().is_some_and(|arg| arg == "contention");
    let iterations: u64 = match args.first() {
        Some(n) if !contention => n.parse()?,
        _ => 1000,
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
    let config = || EtcdConfig::new([endpoint.clone()]).with_prefix("bench");
    if contention {
        let clients = match args.get(1) {
            Some(n) => n.parse()?,
            None => 8,
        };
        let seconds = match args.get(2) {
            Some(n) => n.parse()?,
            None => 3.0,
        };
        let mut locks = Vec::with_capacity(clients);
        for _ in 0..clients {
            locks.push(EtcdLock::connect(config().with_options(LockOptions::default())).await?);
        }
        println!("etcd at {endpoint}");
        return run_contention(locks, Duration::from_secs_f64(seconds)).await;
    }
    let raw = Client::connect([format!("http://{endpoint}")], None).await?;
    let a = EtcdLock::connect(config().with_options(LockOptions::default())).await?;
    let b = EtcdLock::connect(config().with_options(LockOptions::default())).await?;

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

/// Every client loops `lock` + `release` on one name until `length` has passed.
async fn run_contention(locks: Vec<EtcdLock>, length: Duration) -> Result<(), Failure> {
    let clients = locks.len();
    // When the last release was sent: the next holder's hand-off is measured from it.
    let released: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let started = Instant::now();
    let until = started + length;
    let mut tasks = Vec::with_capacity(clients);
    for lock in locks {
        let released = Arc::clone(&released);
        tasks.push(tokio::spawn(async move {
            let mut cycles = histogram()?;
            let mut hand_offs = histogram()?;
            while Instant::now() < until {
                let cycle = Instant::now();
                let guard = lock.lock("contended").await?;
                let acquired = Instant::now();
                let last = released
                    .lock()
                    .map_err(|_| "poisoned")?
                    .take()
                    .filter(|at| *at >= cycle);
                if let Some(at) = last {
                    record(&mut hand_offs, acquired.saturating_duration_since(at))?;
                }
                *released.lock().map_err(|_| "poisoned")? = Some(Instant::now());
                guard.release().await?;
                record(&mut cycles, cycle.elapsed())?;
            }
            Ok::<_, Failure>((cycles, hand_offs))
        }));
    }
    let mut cycles = histogram()?;
    let mut hand_offs = histogram()?;
    for task in tasks {
        let (c, h) = task.await??;
        cycles.add(c)?;
        hand_offs.add(h)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{clients} clients on one name for {elapsed:.1} s: {} cycles, {:.1} cycles/s (ms)\n",
        cycles.len(),
        cycles.len() as f64 / elapsed,
    );
    println!("| operation                        |      n |      p50 |      p99 |      max |");
    println!("|----------------------------------|--------|----------|----------|----------|");
    report("contended lock + release", &cycles);
    report("contended hand-off", &hand_offs);
    Ok(())
}
