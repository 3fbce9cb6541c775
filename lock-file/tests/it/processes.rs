//! What holds between processes: holders in child processes (this test binary run again
//! as [`child`]) that are killed, the real `flock(1)` excluding both ways, fencing tokens
//! across processes and restarts, and bad directories.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use conformance::Factory as _;
use lock_core::{DistributedLock, DistributedLockExt, ErrorKind, LockName, LockOptions};
use lock_file::{FileConfig, FileLock};
use testkit::file::{files_of, locked, FileFactory};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{sleep, timeout, Instant};

/// The environment variable that makes [`child`] act: `DIR\tNAME\tMODE`.
const CHILD: &str = "LOCK_FILE_CHILD";

/// Bound for "at once": a push wake-up after a close, far below any polling interval the
/// waiters here use (their recheck is 20 s).
const AT_ONCE: Duration = Duration::from_secs(1);

fn push_only() -> LockOptions {
    let mut options = LockOptions::default();
    options.recheck = Duration::from_secs(20);
    options
}

/// Run by the tests below in a process of its own: locks NAME in DIR and prints `held
/// TOKEN`; then `hold` waits to be killed, `once` releases, closes and exits. `contend
/// PERMITS` instead takes NAME (a mutex for 0 permits, else a permit of a semaphore of
/// PERMITS) [`CONTEND_ROUNDS`] times, logging each critical section to [`CONTEND_LOG`].
#[tokio::test]
#[ignore = "a child process of the tests of this module"]
async fn child() {
    let spec = std::env::var(CHILD).expect("run by the tests of this module");
    let [dir, name, mode] =
        <[&str; 3]>::try_from(spec.split('\t').collect::<Vec<_>>()).expect("DIR\\tNAME\\tMODE");
    let client = Arc::new(
        FileLock::connect(FileConfig::new(dir))
            .await
            .expect("connect"),
    );
    if let Some(permits) = mode.strip_prefix("contend ") {
        let permits: u32 = permits.parse().expect("a number of permits");
        contend(&client, Path::new(dir), name, permits).await;
        client.close().await.expect("close");
        return;
    }
    let guard = client.lock(name).await.expect("lock");
    println!("held {}", guard.fencing_token());
    if mode == "hold" {
        std::future::pending::<()>().await;
    }
    guard.release().await.expect("release");
    client.close().await.expect("close");
}

/// How many times each contending child takes the lock.
const CONTEND_ROUNDS: usize = 15;
/// The log of critical sections, in the lock directory (no lock name maps to it: it
/// holds `~`).
const CONTEND_LOG: &str = "contend~log";

async fn contend(client: &Arc<FileLock>, dir: &Path, name: &str, permits: u32) {
    use std::io::Write;
    let log = || {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join(CONTEND_LOG))
            .expect("the log opens")
    };
    let semaphore = lock_core::Semaphore::new(
        client.clone() as Arc<dyn DistributedLock>,
        name,
        permits.max(1),
    )
    .expect("a semaphore");
    for _ in 0..CONTEND_ROUNDS {
        let (token, release): (
            u64,
            std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
        ) = if permits == 0 {
            let guard = client.lock(name).await.expect("lock");
            (
                guard.fencing_token().get(),
                Box::pin(async move {
                    guard.release().await.expect("release");
                }),
            )
        } else {
            let permit = semaphore.acquire().await.expect("permit");
            (
                permit.fencing_token().get(),
                Box::pin(async move {
                    permit.release().await.expect("release");
                }),
            )
        };
        let pid = std::process::id();
        // One write per line: holders of a semaphore append at the same time, and an
        // appended write lands whole, where `writeln!` may split it.
        let line = |what: &str| format!("{what} {pid} {token}\n");
        log().write_all(line("enter").as_bytes()).expect("log");
        sleep(Duration::from_millis(3)).await;
        log().write_all(line("leave").as_bytes()).expect("log");
        release.await;
    }
}

/// Runs `children` contending children and returns the log's lines as (entering, pid,
/// token).
async fn contended(
    factory: &FileFactory,
    name: &str,
    permits: u32,
    children: usize,
) -> Vec<(bool, u32, u64)> {
    let mut running = Vec::new();
    for _ in 0..children {
        running.push(
            Command::new(std::env::current_exe().expect("the test binary"))
                .args(["--ignored", "--exact", "processes::child", "--nocapture"])
                .env(
                    CHILD,
                    format!("{}\t{name}\tcontend {permits}", factory.dir().display()),
                )
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn a child"),
        );
    }
    for mut child in running {
        let status = timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("the children end within 60 s")
            .expect("wait");
        assert!(status.success(), "a contending child failed: {status}");
    }
    let log = std::fs::read_to_string(factory.dir().join(CONTEND_LOG)).expect("the log");
    log.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (
                fields[0] == "enter",
                fields[1].parse().expect("a pid"),
                fields[2].parse().expect("a token"),
            )
        })
        .collect()
}

/// Processes contending for one mutex never overlap, and each entry's fencing token is
/// above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_contending_for_a_mutex_never_overlap() {
    let factory = FileFactory::new();
    let log = contended(&factory, "contended", 0, 4).await;
    assert_eq!(log.len(), 4 * CONTEND_ROUNDS * 2, "every section logged");
    let mut inside: Option<u32> = None;
    let mut last_token = 0;
    for (entering, pid, token) in log {
        if entering {
            assert_eq!(inside, None, "{pid} entered while {inside:?} was inside");
            assert!(token > last_token, "token {token} after {last_token}");
            (inside, last_token) = (Some(pid), token);
        } else {
            assert_eq!(inside, Some(pid), "{pid} left a section it was not in");
            inside = None;
        }
    }
}

/// Processes contending for a semaphore of 2 never hold more than 2 permits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_contending_for_two_permits_never_exceed_them() {
    let factory = FileFactory::new();
    let log = contended(&factory, "permits", 2, 4).await;
    assert_eq!(log.len(), 4 * CONTEND_ROUNDS * 2, "every section logged");
    let (mut inside, mut most) = (0usize, 0usize);
    for (entering, _, _) in log {
        if entering {
            inside += 1;
            most = most.max(inside);
        } else {
            inside -= 1;
        }
        assert!(inside <= 2, "{inside} permits held at once");
    }
    assert_eq!(most, 2, "the two permits were used side by side");
}

/// A child process locking `name` in `dir`, and the fencing token it printed once it
/// held.
async fn spawn_child(dir: &Path, name: &str, mode: &str) -> (Child, u64) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", "processes::child", "--nocapture"])
        .env(CHILD, format!("{}\t{name}\t{mode}", dir.display()))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let token = timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.expect("read the child") {
            if let Some(token) = line.strip_prefix("held ") {
                return token.parse::<u64>().expect("a fencing token");
            }
        }
        panic!("the child ended without holding {name}");
    })
    .await
    .expect("the child holds within 20 s");
    // The child's test harness writes on after that: keep reading.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, token)
}

/// Starts a wait for `name` on `client`, kills `child` (SIGKILL) once the wait is under
/// way, and returns what the wait took and how long after the kill.
async fn killed_then_taken(
    child: &mut Child,
    client: &Arc<FileLock>,
    name: &str,
) -> (lock_core::LockGuard, Duration) {
    let waiting = {
        let (client, name) = (Arc::clone(client), name.to_owned());
        tokio::spawn(async move { client.lock_timeout(&name, Duration::from_secs(30)).await })
    };
    sleep(Duration::from_millis(300)).await;
    let pid = child.id().expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
    let killed_at = Instant::now();
    child.wait().await.expect("the child ends");
    let guard = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter takes over")
        .expect("task")
        .expect("lock");
    (guard, killed_at.elapsed())
}

/// A holder process killed with SIGKILL releases at once: a waiter (whose recheck is 20 s)
/// is woken by the kernel's close and takes over within a second, with a greater token;
/// the dead holder's record is removed by the next reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_releases_at_once() {
    let factory = FileFactory::new();
    let name = LockName::new("jobs/killed").expect("valid");
    let (mut child, child_token) = spawn_child(factory.dir(), name.as_str(), "hold").await;
    let waiter = Arc::new(factory.file_client(push_only()).await);
    assert!(
        waiter.try_lock(name.as_str()).await.expect("try").is_none(),
        "the child holds"
    );
    let shown = waiter.inspect(&name).await.expect("inspect");
    let holder = shown.holder.expect("the child shows as holder");
    assert_eq!(
        holder.session.as_deref(),
        Some(&*format!("pid {}", child.id().expect("pid")))
    );
    let (guard, waited) = killed_then_taken(&mut child, &waiter, name.as_str()).await;
    assert!(
        waited < AT_ONCE,
        "the takeover took {waited:?} after SIGKILL"
    );
    assert!(guard.fencing_token().get() > child_token);
    let shown = waiter.inspect(&name).await.expect("inspect");
    assert_eq!(shown.holders().count(), 1, "only the new holder: {shown:?}");
    guard.release().await.expect("release");
    waiter.close().await.expect("close");
    assert!(factory.leftovers(&[name]).await.is_empty());
}

/// The real `flock(1)` and a distlock mutex on the same plain name exclude each other
/// both ways; a reader shares with `flock -s`; an `flock(1)` holder shows without an
/// owner token, cannot be broken, and wakes a distlock waiter at once when it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flock_binary_and_distlock_exclude_both_ways() {
    let factory = FileFactory::new();
    let path = factory.dir().join("nightly");
    let flock_n = |args: &[&str]| {
        let status = std::process::Command::new("flock")
            .args(args)
            .arg(&path)
            .arg("true")
            .status()
            .expect("flock(1) runs (util-linux; scripts/install-deps.sh)");
        status.code()
    };
    let client = Arc::new(factory.file_client(push_only()).await);

    // distlock holds: flock -n cannot.
    let guard = client.lock("nightly").await.expect("lock");
    assert_eq!(
        flock_n(&["-n"]),
        Some(1),
        "flock -n beside a distlock holder"
    );
    assert_eq!(
        flock_n(&["-n", "-s"]),
        Some(1),
        "flock -s beside a distlock holder"
    );
    guard.release().await.expect("release");
    assert_eq!(flock_n(&["-n"]), Some(0), "flock -n once released");

    // A distlock reader shares with flock -s, not with flock -x.
    let rw = lock_core::RwLock::new(client.clone(), "nightly").expect("rwlock");
    let reading = rw.read().await.expect("read");
    assert_eq!(flock_n(&["-n", "-s"]), Some(0), "flock -s beside a reader");
    assert_eq!(flock_n(&["-n", "-x"]), Some(1), "flock -x beside a reader");
    reading.release().await.expect("release");

    // flock(1) holds: distlock cannot, nor break it; it is woken when flock exits.
    // `-o`: the command does not inherit the lock, so killing flock(1) releases it.
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(&path)
        .args(["sleep", "20"])
        .kill_on_drop(true)
        .spawn()
        .expect("flock(1) runs");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !locked(&path) {
        assert!(Instant::now() < deadline, "flock(1) never took the lock");
        sleep(Duration::from_millis(20)).await;
    }
    assert!(client.try_lock("nightly").await.expect("try").is_none());
    let name = LockName::new("nightly").expect("valid");
    let shown = client.inspect(&name).await.expect("inspect");
    let foreign = shown.holder.expect("flock(1) shows as a holder");
    assert_eq!(foreign.owner_token, None, "{foreign:?}");
    let err = client
        .force_release(&name)
        .await
        .expect_err("cannot break flock(1)");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let (guard, waited) = killed_then_taken(&mut holder, &client, "nightly").await;
    assert!(
        waited < AT_ONCE,
        "the takeover took {waited:?} after flock(1) died"
    );
    guard.release().await.expect("release");
    client.close().await.expect("close");
}

/// Fencing tokens strictly increase across holders in different processes, across a
/// restart (new clients on the same directory), and after the counter file is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_processes_and_restarts() {
    let factory = FileFactory::new();
    let name = "fenced";
    let mut tokens = Vec::new();
    for round in 0..3 {
        let (mut child, token) = spawn_child(factory.dir(), name, "once").await;
        assert!(child.wait().await.expect("the child ends").success());
        tokens.push(token);
        // A "restart": a new client each round, on the same directory.
        let client = factory.file_client(LockOptions::default()).await;
        let guard = client.lock(name).await.expect("lock");
        tokens.push(guard.fencing_token().get());
        guard.release().await.expect("release");
        client.close().await.expect("close");
        if round == 1 {
            std::fs::remove_file(factory.dir().join("fenced~fence")).expect("lose the counter");
        }
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens go back: {tokens:?}"
    );
}

/// Bad URLs and directories get typed errors and leave nothing behind; names too long
/// for a file name are refused.
#[tokio::test]
async fn bad_input_gets_typed_errors_and_leaves_nothing() {
    let scratch = tempfile::tempdir().expect("scratch");
    let missing_parent = scratch.path().join("no/such/dir");
    let a_file = scratch.path().join("a-file");
    std::fs::write(&a_file, b"").expect("a file");
    let cases = [
        format!("file://{}", missing_parent.display()),
        format!("file://{}", a_file.display()),
        "file://relative/dir".to_owned(),
        "file:///".to_owned(),
        format!("file://{}/../x", scratch.path().display()),
        format!("file://otherhost{}", scratch.path().display()),
    ];
    lock_core::raw::driver::register::<lock_file::FileBackend>();
    for url in &cases {
        let err = lock_core::connect(url).await.expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        assert!(!err.is_retryable(), "{url}");
    }
    let left: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("list")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("a-file")],
        "nothing made"
    );

    let factory = FileFactory::new();
    let client = factory.file_client(LockOptions::default()).await;
    let long = "n".repeat(151);
    let err = client.try_lock(&long).await.expect_err("too long");
    assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
    let escaped = "/".repeat(60);
    let err = client
        .try_lock(&escaped)
        .await
        .expect_err("too long escaped");
    assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
    let name = LockName::new(escaped).expect("a valid name");
    assert!(files_of(factory.dir(), &name).is_empty());
    client.close().await.expect("close");
    let made: Vec<_> = [factory.dir().to_owned(), factory.dir().join(".records")]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).expect("list").flatten())
        .map(|e| e.file_name())
        .filter(|f| f != ".records")
        .collect();
    assert!(made.is_empty(), "nothing made for refused names: {made:?}");
}

/// A process's clients of one directory share one inotify watch: more clients than the
/// default limit of inotify instances per user (128) connect, and a waiter on the last
/// one is still woken by a push when the first releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_one_directory_share_one_watch() {
    let factory = FileFactory::new();
    let mut clients = Vec::new();
    for _ in 0..200 {
        clients.push(Arc::new(factory.file_client(push_only()).await));
    }
    let (first, last) = (&clients[0], &clients[199]);
    let guard = first.lock("shared").await.expect("lock");
    let waiting = {
        let last = Arc::clone(last);
        tokio::spawn(async move { last.lock_timeout("shared", Duration::from_secs(30)).await })
    };
    sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    guard.release().await.expect("release");
    let next = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter takes over")
        .expect("task")
        .expect("lock");
    assert!(
        released_at.elapsed() < AT_ONCE,
        "{:?}",
        released_at.elapsed()
    );
    next.release().await.expect("release");
    for client in clients {
        client.close().await.expect("close");
    }
}
