//! The real-server harness: every server kind starts, serves, survives faults and dies
//! with its handle. A missing server binary skips loudly (fails with LOCK_TEST_STRICT=1).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::require_server;
use harness::shared::Shared;
use harness::{
    or_skip, strict, EtcdCluster, EtcdServer, HarnessError, RedisNodes, RedisOptions, RedisServer,
    ZkEnsemble, ZkMode, ZkOptions, ZkServer,
};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const IO_TIMEOUT: Duration = Duration::from_secs(5);
const FAILOVER: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- helpers

/// Asserts the process is gone: no such pid, or (at worst) an unreaped zombie.
pub(crate) fn assert_gone(pid: u32) {
    let raw = i32::try_from(pid).expect("pid fits i32");
    match kill(Pid::from_raw(raw), None) {
        Err(Errno::ESRCH) => {}
        other => {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            assert_eq!(
                state,
                Some("Z"),
                "pid {pid} still alive ({other:?}): {stat}"
            );
        }
    }
}

/// Sends one RESP command on a fresh connection and returns the reply's first line
/// (bulk strings: their payload).
async fn redis(addr: SocketAddr, args: &[&str], timeout: Duration) -> std::io::Result<String> {
    let work = async {
        let mut stream = TcpStream::connect(addr).await?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes()).await?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        let line = line.trim_end().to_owned();
        if let Some(len) = line.strip_prefix('$') {
            let len: i64 = len.parse().map_err(std::io::Error::other)?;
            if len < 0 {
                return Ok("(nil)".to_owned());
            }
            let mut payload = vec![0_u8; usize::try_from(len).expect("len") + 2];
            reader.read_exact(&mut payload).await?;
            payload.truncate(payload.len() - 2);
            return Ok(String::from_utf8_lossy(&payload).into_owned());
        }
        Ok(line)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "redis timed out"))?
}

/// HTTP/1.0 POST with a JSON body; returns the response body.
async fn http_post(addr: SocketAddr, path: &str, body: &str) -> String {
    let work = async {
        let mut stream = TcpStream::connect(addr).await?;
        let req = format!(
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await?;
        let mut out = String::new();
        stream.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let raw = tokio::time::timeout(IO_TIMEOUT, work)
        .await
        .expect("HTTP in time")
        .expect("HTTP exchange");
    assert!(
        raw.starts_with("HTTP/1.") && raw.contains(" 200 "),
        "HTTP error: {raw}"
    );
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------- skip / strict

#[test]
fn missing_binary_skips_loudly_or_fails_when_strict() {
    let missing = || -> Result<(), HarnessError> {
        Err(HarnessError::MissingBinary {
            binary: "nonexistent-example-server".to_owned(),
            hint: "apt-get install nonexistent-example-server",
        })
    };
    let outcome = std::panic::catch_unwind(|| or_skip(missing()));
    if strict() {
        assert!(
            outcome.is_err(),
            "strict mode must fail on a missing binary"
        );
    } else {
        assert_eq!(outcome.expect("no panic when not strict"), None);
    }
    let err = missing().expect_err("missing");
    assert!(
        err.to_string()
            .contains("apt-get install nonexistent-example-server"),
        "{err}"
    );
}

#[tokio::test]
async fn start_failure_reports_the_log_tail() {
    let bad = RedisOptions::default().config_line("no-such-directive yes");
    match RedisServer::start_with(bad).await {
        Err(e) if e.is_missing_binary() => {
            or_skip::<()>(Err(e));
        }
        Err(e @ HarnessError::Exited { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("no-such-directive"),
                "log tail missing: {text}"
            );
        }
        other => panic!("expected an exit during start-up, got {other:?}"),
    }
}

// ---------------------------------------------------------------- redis

#[tokio::test]
async fn redis_serves_and_dies_with_its_handle() {
    let server = require_server!(RedisServer::start().await);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert!(server
        .log_path()
        .starts_with(server.data_dir().parent().expect("temp dir")));
    let pid = server.pid().expect("running");
    assert_eq!(
        redis(server.addr(), &["PING"], IO_TIMEOUT)
            .await
            .expect("PING"),
        "+PONG"
    );
    assert_eq!(
        redis(server.addr(), &["SET", "k", "v"], IO_TIMEOUT)
            .await
            .expect("SET"),
        "+OK"
    );
    assert_eq!(
        redis(server.addr(), &["GET", "k"], IO_TIMEOUT)
            .await
            .expect("GET"),
        "v"
    );
    drop(server);
    assert_gone(pid);
}

/// A server shared between tests ([`harness::shared::Shared`]) outlives the runtime of the test
/// that started it: it still serves from another runtime, and dropping the last handle
/// there kills and reaps it (the pid is gone, not a zombie).
#[test]
fn shared_server_outlives_its_runtime_and_dies_with_the_last_handle() {
    static SLOT: Shared<RedisServer> = Shared::new();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let start = || async { or_skip(RedisServer::start().await) };
    let first = std::thread::spawn(move || runtime().block_on(SLOT.get_or_start(start)))
        .join()
        .expect("the starting runtime's thread");
    let Some(first) = first else {
        return;
    };
    let pid = first.pid().expect("running");
    runtime().block_on(async {
        let second = SLOT.get_or_start(start).await.expect("shared");
        assert!(std::sync::Arc::ptr_eq(&first, &second), "one deployment");
        assert_eq!(
            redis(second.addr(), &["PING"], IO_TIMEOUT)
                .await
                .expect("PING after the starting runtime ended"),
            "+PONG"
        );
        drop(first);
        drop(second);
    });
    let raw = i32::try_from(pid).expect("pid fits i32");
    assert_eq!(
        kill(Pid::from_raw(raw), None),
        Err(Errno::ESRCH),
        "pid {pid} is killed and reaped when the last handle drops"
    );
}

#[tokio::test]
async fn redis_restart_loses_data_without_persistence_and_keeps_it_with_aof() {
    let (volatile, durable) = futures::join!(
        RedisServer::start(),
        RedisServer::start_with(RedisOptions::default().persistence(true)),
    );
    let volatile = require_server!(volatile);
    let durable = require_server!(durable);
    for s in [&volatile, &durable] {
        let set = redis(s.addr(), &["SET", "k", "v"], IO_TIMEOUT)
            .await
            .expect("SET");
        assert_eq!(set, "+OK");
    }
    let (port_v, port_d) = (volatile.port(), durable.port());
    let (r1, r2) = futures::join!(volatile.restart(), durable.restart());
    r1.expect("restart volatile");
    r2.expect("restart durable");
    assert_eq!(
        (volatile.port(), durable.port()),
        (port_v, port_d),
        "same ports"
    );
    let lost = redis(volatile.addr(), &["GET", "k"], IO_TIMEOUT)
        .await
        .expect("GET");
    assert_eq!(lost, "(nil)");
    let kept = redis(durable.addr(), &["GET", "k"], IO_TIMEOUT)
        .await
        .expect("GET");
    assert_eq!(kept, "v");
    durable.restart_wiped().await.expect("restart wiped");
    let wiped = redis(durable.addr(), &["GET", "k"], IO_TIMEOUT)
        .await
        .expect("GET");
    assert_eq!(wiped, "(nil)");
}

#[tokio::test]
async fn redis_kill9_then_restart_on_the_same_port() {
    let server =
        require_server!(RedisServer::start_with(RedisOptions::default().persistence(true)).await);
    redis(server.addr(), &["SET", "k", "v"], IO_TIMEOUT)
        .await
        .expect("SET");
    let old_pid = server.pid().expect("running");
    server.kill9().await.expect("kill -9");
    assert_eq!(server.pid(), None);
    assert!(!server.is_running());
    assert_gone(old_pid);
    assert!(
        redis(server.addr(), &["PING"], IO_TIMEOUT).await.is_err(),
        "dead server answered"
    );
    server.restart().await.expect("restart");
    let new_pid = server.pid().expect("running again");
    assert_ne!(old_pid, new_pid);
    assert_eq!(
        redis(server.addr(), &["GET", "k"], IO_TIMEOUT)
            .await
            .expect("GET"),
        "v"
    );
    server.stop().await.expect("graceful stop");
    assert_gone(new_pid);
}

#[tokio::test]
async fn redis_pause_blocks_replies_until_resume_and_drop_kills_paused() {
    let server = require_server!(RedisServer::start().await);
    let pid = server.pid().expect("running");
    server.pause().expect("SIGSTOP");
    assert!(!server.is_running());
    let paused = redis(server.addr(), &["PING"], Duration::from_millis(500)).await;
    assert_eq!(
        paused.expect_err("no reply while paused").kind(),
        std::io::ErrorKind::TimedOut
    );
    server.resume().expect("SIGCONT");
    assert_eq!(
        redis(server.addr(), &["PING"], IO_TIMEOUT)
            .await
            .expect("PING"),
        "+PONG"
    );
    server.pause().expect("SIGSTOP again");
    drop(server);
    assert_gone(pid);
}

#[tokio::test]
async fn redis_nodes_start_five_independent_servers() {
    let nodes = require_server!(RedisNodes::start_with(RedisOptions::default().members(5)).await);
    assert_eq!(nodes.len(), 5);
    let mut ports: Vec<u16> = nodes.members().iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 5, "distinct ports");
    let url = nodes.url();
    assert!(url.starts_with("redlock://127.0.0.1:"), "{url}");
    assert_eq!(url.matches(',').count(), 4, "{url}");
    for (i, node) in nodes.members().iter().enumerate() {
        let value = format!("v{i}");
        redis(node.addr(), &["SET", "k", &value], IO_TIMEOUT)
            .await
            .expect("SET");
    }
    for (i, node) in nodes.members().iter().enumerate() {
        let got = redis(node.addr(), &["GET", "k"], IO_TIMEOUT)
            .await
            .expect("GET");
        assert_eq!(got, format!("v{i}"), "servers are independent");
    }
    let pids: Vec<u32> = nodes
        .members()
        .iter()
        .filter_map(RedisServer::pid)
        .collect();
    assert_eq!(pids.len(), 5);
    drop(nodes);
    pids.into_iter().for_each(assert_gone);
}

// ---------------------------------------------------------------- zookeeper

#[tokio::test]
async fn zookeeper_standalone_answers_four_letter_words() {
    let zk = require_server!(ZkServer::start().await);
    let pid = zk.pid().expect("running");
    assert_eq!(zk.url(), format!("zk://127.0.0.1:{}", zk.port()));
    assert_eq!(zk.four_letter("ruok").await.expect("ruok"), "imok");
    assert_eq!(zk.mode().await.expect("mode"), ZkMode::Standalone);
    let stat = zk.four_letter("stat").await.expect("stat");
    assert!(stat.contains("Mode: standalone"), "{stat}");
    let log = std::fs::read_to_string(zk.log_path()).expect("log in temp dir");
    assert!(
        log.contains("binding to port"),
        "ZooKeeper logs into its temp dir: {log}"
    );
    drop(zk);
    assert_gone(pid);
}

#[tokio::test]
async fn zookeeper_ensemble_elects_a_new_leader_and_the_old_one_rejoins() {
    let zk = require_server!(ZkEnsemble::start().await);
    assert_eq!(zk.len(), 3);
    assert_eq!(zk.url().matches(',').count(), 2, "{}", zk.url());
    let mut pids: Vec<u32> = zk.members().iter().filter_map(ZkServer::pid).collect();
    let leader = zk.leader().await.expect("leader");
    let mut modes = Vec::new();
    for m in zk.members() {
        modes.push(m.mode().await.expect("mode"));
    }
    assert_eq!(
        modes.iter().filter(|m| **m == ZkMode::Leader).count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| **m == ZkMode::Follower).count(),
        2,
        "{modes:?}"
    );

    let started = Instant::now();
    zk.member(leader).kill9().await.expect("kill leader");
    let new_leader = zk
        .wait_for_new_leader(leader, FAILOVER)
        .await
        .expect("new leader");
    assert_ne!(new_leader, leader);
    eprintln!("zookeeper: new leader after {:?}", started.elapsed());

    zk.member(leader)
        .restart()
        .await
        .expect("old leader restarts");
    let mode = zk.member(leader).mode().await.expect("rejoined");
    assert!(
        matches!(mode, ZkMode::Follower | ZkMode::Leader),
        "{mode:?}"
    );
    zk.wait_for_leader(FAILOVER).await.expect("one leader");
    for m in zk.members() {
        assert!(m.is_ready().await, "member {:?} serves", m.id());
    }
    pids.extend(zk.member(leader).pid());
    zk.restart_all().await.expect("whole ensemble restarts");
    pids.extend(zk.members().iter().filter_map(ZkServer::pid));
    drop(zk);
    pids.into_iter().for_each(assert_gone);
}

/// A follower cut off from its peers (quorum links through the ensemble's proxies) keeps
/// serving for up to `syncLimit` ticks, then stops; the others keep their leader; after
/// healing it rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_follower_partitioned_from_its_peers_stops_serving_and_rejoins() {
    let options = ZkOptions::default().peer_links(true);
    let zk = require_server!(ZkEnsemble::start_with(options).await);
    let leader = zk.leader().await.expect("leader");
    let follower = (leader + 1) % zk.len();
    zk.partition(follower).expect("partition");
    let cut_at = Instant::now();
    assert_eq!(
        zk.member(follower).mode().await.expect("still serving"),
        ZkMode::Follower,
        "a follower serves on for a while after losing its leader"
    );
    while zk.member(follower).mode().await.is_ok() {
        assert!(
            cut_at.elapsed() < FAILOVER,
            "the cut-off follower never stopped serving"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served_for = cut_at.elapsed();
    eprintln!("zookeeper: a cut-off follower served for {served_for:?}");
    assert_eq!(
        zk.leader().await.expect("the majority keeps its leader"),
        leader
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        zk.member(follower).mode().await.is_err(),
        "a cut-off member cannot rejoin"
    );
    zk.heal().expect("heal");
    let healed_at = Instant::now();
    while !zk.member(follower).is_ready().await {
        assert!(
            healed_at.elapsed() < FAILOVER,
            "the follower never rejoined"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    zk.wait_for_leader(FAILOVER).await.expect("one leader");
}

// ---------------------------------------------------------------- etcd

#[tokio::test]
async fn etcd_single_is_healthy_and_serves_the_json_gateway() {
    let etcd = require_server!(EtcdServer::start().await);
    let pid = etcd.pid().expect("running");
    assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{}", etcd.port()));
    assert!(etcd.is_ready().await);
    let status = etcd.status().await.expect("status");
    assert_eq!(
        status.leader, status.member_id,
        "a single member leads itself"
    );
    let (key, value) = (base64(b"distlock/harness"), base64(b"works"));
    let put = format!(r#"{{"key":"{key}","value":"{value}"}}"#);
    http_post(etcd.addr(), "/v3/kv/put", &put).await;
    let range = http_post(
        etcd.addr(),
        "/v3/kv/range",
        &format!(r#"{{"key":"{key}"}}"#),
    )
    .await;
    assert!(range.contains(&format!(r#""value":"{value}""#)), "{range}");
    drop(etcd);
    assert_gone(pid);
}

#[tokio::test]
async fn etcd_cluster_elects_a_new_leader_and_the_old_one_rejoins() {
    let etcd = require_server!(EtcdCluster::start().await);
    assert_eq!(etcd.len(), 3);
    assert_eq!(etcd.url().matches(',').count(), 2, "{}", etcd.url());
    let mut pids: Vec<u32> = etcd.members().iter().filter_map(EtcdServer::pid).collect();
    let leader = etcd.leader().await.expect("leader");

    let started = Instant::now();
    etcd.member(leader).kill9().await.expect("kill leader");
    let new_leader = etcd
        .wait_for_new_leader(leader, FAILOVER)
        .await
        .expect("new leader");
    assert_ne!(new_leader, leader);
    eprintln!("etcd: new leader after {:?}", started.elapsed());

    etcd.member(leader)
        .restart()
        .await
        .expect("old leader restarts");
    etcd.wait_for_leader(FAILOVER).await.expect("agreed leader");
    for m in etcd.members() {
        assert!(m.is_ready().await, "member {} healthy", m.name());
    }
    pids.extend(etcd.member(leader).pid());
    etcd.restart_all().await.expect("whole cluster restarts");
    pids.extend(etcd.members().iter().filter_map(EtcdServer::pid));
    let new_leader = etcd.leader().await.expect("leader after full restart");
    // Pausing a follower keeps the cluster available.
    let follower = (0..etcd.len())
        .find(|i| *i != new_leader)
        .expect("a follower");
    etcd.member(follower).pause().expect("pause follower");
    assert!(
        etcd.member(new_leader).is_ready().await,
        "quorum without the paused member"
    );
    drop(etcd);
    pids.into_iter().for_each(assert_gone);
}
