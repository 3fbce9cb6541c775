//! A holder *process* paused past its TTL (SIGSTOP of its whole process group, as a long
//! GC pause or a frozen VM would), on every networked backend.
//!
//! The holder is `lockctl run NAME -- bash -c …`: the command opens a critical section on a
//! fenced resource (over loopback TCP) with its `DISTLOCK_FENCING_TOKEN`, reads, and is
//! frozen before it writes. Meanwhile another client takes the expired lock and writes.
//! After SIGCONT either lockctl's lost signal stops the command before it writes, or the
//! command writes first and the fence refuses it; lockctl reports the lost lock.

use std::process::Stdio;
use std::time::Duration;

use conformance::{FenceServer, FencedResource};
use distlock::DistributedLockExt;
use harness::{or_skip, EtcdServer, PostgresServer, RedisServer, ZkServer};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(2);
/// lockctl's exit code for a lock that was lost (EX_TEMPFAIL).
const EXIT_LOCK: i32 = 75;

/// The holder's command: one fenced read-modify-write with a pause between read and write.
const WRITER: &str = r#"
exec 3<>/dev/tcp/127.0.0.1/$FENCE_PORT
echo "BEGIN $DISTLOCK_FENCING_TOKEN" >&3; read -r begin <&3
echo READ >&3; read -r _ value <&3
sleep 1
echo "WRITE $((value + 1))" >&3; read -r write <&3
echo END >&3; read -r _ <&3
echo "begin=$begin write=$write"
"#;

async fn paused_holder(url: String) {
    let resource = FencedResource::new();
    let fence = FenceServer::start(resource.clone())
        .await
        .expect("fence server");
    let name = format!("paused/{}", uuid::Uuid::new_v4().simple());
    let locked_url = format!(
        "{url}?ttl={}",
        distlock::raw::durations::format_duration(TTL)
    );
    let holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args([
            "--url",
            &locked_url,
            "run",
            &name,
            "--",
            "bash",
            "-c",
            WRITER,
        ])
        .env("FENCE_PORT", fence.addr().port().to_string())
        .process_group(0)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl starts");
    let group = Pid::from_raw(i32::try_from(holder.id().expect("pid")).expect("pid fits"));

    // Freeze the holder's whole process group once its critical section is open.
    let opened = Instant::now() + Duration::from_secs(20);
    while resource.sections().is_empty() {
        assert!(
            Instant::now() < opened,
            "the holder never opened its section"
        );
        sleep(Duration::from_millis(10)).await;
    }
    killpg(group, Signal::SIGSTOP).expect("SIGSTOP");
    let frozen_at = Instant::now();

    // Another client gets the lock once the frozen holder's lease is gone, and writes.
    let other = distlock::connect(&locked_url).await.expect("client");
    let guard = other
        .lock_timeout(&name, TTL * 4 + Duration::from_secs(5))
        .await
        .expect("another client takes over from the frozen holder");
    let takeover = frozen_at.elapsed();
    assert!(
        resource
            .increment(guard.fencing_token(), async {})
            .await
            .expect("the new holder's token is the highest"),
        "the new holder's write is accepted"
    );
    guard.release().await.expect("release");

    // Thaw: the stale write must be refused and lockctl must report the loss.
    killpg(group, Signal::SIGCONT).expect("SIGCONT");
    let output = timeout(Duration::from_secs(30), holder.wait_with_output())
        .await
        .expect("lockctl ends")
        .expect("lockctl output");
    let said = String::from_utf8_lossy(&output.stdout);
    let report = resource.check();
    eprintln!("{url}: takeover {takeover:?} after SIGSTOP; holder said {said:?}; {report:?}");
    assert!(report.is_safe(), "{report:?}");
    assert_eq!(report.counter, 1, "only the new holder's write counts");
    // On thaw, two defences race: lockctl's lost signal stops the command, or the
    // command writes first and the fence refuses it. Either way nothing stale lands.
    assert_eq!(
        report.accepted_writes, 1,
        "only the new holder's write lands: {said:?} {report:?}"
    );
    assert!(report.rejected_writes <= 1, "{report:?}");
    eprintln!(
        "stale write {}",
        if report.rejected_writes == 1 {
            "made and refused by the fence"
        } else {
            "never made: lockctl stopped the command first"
        }
    );
    assert_eq!(
        output.status.code(),
        Some(EXIT_LOCK),
        "lockctl stops the command and reports the lost lock"
    );
    assert!(
        takeover >= TTL / 2,
        "nobody may take over while the holder's lease still runs ({takeover:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_holder_is_fenced() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    paused_holder(server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_paused_holder_is_fenced() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    paused_holder(format!("{}/paused", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_paused_holder_is_fenced() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    paused_holder(format!("{}/paused", server.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_paused_holder_is_fenced() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    paused_holder(server.url()).await;
}
