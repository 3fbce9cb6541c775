//! One deployment shared by the tests of a test binary, killed when the last test using
//! it ends.
//!
//! Starting servers (JVMs for ZooKeeper, clusters, Sentinels) costs far more than a
//! conformance rule on them, and the rules use fresh lock names in a namespace of their
//! factory's own, so the tests of a suite can share one deployment. [`Shared`] is the
//! slot of one deployment kind (a `static` of the test binary): a test takes the running
//! deployment or starts one, and holds an `Arc` of it; the deployment drops (its servers
//! are killed by pid and reaped) when the last test holding it ends, so no static keeps a
//! child process at exit. Clients, admin connections and proxies belong to each test's
//! factory, never to the deployment: they are bound to the test's own tokio runtime,
//! which ends with the test.
//!
//! What the deployment holds must therefore work from any runtime (the harness's servers
//! do: logs go to files, kill and reap poll `waitpid` by pid). Tests that damage servers
//! (restart, pause, kill, reconfigure) must not use a shared deployment.

use std::future::Future;
use std::sync::{Arc, Weak};

use tokio::sync::Mutex;

/// The slot of one shared deployment kind: a `static` in the test binary.
///
/// ```text
/// static STANDALONE: Shared<ZkServer> = Shared::new();
/// let server = STANDALONE.get_or_start(|| async { ZkServer::start().await.ok() }).await;
/// ```
#[derive(Debug)]
pub struct Shared<T> {
    /// The running deployment, if any test still holds it. An async lock: a test that
    /// starts the deployment holds it across the start, so two tests never start two.
    slot: Mutex<Weak<T>>,
}

impl<T> Shared<T> {
    /// An empty slot.
    pub const fn new() -> Self {
        Shared {
            slot: Mutex::const_new(Weak::new()),
        }
    }

    /// The running deployment, or one started now with `start` (one start at a time;
    /// the others wait for it and share its result). `None` when `start` gives `None`
    /// (a server binary is missing, say); a start that fails or panics leaves the slot
    /// empty, so a later test tries again.
    pub async fn get_or_start<F, Fut>(&self, start: F) -> Option<Arc<T>>
    where
        T: Send + Sync,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Option<T>> + Send,
    {
        let mut slot = self.slot.lock().await;
        if let Some(running) = slot.upgrade() {
            return Some(running);
        }
        let started = Arc::new(start().await?);
        *slot = Arc::downgrade(&started);
        Some(started)
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A namespace no other factory uses (12 hex digits of a fresh UUID): the segment each
/// factory over a shared deployment puts its keys, paths or prefixes under.
pub fn namespace() -> String {
    let mut id = uuid::Uuid::new_v4().simple().to_string();
    id.truncate(12);
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn shares_while_held_and_restarts_after() {
        static SLOT: Shared<usize> = Shared::new();
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let start = || async { Some(STARTS.fetch_add(1, Ordering::SeqCst)) };
        let first = SLOT.get_or_start(start).await.expect("started");
        let second = SLOT.get_or_start(start).await.expect("shared");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(STARTS.load(Ordering::SeqCst), 1);
        drop((first, second));
        let third = SLOT.get_or_start(start).await.expect("started again");
        assert_eq!(*third, 1, "a deployment nobody holds is started afresh");
    }

    #[tokio::test]
    async fn a_failed_start_does_not_poison() {
        static SLOT: Shared<u8> = Shared::new();
        assert!(SLOT.get_or_start(|| async { None }).await.is_none());
        let panicked =
            tokio::spawn(async { SLOT.get_or_start(|| async { panic!("start fails") }).await })
                .await;
        assert!(panicked.is_err());
        let started = SLOT.get_or_start(|| async { Some(7) }).await;
        assert_eq!(started.as_deref(), Some(&7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_starts_start_once() {
        static SLOT: Shared<usize> = Shared::new();
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let take = || {
            tokio::spawn(SLOT.get_or_start(|| async {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                Some(STARTS.fetch_add(1, Ordering::SeqCst))
            }))
        };
        let (a, b) = (take(), take());
        let (a, b) = (a.await.expect("a"), b.await.expect("b"));
        assert!(Arc::ptr_eq(&a.expect("a"), &b.expect("b")));
        assert_eq!(STARTS.load(Ordering::SeqCst), 1);
    }
}
