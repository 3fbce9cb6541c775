//! Latency of `redis://` and `redlock://` locks next to the raw protocol floor on the same
//! servers.
//!
//! Starts throwaway redis-servers on free loopback ports (the conformance harness) and
//! measures, over `ITERATIONS` (default 2000, env `ITERATIONS`):
//! - `redis` (one server):
//!   - uncontended acquire + release: `try_lock` + `release` vs raw `SET NX PX` + `EVALSHA`
//!     compare-and-delete;
//!   - hand-off: from "release sent" to "the waiting client holds the lock", for a waiter
//!     woken by the library's pub/sub vs a raw waiter subscribed to the same kind of
//!     channel.
//! - `redlock` (five independent servers):
//!   - uncontended acquire + release: `try_lock` + `release` vs the raw floor, `SET NX PX`
//!     on the five servers in parallel, then `EVALSHA` compare-and-delete on the five in
//!     parallel;
//!   - hand-off of the library (no raw counterpart).
//!
//! `cargo run -p lock-redis --release --example latency [redis|redlock]` (both by default)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use hdrhistogram::Histogram;
use lab::harness::{RedisNodes, RedisOptions, RedisServer};
use lock_core::{DistributedLockExt, LockOptions};
use lock_redis::{RedisConfig, RedisLock, RedisNode};
use tokio::time::{sleep, Instant};

const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], 'released') return 1 end return 0";

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
    h.saturating_record(micros);
}

fn report(label: &str, h: &Histogram<u64>) {
    println!(
        "| {label:<44} | {:>6} | {:>8} | {:>8} | {:>8} |",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999)
    );
}

/// A client of the server at `ports[0]` (`redis://`), or RedLock over all of `ports`.
async fn client(ports: &[u16]) -> Arc<lock_redis::RedisLock> {
    let mut config = match ports {
        [port] => RedisConfig::single("127.0.0.1", *port),
        _ => RedisConfig::redlock(
            ports
                .iter()
                .map(|port| RedisNode::new("127.0.0.1", *port))
                .collect(),
        ),
    };
    config.options = LockOptions::default();
    Arc::new(RedisLock::connect(config).await.expect("connect"))
}

async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn ours_uncontended(ports: &[u16], n: usize) -> Histogram<u64> {
    let locks = client(ports).await;
    let mut h = histogram();
    for i in 0..n {
        let name = format!("bench/ours/{}", i % 16);
        let started = Instant::now();
        let guard = locks.try_lock(&name).await.expect("try").expect("free");
        guard.release().await.expect("release");
        record(&mut h, started.elapsed());
    }
    h
}

/// The raw floor: `SET NX PX`, then `EVALSHA` compare-and-delete, each sent to every
/// server in `ports` in parallel.
async fn raw_uncontended(ports: &[u16], n: usize) -> Histogram<u64> {
    let mut conns = Vec::with_capacity(ports.len());
    for port in ports {
        conns.push(raw(*port).await);
    }
    let script = redis::Script::new(RELEASE);
    let mut h = histogram();
    for i in 0..n {
        let key = format!("bench/raw/{}", i % 16);
        let token = uuid::Uuid::new_v4().to_string();
        let started = Instant::now();
        let sets = futures::future::join_all(conns.iter().map(|conn| {
            let mut conn = conn.clone();
            let (key, token) = (&key, &token);
            async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        }))
        .await;
        for set in sets {
            assert!(set.expect("SET").is_some(), "raw key free");
        }
        let releases = futures::future::join_all(conns.iter().map(|conn| {
            let mut conn = conn.clone();
            let mut invocation = script.prepare_invoke();
            invocation.key(&key).arg(&token).arg("bench/raw/channel");
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        }))
        .await;
        for released in releases {
            released.expect("EVALSHA");
        }
        record(&mut h, started.elapsed());
    }
    h
}

/// Two clients pass one lock back and forth; each release is timed to the other's grant.
async fn ours_handoff(ports: &[u16], n: usize) -> Histogram<u64> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(histogram()));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locks = client(ports).await;
        let (released_at, samples) = (Arc::clone(&released_at), Arc::clone(&samples));
        tasks.push(tokio::spawn(async move {
            for _ in 0..n / 2 {
                let guard = locks.lock("bench/handoff").await.expect("lock");
                if let Some(at) = released_at.lock().expect("mutex").take() {
                    record(&mut samples.lock().expect("mutex"), at.elapsed());
                }
                // Let the other side start waiting (not measured).
                sleep(Duration::from_millis(3)).await;
                *released_at.lock().expect("mutex") = Some(Instant::now());
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let h = samples.lock().expect("mutex").clone();
    h
}

/// The raw floor of the same hand-off: SET NX, and on failure wait for the release
/// message on a dedicated subscription, then SET NX again.
async fn raw_handoff(port: u16, n: usize) -> Histogram<u64> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(histogram()));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut conn = raw(port).await;
        let mut pubsub = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .expect("client")
            .get_async_pubsub()
            .await
            .expect("pubsub");
        pubsub
            .subscribe("bench/raw-handoff/channel")
            .await
            .expect("subscribe");
        let (released_at, samples) = (Arc::clone(&released_at), Arc::clone(&samples));
        tasks.push(tokio::spawn(async move {
            let script = redis::Script::new(RELEASE);
            let mut messages = pubsub.into_on_message();
            for _ in 0..n / 2 {
                let token = uuid::Uuid::new_v4().to_string();
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg("bench/raw-handoff")
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async(&mut conn)
                        .await
                        .expect("SET");
                    if set.is_some() {
                        break;
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(1), messages.next()).await;
                }
                if let Some(at) = released_at.lock().expect("mutex").take() {
                    record(&mut samples.lock().expect("mutex"), at.elapsed());
                }
                sleep(Duration::from_millis(3)).await;
                *released_at.lock().expect("mutex") = Some(Instant::now());
                let _: i64 = script
                    .key("bench/raw-handoff")
                    .arg(&token)
                    .arg("bench/raw-handoff/channel")
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let h = samples.lock().expect("mutex").clone();
    h
}

fn header(what: &str, n: usize) {
    println!("\n{what}, {n} iterations, microseconds\n");
    println!(
        "| {:<44} | {:>6} | {:>8} | {:>8} | {:>8} |",
        "measure", "count", "p50", "p99", "p99.9"
    );
    println!(
        "|{:-<46}|{:-<8}|{:-<10}|{:-<10}|{:-<10}|",
        "", "", "", "", ""
    );
}

async fn single(n: usize) {
    let server = RedisServer::start()
        .await
        .expect("redis-server (apt-get install redis-server)");
    let ports = [server.port()];
    // Warm up connections and script caches.
    let _ = ours_uncontended(&ports, 50).await;
    let _ = raw_uncontended(&ports, 50).await;

    header(&format!("redis-server on 127.0.0.1:{}", ports[0]), n);
    report(
        "acquire+release, lock-redis",
        &ours_uncontended(&ports, n).await,
    );
    report(
        "acquire+release, raw SET NX PX + EVALSHA",
        &raw_uncontended(&ports, n).await,
    );
    report(
        "hand-off, lock-redis (pub/sub wake-up)",
        &ours_handoff(&ports, n).await,
    );
    report(
        "hand-off, raw SET NX + SUBSCRIBE + EVALSHA",
        &raw_handoff(ports[0], n).await,
    );
    drop(server);
}

async fn redlock(n: usize) {
    let servers = RedisNodes::start_with(RedisOptions::default().members(5))
        .await
        .expect("redis-server (apt-get install redis-server)");
    let ports: Vec<u16> = servers.members().iter().map(RedisServer::port).collect();
    let _ = ours_uncontended(&ports, 50).await;
    let _ = raw_uncontended(&ports, 50).await;

    header(&format!("RedLock over {} redis-servers", ports.len()), n);
    report(
        "acquire+release, lock-redis (redlock)",
        &ours_uncontended(&ports, n).await,
    );
    report(
        "acquire+release, raw floor on 5 in parallel",
        &raw_uncontended(&ports, n).await,
    );
    report(
        "hand-off, lock-redis (redlock, pub/sub)",
        &ours_handoff(&ports, n).await,
    );
    drop(servers);
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::var("ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        "redis" => single(n).await,
        "redlock" => redlock(n).await,
        "" => {
            single(n).await;
            redlock(n).await;
        }
        other => {
            eprintln!("unknown mode `{other}`: redis or redlock (both by default)");
            std::process::exit(2);
        }
    }
}
