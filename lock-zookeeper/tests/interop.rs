//! Interoperability with Apache Curator's `InterProcessMutex` (Debian package
//! `libcurator-recipes-java`): a tiny Java program, compiled with `javac` at test time,
//! holds the mutex on the same path as our lock. Both exclude each other and mixed
//! waiters are served in sequence order.
//!
//! Without java, javac or the Curator jars the tests print a loud notice and pass, unless
//! `LOCK_TEST_STRICT=1`, where they fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{queue, with_ttl, ZkFactory, BASE};
use lock_core::{DistributedLockExt, LockName, ReleaseOutcome};
use lock_zookeeper::lock_dir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];
const JAR_DIR: &str = "/usr/share/java";

/// Reads commands from stdin: `acquire` (blocks, then prints `ACQUIRED`), `release`
/// (prints `RELEASED`), `hold MS` (acquire, print, sleep MS, release, print), `exit`.
const HOLDER: &str = r#"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorHolder {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[0]).sessionTimeoutMs(10000).connectionTimeoutMs(5000)
            .retryPolicy(new RetryNTimes(3, 200)).build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("FAILED connect");
            return;
        }
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("READY");
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            if (cmd[0].equals("acquire") || cmd[0].equals("hold")) {
                if (!mutex.acquire(60, TimeUnit.SECONDS)) {
                    System.out.println("FAILED acquire");
                    continue;
                }
                System.out.println("ACQUIRED");
                if (cmd[0].equals("hold")) {
                    Thread.sleep(Long.parseLong(cmd[1]));
                    mutex.release();
                    System.out.println("RELEASED");
                }
            } else if (cmd[0].equals("release")) {
                mutex.release();
                System.out.println("RELEASED");
            } else if (cmd[0].equals("exit")) {
                break;
            }
        }
        client.close();
    }
}
"#;

/// The compiled holder, or `None` (after a loud notice) when the tools are missing.
async fn compile(dir: &Path) -> Option<String> {
    let missing: Vec<String> = JARS
        .iter()
        .map(|jar| Path::new(JAR_DIR).join(jar))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    let javac = which("javac");
    let java = which("java");
    if !missing.is_empty() || javac.is_none() || java.is_none() {
        let what = format!(
            "Curator interop needs java, javac and {JARS:?} in {JAR_DIR} \
             (apt-get install default-jdk-headless libcurator-recipes-java libslf4j-java); \
             missing: {missing:?} javac={javac:?} java={java:?}"
        );
        assert!(
            !conformance::harness::strict(),
            "LOCK_TEST_STRICT is set and {what}"
        );
        let rule = "=".repeat(78);
        eprintln!("\n{rule}\nSKIPPED: {what}\n{rule}\n");
        return None;
    }
    let classpath = JARS
        .iter()
        .map(|jar| format!("{JAR_DIR}/{jar}"))
        .collect::<Vec<_>>()
        .join(":");
    let source = dir.join("CuratorHolder.java");
    std::fs::write(&source, HOLDER).expect("write java source");
    let status = timeout(
        Duration::from_secs(120),
        Command::new("javac")
            .arg("-d")
            .arg(dir)
            .arg("-cp")
            .arg(&classpath)
            .arg(&source)
            .kill_on_drop(true)
            .status(),
    )
    .await
    .expect("javac finishes within 120 s")
    .expect("javac runs");
    assert!(status.success(), "javac failed: {status}");
    Some(format!("{}:{classpath}", dir.display()))
}

fn which(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(binary))
        .find(|p| p.is_file())
}

/// One Curator process holding an `InterProcessMutex` on one path.
struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Curator {
    async fn start(classpath: &str, connect: &str, path: &str) -> Curator {
        let mut child = Command::new("java")
            .args(["-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp", classpath])
            .args(["CuratorHolder", connect, path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("java starts");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut curator = Curator {
            child,
            stdin,
            lines,
        };
        curator.expect("READY", Duration::from_secs(60)).await;
        curator
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to curator");
        self.stdin.flush().await.expect("flush");
    }

    /// Waits for a line starting with `word`; panics on anything else or a timeout.
    async fn expect(&mut self, word: &str, within: Duration) -> Instant {
        let line = timeout(within, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("curator did not say {word} within {within:?}"))
            .expect("read curator output")
            .unwrap_or_else(|| panic!("curator exited before saying {word}"));
        assert!(
            line.starts_with(word),
            "expected {word}, curator said {line:?}"
        );
        Instant::now()
    }

    /// Nothing is printed within `quiet`.
    async fn silent_for(&mut self, quiet: Duration) {
        if let Ok(line) = timeout(quiet, self.lines.next_line()).await {
            panic!("curator said {line:?} while it should be waiting");
        }
    }

    async fn exit(mut self) {
        self.send("exit").await;
        let _ = timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

fn plain_name(tag: &str) -> LockName {
    // No `/`: the lock directory is `<base>/<name>`, the path Curator is given.
    LockName::new(format!("curator-{tag}-{}", uuid::Uuid::new_v4().simple())).expect("valid")
}

async fn queue_len_reaches(factory: &ZkFactory, name: &LockName, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue(factory.admin(), name).await.len() < n {
        assert!(
            Instant::now() < deadline,
            "queue of {name} never reached {n}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A Curator holder blocks our acquire on the same path, and ours blocks Curator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_distlock_exclude_each_other() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(classpath) = compile(dir.path()).await else {
        return;
    };
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let connect = factory.servers.hosts().join(",");
    let name = plain_name("exclude");
    let path = lock_dir(BASE, &name);
    let ours = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let mut curator = Curator::start(&classpath, &connect, &path).await;

    // Curator holds: we are excluded, and we wait in its queue.
    curator.send("acquire").await;
    curator.expect("ACQUIRED", Duration::from_secs(20)).await;
    assert!(
        ours.try_lock(name.as_str()).await.expect("try").is_none(),
        "try_lock succeeded while Curator holds the lock"
    );
    let waiter = tokio::spawn({
        let (ours, name) = (Arc::clone(&ours), name.clone());
        async move {
            let guard = ours.lock(name.as_str()).await.expect("acquire");
            (Instant::now(), guard)
        }
    });
    queue_len_reaches(&factory, &name, 2).await;
    sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "acquired while Curator holds the lock"
    );
    curator.send("release").await;
    let released_at = curator.expect("RELEASED", Duration::from_secs(10)).await;
    let (acquired_at, guard) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("our waiter gets the lock after Curator releases")
        .expect("waiter task");
    eprintln!(
        "Curator -> distlock hand-off observed after {:?}",
        acquired_at.saturating_duration_since(released_at)
    );

    // We hold: Curator queues behind us and waits.
    curator.send("acquire").await;
    queue_len_reaches(&factory, &name, 2).await;
    curator.silent_for(Duration::from_millis(800)).await;
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    curator.expect("ACQUIRED", Duration::from_secs(10)).await;
    assert!(ours.try_lock(name.as_str()).await.expect("try").is_none());
    curator.send("release").await;
    curator.expect("RELEASED", Duration::from_secs(10)).await;
    let next = ours
        .try_lock(name.as_str())
        .await
        .expect("try")
        .expect("free after Curator released");
    next.release().await.expect("release");
    curator.exit().await;
}

/// Mixed waiters (Curator, distlock, Curator, distlock) are served in queue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_waiters_are_served_in_sequence_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(classpath) = compile(dir.path()).await else {
        return;
    };
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let connect = factory.servers.hosts().join(",");
    let name = plain_name("fifo");
    let path = lock_dir(BASE, &name);
    let holder = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let first = holder.lock(name.as_str()).await.expect("acquire");
    let order: Arc<Mutex<Vec<(&'static str, Instant)>>> = Arc::default();

    let mut c1 = Curator::start(&classpath, &connect, &path).await;
    let mut c3 = Curator::start(&classpath, &connect, &path).await;
    let mut rust_waiters = Vec::new();
    let mut queued = 1;
    for label in ["curator-1", "distlock-2", "curator-3", "distlock-4"] {
        match label {
            "curator-1" => c1.send("hold 150").await,
            "curator-3" => c3.send("hold 150").await,
            _ => {
                let client = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
                let (name, order) = (name.clone(), Arc::clone(&order));
                rust_waiters.push(tokio::spawn(async move {
                    let guard = client.lock(name.as_str()).await.expect("acquire");
                    order.lock().expect("order").push((label, Instant::now()));
                    sleep(Duration::from_millis(150)).await;
                    guard.release().await.expect("release");
                }));
            }
        }
        queued += 1;
        queue_len_reaches(&factory, &name, queued).await;
    }
    first.release().await.expect("release");
    let c1_at = c1.expect("ACQUIRED", Duration::from_secs(20)).await;
    c1.expect("RELEASED", Duration::from_secs(20)).await;
    let c3_at = c3.expect("ACQUIRED", Duration::from_secs(20)).await;
    c3.expect("RELEASED", Duration::from_secs(20)).await;
    for waiter in rust_waiters {
        timeout(Duration::from_secs(20), waiter)
            .await
            .expect("distlock waiters served")
            .expect("waiter task");
    }
    let mut order = order.lock().expect("order").clone();
    order.push(("curator-1", c1_at));
    order.push(("curator-3", c3_at));
    order.sort_by_key(|(_, at)| *at);
    let labels: Vec<&str> = order.iter().map(|(label, _)| *label).collect();
    assert_eq!(
        labels,
        ["curator-1", "distlock-2", "curator-3", "distlock-4"],
        "grant order"
    );
    assert!(queue(factory.admin(), &name).await.is_empty());
    c1.exit().await;
    c3.exit().await;
}
