//! The background work of one client (releases, cleanups of abandoned acquires), kept
//! track of so that closing the client can wait for it before ending its session.

use std::future::Future;
use std::time::Duration;

use tokio_util::task::TaskTracker;

/// Spawns a client's background tasks and waits for them at close.
#[derive(Debug, Clone, Default)]
pub struct Background {
    tasks: TaskTracker,
}

impl Background {
    /// A tracker with no task yet.
    pub fn new() -> Self {
        Background::default()
    }

    /// Runs `task` in the background of the current runtime. Outside a runtime (a guard
    /// dropped after it ended) nothing can run: the server-side expiry ends what `task`
    /// would have undone.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.tasks.spawn_on(task, &runtime);
            }
            Err(_) => tracing::warn!(
                "background work of a lock client was left outside a runtime; the server-side expiry ends what it left"
            ),
        }
    }

    /// Waits until the tasks spawned so far have ended, at most `limit`; whether they all
    /// did. Tasks spawned meanwhile are waited for too.
    pub async fn settle(&self, limit: Duration) -> bool {
        self.tasks.close();
        let settled = tokio::time::timeout(limit, self.tasks.wait()).await.is_ok();
        self.tasks.reopen();
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn settle_waits_for_the_tasks_and_no_longer_than_its_limit() {
        let background = Background::new();
        let done = Arc::new(AtomicBool::new(false));
        background.spawn({
            let done = Arc::clone(&done);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                done.store(true, Ordering::SeqCst);
            }
        });
        assert!(background.settle(Duration::from_secs(1)).await);
        assert!(done.load(Ordering::SeqCst));

        background.spawn(std::future::pending());
        assert!(!background.settle(Duration::from_millis(100)).await);
        // Still usable after a settle.
        background.spawn(async {});
        assert!(!background.settle(Duration::from_millis(100)).await);
    }
}
