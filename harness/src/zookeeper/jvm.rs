//! The JVM side of running ZooKeeper: java and the class path of the Debian jars
//! ([`ZkRuntime`]), and the start slots that keep a few JVMs from starting at once.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::process::find_binary;
use crate::HarnessError;

const HINT: &str = "make deps (installs libzookeeper-java)";
const JAVA_HINT: &str = "apt-get install default-jre-headless";
/// Where the Debian packages put the jars.
const JAR_DIRS: [&str; 3] = [
    "/usr/share/java",
    "/usr/share/zookeeper",
    "/usr/share/zookeeper/lib",
];
/// Netty jars that the Netty connection factory needs beyond zookeeper.jar's manifest.
const NETTY_EXTRA_JARS: [&str; 2] = ["netty-codec.jar", "netty-resolver.jar"];
/// JVMs starting at once, process-wide (a start is CPU-heavy).
const JVM_STARTS: usize = 3;
/// Bound on waiting for a JVM start slot.
const START_SLOT_TIMEOUT: Duration = Duration::from_secs(180);

static JVM_START_SLOTS: LazyLock<Semaphore> = LazyLock::new(|| Semaphore::new(JVM_STARTS));

/// Java and the class path to run ZooKeeper with (found before a start).
#[derive(Debug, Clone)]
pub struct ZkRuntime {
    pub(super) java: PathBuf,
    pub(super) classpath: String,
}

impl ZkRuntime {
    /// `$JAVA_BIN` or `java`; `$ZOOKEEPER_CLASSPATH` or `zookeeper.jar` plus a log4j binding.
    pub(super) fn find() -> Result<Self, HarnessError> {
        let java = find_binary("java", "JAVA_BIN", JAVA_HINT)?;
        if let Some(cp) = std::env::var_os("ZOOKEEPER_CLASSPATH").filter(|v| !v.is_empty()) {
            return Ok(Self {
                java,
                classpath: cp.to_string_lossy().into_owned(),
            });
        }
        let jar = JAR_DIRS
            .iter()
            .map(|d| Path::new(d).join("zookeeper.jar"))
            .find(|p| p.is_file())
            .ok_or(HarnessError::MissingBinary {
                binary: "zookeeper.jar".to_owned(),
                hint: HINT,
            })?;
        let mut classpath = vec![jar.clone()];
        // The jar's manifest names its dependencies but no logging backend: add log4j 1.2
        // (configured per server below) or, failing that, slf4j-simple (to stderr).
        let dirs: Vec<PathBuf> = jar
            .parent()
            .map(Path::to_owned)
            .into_iter()
            .chain(JAR_DIRS.iter().map(PathBuf::from))
            .collect();
        let find = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        if let (Some(binding), Some(log4j)) = (find("slf4j-log4j12.jar"), find("log4j-1.2.jar")) {
            classpath.push(binding);
            classpath.push(log4j);
        } else if let Some(simple) = find("slf4j-simple.jar") {
            classpath.push(simple);
        }
        // The manifest names Netty's buffer, common, handler and transport jars but not
        // codec and resolver, which the Netty connection factory (TLS) loads too.
        classpath.extend(NETTY_EXTRA_JARS.iter().filter_map(|name| find(name)));
        let classpath = std::env::join_paths(classpath)
            .map_err(|e| {
                HarnessError::io("zookeeper", "build class path", std::io::Error::other(e))
            })?
            .to_string_lossy()
            .into_owned();
        Ok(Self { java, classpath })
    }
}

/// Waits for `n` (at most [`JVM_STARTS`]) JVM start slots, bounded.
pub(super) async fn start_slots(n: usize) -> Result<SemaphorePermit<'static>, HarnessError> {
    let n = u32::try_from(n.clamp(1, JVM_STARTS)).unwrap_or(1);
    tokio::time::timeout(START_SLOT_TIMEOUT, JVM_START_SLOTS.acquire_many(n))
        .await
        .map_err(|_| {
            HarnessError::io(
                "zookeeper",
                "wait for a JVM start slot",
                std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
            )
        })?
        .map_err(|e| {
            HarnessError::io(
                "zookeeper",
                "wait for a JVM start slot",
                std::io::Error::other(e),
            )
        })
}
