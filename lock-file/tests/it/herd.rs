//! Many waiters of one name in one process: a release lets one of them try, not all.
//! Attempts are counted from the crate's `lock_file::attempt` trace events, never timed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, LockName, LockOptions};
use testkit::file::FileFactory;
use tokio::time::{sleep, timeout};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The name the waiters share; no other test of this binary uses it.
const NAME: &str = "herd-of-waiters";
const WAITERS: usize = 12;

/// Counts the attempts on [`NAME`] of every client of this test binary.
struct AttemptCounter;

static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

struct StemOf(bool);

impl Visit for StemOf {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "stem" && format!("{value:?}") == NAME {
            self.0 = true;
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for AttemptCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() == "lock_file::attempt" {
            let mut of_name = StemOf(false);
            event.record(&mut of_name);
            if of_name.0 {
                ATTEMPTS.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn count_attempts() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(AttemptCounter),
        )
        .expect("the only subscriber of this test binary");
    });
}

/// Twelve clients of one process waiting on one mutex, each taking and releasing it in
/// turn: the twelve hand-overs take at most two attempts each (one waiter tries per
/// release), where every release used to make every remaining waiter try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lets_one_waiter_of_the_process_try() {
    count_attempts();
    let factory = FileFactory::new();
    let mut options = LockOptions::default();
    // Push wake-ups only: no re-check falls within the test.
    options.recheck = Duration::from_secs(30);
    let holder = factory.file_client(options.clone()).await;
    let guard = holder.lock(NAME).await.expect("first holder");
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let client = Arc::new(factory.file_client(options.clone()).await);
        let waiting = Arc::clone(&client);
        let task = tokio::spawn(async move {
            let guard = waiting.lock(NAME).await.expect("a waiter's turn");
            guard.release().await.expect("release");
        });
        waiters.push((client, task));
    }
    let name = LockName::new(NAME).expect("valid");
    timeout(Duration::from_secs(30), async {
        while holder.inspect(&name).await.expect("inspect").waiters.len() < WAITERS {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every waiter waits");
    let before = ATTEMPTS.load(Ordering::Relaxed);
    guard.release().await.expect("release");
    for (client, task) in waiters {
        timeout(Duration::from_secs(30), task)
            .await
            .expect("every waiter gets its turn by push wake-ups")
            .expect("waiter task");
        client.close().await.expect("close");
    }
    let attempts = ATTEMPTS.load(Ordering::Relaxed) - before;
    assert!(
        attempts <= 2 * WAITERS as u64,
        "{WAITERS} hand-overs took {attempts} attempts"
    );
    holder.close().await.expect("close");
}
