//! A foreign ZooKeeper client for interoperability tests: Apache Curator's
//! `InterProcessMutex` and `LeaderLatch` (Debian package `libcurator-recipes-java`) in a
//! tiny Java program, compiled with `javac` at test time and driven line by line over its
//! stdin.
//!
//! Mutex commands: `acquire` (waits at most 60 s, then prints `ACQUIRED <czxid>`, the
//! czxid of the node it holds, which is the fencing token a `zk://` holder of that node
//! gets, or `FAILED acquire`), `release` (prints `RELEASED`), `hold MS` (acquire, print,
//! sleep MS, release, print).
//! Leader latch commands: `latch ID` (starts a `LeaderLatch` with participant id `ID` on
//! the path, prints `STARTED`; later, whenever it gains leadership, `LEADER <czxid>`, the
//! czxid of its node, which is the term a `zk://` reader sees, and whenever it loses it,
//! `NOTLEADER`), `leader` (prints `LEADERID <id>`, Curator's `getLeader().getId()`: the
//! data of the first node, empty if none), `has` (prints `HAS true|false`,
//! `hasLeadership()`), `close` (closes the latch, deleting its node; prints `CLOSED`).
//! Semaphore commands (`InterProcessSemaphoreV2` on the path): `semaphore N` (one more
//! lease of a semaphore of `N` permits, waiting at most 60 s; prints `LEASED <node name>`
//! or `FAILED semaphore`), `return` (returns the oldest lease held; prints `RETURNED`).
//! Read-write lock commands (`InterProcessReadWriteLock` on the path): `read` and `write`
//! (wait at most 60 s; print `READING` / `WRITING` or `FAILED read|write`), `unread` and
//! `unwrite` (print `UNLOCKED`).
//! `exit` ends the program. It prints `READY` once connected.
//!
//! Without java, javac or the Curator jars, [`compile`] prints a loud notice and returns
//! `None`, unless [`strict`](crate::strict) mode is on, where it panics.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{timeout, Instant};

use crate::find_binary;

/// The jars the program needs, in [`JAR_DIR`].
pub const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];
/// Where the Debian packages put the jars.
pub const JAR_DIR: &str = "/usr/share/java";
const SOURCE: &str = include_str!("curator/CuratorHolder.java");
const HINT: &str = "apt-get install default-jdk-headless libcurator-recipes-java libslf4j-java";
/// Bound on compiling the program.
const JAVAC_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on a JVM start and its ZooKeeper session.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Compiles the program into `dir`; returns the class path to run it with, or `None`
/// (after a loud notice) when the tools are missing and strict mode is off.
///
/// # Panics
/// When a tool is missing in strict mode, and when `javac` fails.
pub async fn compile(dir: &Path) -> Option<String> {
    let missing: Vec<String> = JARS
        .iter()
        .map(|jar| Path::new(JAR_DIR).join(jar))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    let javac = find_binary("javac", "JAVAC_BIN", HINT).ok();
    let java = find_binary("java", "JAVA_BIN", HINT).ok();
    let Some(javac) = javac.filter(|_| missing.is_empty() && java.is_some()) else {
        let what = format!(
            "Curator interop needs java, javac and {JARS:?} in {JAR_DIR} ({HINT}); \
             missing: {missing:?} java={java:?}"
        );
        assert!(!crate::strict(), "LOCK_TEST_STRICT is set and {what}");
        let rule = "=".repeat(78);
        eprintln!("\n{rule}\nSKIPPED: {what}\n{rule}\n");
        return None;
    };
    let classpath = JARS
        .iter()
        .map(|jar| format!("{JAR_DIR}/{jar}"))
        .collect::<Vec<_>>()
        .join(":");
    let source = dir.join("CuratorHolder.java");
    std::fs::write(&source, SOURCE).expect("write java source");
    let status = timeout(
        JAVAC_TIMEOUT,
        Command::new(javac)
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

/// One Curator process holding an `InterProcessMutex` on one path; killed on drop.
#[derive(Debug)]
pub struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

/// What went wrong talking to a Curator process.
#[derive(Debug, thiserror::Error)]
pub enum CuratorError {
    /// Its pipes failed.
    #[error("curator i/o: {0}")]
    Io(#[from] std::io::Error),
    /// It said nothing within the bound.
    #[error("curator did not say {expected} within {within:?}")]
    Timeout {
        /// The word awaited.
        expected: String,
        /// The bound.
        within: Duration,
    },
    /// It exited.
    #[error("curator exited before saying {0}")]
    Exited(String),
    /// It said something else.
    #[error("expected {expected}, curator said {said:?}")]
    Unexpected {
        /// The word awaited.
        expected: String,
        /// The line it printed.
        said: String,
    },
}

impl Curator {
    /// Starts the program of class path `classpath` (from [`compile`]) on ZooKeeper
    /// `connect` (`host:port,…`) for lock path `path`, and waits for its `READY`.
    ///
    /// # Errors
    /// If java does not start or the program is not ready within 60 s.
    pub async fn start(classpath: &str, connect: &str, path: &str) -> Result<Self, CuratorError> {
        let java = find_binary("java", "JAVA_BIN", HINT)
            .map_err(|e| CuratorError::Io(std::io::Error::other(e.to_string())))?;
        let mut child = Command::new(java)
            .args(["-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp", classpath])
            .args(["CuratorHolder", connect, path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| missing_pipe("stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| missing_pipe("stdout"))?;
        let mut curator = Curator {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        curator.expect_line("READY", READY_TIMEOUT).await?;
        Ok(curator)
    }

    /// Sends one command.
    ///
    /// # Errors
    /// If the pipe is closed.
    pub async fn send(&mut self, command: &str) -> Result<(), CuratorError> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Waits for a line starting with `word` and returns it.
    ///
    /// # Errors
    /// On another line, an exit, or nothing within `within`.
    pub async fn expect_line(
        &mut self,
        word: &str,
        within: Duration,
    ) -> Result<String, CuratorError> {
        let line = timeout(within, self.lines.next_line())
            .await
            .map_err(|_| CuratorError::Timeout {
                expected: word.to_owned(),
                within,
            })??
            .ok_or_else(|| CuratorError::Exited(word.to_owned()))?;
        if line.starts_with(word) {
            Ok(line)
        } else {
            Err(CuratorError::Unexpected {
                expected: word.to_owned(),
                said: line,
            })
        }
    }

    /// Waits for a line starting with `word`; returns when it came.
    ///
    /// # Panics
    /// On another line, an exit, or nothing within `within`.
    pub async fn expect(&mut self, word: &str, within: Duration) -> Instant {
        if let Err(err) = self.expect_line(word, within).await {
            panic!("{err}");
        }
        Instant::now()
    }

    /// Acquires the mutex, waiting at most 60 s; returns the held node's czxid.
    ///
    /// # Errors
    /// If Curator did not acquire or its answer cannot be read.
    pub async fn acquire(&mut self) -> Result<u64, CuratorError> {
        self.send("acquire").await?;
        let line = self
            .expect_line("ACQUIRED", READY_TIMEOUT + Duration::from_secs(5))
            .await?;
        line.split_whitespace()
            .nth(1)
            .and_then(|czxid| czxid.parse().ok())
            .ok_or(CuratorError::Unexpected {
                expected: "ACQUIRED <czxid>".to_owned(),
                said: line,
            })
    }

    /// Releases the mutex.
    ///
    /// # Errors
    /// If Curator did not confirm within 10 s.
    pub async fn release(&mut self) -> Result<(), CuratorError> {
        self.send("release").await?;
        self.expect_line("RELEASED", Duration::from_secs(10))
            .await
            .map(drop)
    }

    /// Starts a `LeaderLatch` with participant id `id`; it has queued its node once it
    /// said `STARTED` (its `LEADER <czxid>` comes later, see [`Curator::leads`]).
    ///
    /// # Errors
    /// If Curator did not confirm within 10 s.
    pub async fn latch(&mut self, id: &str) -> Result<(), CuratorError> {
        self.send(&format!("latch {id}")).await?;
        self.expect_line("STARTED", Duration::from_secs(10))
            .await
            .map(drop)
    }

    /// Waits (at most `within`) for the latch's `LEADER <czxid>`; returns the czxid.
    ///
    /// # Errors
    /// On another line, an exit, or nothing within `within`.
    pub async fn leads(&mut self, within: Duration) -> Result<u64, CuratorError> {
        let line = self.expect_line("LEADER ", within).await?;
        line.split_whitespace()
            .nth(1)
            .and_then(|czxid| czxid.parse().ok())
            .ok_or(CuratorError::Unexpected {
                expected: "LEADER <czxid>".to_owned(),
                said: line,
            })
    }

    /// Curator's view of the leader's id (`getLeader().getId()`, empty if none).
    ///
    /// # Errors
    /// If Curator did not answer within 10 s.
    pub async fn leader_id(&mut self) -> Result<String, CuratorError> {
        self.send("leader").await?;
        let line = self
            .expect_line("LEADERID", Duration::from_secs(10))
            .await?;
        Ok(line
            .strip_prefix("LEADERID")
            .unwrap_or_default()
            .trim_start_matches(' ')
            .to_owned())
    }

    /// Whether the latch says it has leadership (`hasLeadership()`).
    ///
    /// # Errors
    /// If Curator did not answer within 10 s.
    pub async fn has_leadership(&mut self) -> Result<bool, CuratorError> {
        self.send("has").await?;
        let line = self.expect_line("HAS", Duration::from_secs(10)).await?;
        Ok(line.ends_with("true"))
    }

    /// Closes the latch and waits (at most 10 s) until its node is gone: Curator deletes
    /// it in the background.
    ///
    /// # Errors
    /// If Curator did not confirm within 15 s.
    pub async fn close_latch(&mut self) -> Result<(), CuratorError> {
        self.send("close").await?;
        self.expect_line("CLOSED", Duration::from_secs(15))
            .await
            .map(drop)
    }

    /// Takes one more lease of the semaphore of `permits` on the path (a command that
    /// blocks the program until granted, at most 60 s); returns the lease node's name.
    ///
    /// # Errors
    /// If Curator did not lease or its answer cannot be read.
    pub async fn lease(&mut self, permits: u32) -> Result<String, CuratorError> {
        self.send(&format!("semaphore {permits}")).await?;
        self.leased(READY_TIMEOUT + Duration::from_secs(5)).await
    }

    /// Waits (at most `within`) for the `LEASED <node>` of a `semaphore` command sent
    /// before; returns the node's name.
    ///
    /// # Errors
    /// On another line, an exit, or nothing within `within`.
    pub async fn leased(&mut self, within: Duration) -> Result<String, CuratorError> {
        let line = self.expect_line("LEASED ", within).await?;
        Ok(line.trim_start_matches("LEASED ").to_owned())
    }

    /// Returns the oldest lease held.
    ///
    /// # Errors
    /// If Curator did not confirm within 10 s.
    pub async fn return_lease(&mut self) -> Result<(), CuratorError> {
        self.send("return").await?;
        self.expect_line("RETURNED", Duration::from_secs(10))
            .await
            .map(drop)
    }

    /// Releases the read (`write == false`) or write side of the read-write lock.
    ///
    /// # Errors
    /// If Curator did not confirm within 10 s.
    pub async fn unlock(&mut self, write: bool) -> Result<(), CuratorError> {
        self.send(if write { "unwrite" } else { "unread" }).await?;
        self.expect_line("UNLOCKED", Duration::from_secs(10))
            .await
            .map(drop)
    }

    /// Nothing is printed within `quiet`.
    ///
    /// # Panics
    /// If a line comes.
    pub async fn silent_for(&mut self, quiet: Duration) {
        if let Ok(line) = timeout(quiet, self.lines.next_line()).await {
            panic!("curator said {line:?} while it should be waiting");
        }
    }

    /// Asks the program to exit and waits (at most 10 s) for it; killed on drop otherwise.
    pub async fn exit(mut self) {
        if self.send("exit").await.is_ok() {
            let _ = timeout(Duration::from_secs(10), self.child.wait()).await;
        }
    }
}

fn missing_pipe(which: &str) -> CuratorError {
    CuratorError::Io(std::io::Error::other(format!("no {which} pipe")))
}
