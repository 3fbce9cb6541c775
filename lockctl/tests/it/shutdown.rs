//! lockctl closes its client on every exit path: a `lockctl run` killed by SIGTERM while
//! it waits leaves no waiter behind, so the next one gets the lock when the holder is done,
//! not when the killed one's ZooKeeper session times out.
//!
//! Without the close, whether the background cleanup of the abandoned wait runs before the
//! runtime ends is a race, which an idle machine tends to win: the machine is kept busy
//! (one spinning process per core, and one more) while the killed lockctl exits.

use std::process::Stdio;
use std::time::Duration;

use harness::{or_skip, ZkServer};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::{sleep, timeout, Instant};

/// The session timeout: what a waiter left behind would block the next one for.
const TTL: Duration = Duration::from_secs(20);
/// How long the first holder holds.
const HOLD: Duration = Duration::from_secs(4);

fn lockctl(url: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--url")
        .arg(url)
        .args(args)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("lockctl starts")
}

async fn exit_code(child: &mut Child, within: Duration) -> Option<i32> {
    timeout(within, child.wait())
        .await
        .expect("lockctl ends in time")
        .expect("wait for lockctl")
        .code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_killed_by_sigterm_leaves_nothing_behind() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    let url = format!("{}/locks?ttl={}s", server.url(), TTL.as_secs());
    let name = format!("shutdown-{}", uuid::Uuid::new_v4().simple());
    let hold = format!("{}s", HOLD.as_secs());
    let mut holder = lockctl(&url, &["hold", "--for", &hold, &name]);
    let started = Instant::now();
    // The holder has it once `status` says held.
    loop {
        let status = Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(["--url", &url, "status", &name])
            .output()
            .await
            .expect("lockctl status");
        if status.status.code() == Some(0) {
            break;
        }
        assert!(started.elapsed() < HOLD, "the holder never got the lock");
        sleep(Duration::from_millis(50)).await;
    }
    let mut killed = lockctl(&url, &["run", "-w", "60", &name, "--", "true"]);
    sleep(Duration::from_millis(1000)).await;
    let pid = Pid::from_raw(i32::try_from(killed.id().expect("running")).expect("pid fits"));
    let busy = spin_every_core();
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let code = exit_code(&mut killed, Duration::from_secs(10)).await;
    drop(busy);
    assert_eq!(
        code,
        Some(128 + Signal::SIGTERM as i32),
        "a lockctl killed while waiting exits 128 + 15"
    );
    let mut next = lockctl(&url, &["run", "-w", "60", &name, "--", "true"]);
    assert_eq!(
        exit_code(&mut next, TTL * 3).await,
        Some(0),
        "the next waiter gets the lock"
    );
    let granted_after = started.elapsed();
    assert_eq!(exit_code(&mut holder, HOLD).await, Some(0), "the holder");
    println!("the next waiter was done {granted_after:?} after the holder started ({HOLD:?} hold)");
    assert!(
        granted_after < HOLD + Duration::from_secs(3),
        "the next waiter got the lock {granted_after:?} after the holder started, though \
         the holder held for {HOLD:?}: the killed waiter's node stayed until its session \
         timed out ({TTL:?})"
    );
}

/// One spinning shell per core, and one more; each is SIGKILLed (by its pid) when the
/// returned processes are dropped, and ends by itself after its count (some seconds).
fn spin_every_core() -> Vec<Child> {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    (0..=cores)
        .map(|_| {
            Command::new("sh")
                .args([
                    "-c",
                    "i=0; while [ $i -lt 50000000 ]; do i=$((i + 1)); done",
                ])
                .kill_on_drop(true)
                .spawn()
                .expect("a spinning shell")
        })
        .collect()
}
