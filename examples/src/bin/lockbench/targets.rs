//! What lockbench measures: one target per backend, with its servers, its lock URL and
//! the raw protocol floor on the same servers.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One raw hold of the floor protocol (key and token, node path, key).
#[derive(Debug)]
#[expect(
    dead_code,
    reason = "read by the floors of the networked backends as they land"
)]
pub(crate) struct RawHold {
    pub(crate) name: String,
    pub(crate) token: String,
}

/// The same operations as a lock, in the backend's raw protocol with no library on top:
/// the floor every ratio is measured against.
#[async_trait]
pub(crate) trait RawFloor: Send + Sync {
    /// What the floor does, for the report.
    fn describe(&self) -> String;
    /// Takes `name` (uncontended).
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError>;
    /// Gives it back.
    async fn release(&self, hold: RawHold) -> Result<(), BoxError>;
}

/// A backend under test.
pub(crate) struct Target {
    /// Short label (`memory`, `redis`, `redlock-5`, `zookeeper`, `etcd`).
    pub(crate) label: String,
    /// URL of the lock service, without query string.
    pub(crate) url: String,
    /// The raw protocol floor on the same servers, if the backend has one.
    pub(crate) floor: Option<Arc<dyn RawFloor>>,
    /// Whether a holder in another process can be killed (not for in-process backends).
    pub(crate) cross_process: bool,
    /// Shortest TTL for the takeover workload.
    pub(crate) takeover_ttl: Duration,
    /// Servers and proxies kept alive for the run.
    pub(crate) _servers: Vec<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.label)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The URL with `query` appended.
    pub(crate) fn url_with(&self, query: &str) -> String {
        if query.is_empty() {
            self.url.clone()
        } else {
            format!("{}?{query}", self.url)
        }
    }
}

/// The backends lockbench knows, in report order.
pub(crate) const BACKENDS: &[&str] = &["memory", "redis", "redlock", "zookeeper", "etcd"];

/// Starts what `backend` needs. `Ok(None)` means the backend is not available in this
/// build, with the reason printed loudly by the caller.
pub(crate) async fn start(backend: &str) -> Result<Target, String> {
    match backend {
        "memory" => Ok(Target {
            label: "memory".into(),
            url: format!("memory://lockbench-{}", uuid::Uuid::new_v4().simple()),
            floor: None,
            cross_process: false,
            takeover_ttl: Duration::from_secs(1),
            _servers: Vec::new(),
        }),
        "redis" | "redlock" | "zookeeper" | "etcd" => Err(format!(
            "the {backend} backend has not landed in this build yet"
        )),
        other => Err(format!(
            "unknown backend `{other}` (known: {})",
            BACKENDS.join(", ")
        )),
    }
}
