//! The cleanup of a cancelled acquire on etcd: a delete that gets no answer is tried
//! again until the key is gone, while the client's lease lives on.

use std::time::Duration;

use conformance::rules::unique_name;
use conformance::Factory;
use lab::chaos::ChaosTarget;
use lock_core::DistributedLockExt;
use testkit::etcd::{keys_under, with_ttl, EtcdFactory};
use tokio::time::{sleep, Instant};

/// Bound on "promptly", as the conformance rules use it.
const PROMPT: Duration = Duration::from_secs(3);

/// A waiter's acquire is dropped while its link is cut, so the cleanup's delete of its
/// queued key (create revision known) gets no answer; once the link heals, well within
/// the client's lease, the key must go: a key left queued would hold up every later
/// waiter for as long as the client lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_delete_without_answer_is_tried_again() {
    let Some(factory) = EtcdFactory::start().await else {
        return;
    };
    let mut options = with_ttl(Duration::from_secs(6));
    options.request_timeout = Duration::from_millis(500);
    let name = unique_name("cleanup_retried");
    let range = factory.range(&name);
    let holder = factory.client(options.clone()).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let (waiter, link) = factory.linked_client(options).await;
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.lock(name.as_str()).await.map(drop) }
    });
    let queued = Instant::now() + PROMPT;
    while keys_under(factory.admin(), &range).await.len() < 2 {
        assert!(Instant::now() < queued, "the waiter never queued");
        sleep(Duration::from_millis(20)).await;
    }
    link.cut();
    waiting.abort();
    // The cleanup's delete times out (request timeout 500 ms) while the link is cut.
    sleep(Duration::from_millis(1500)).await;
    link.heal();
    let healed = Instant::now();
    loop {
        let keys = keys_under(factory.admin(), &range).await;
        if keys.len() == 1 {
            break;
        }
        assert!(
            healed.elapsed() < PROMPT,
            "the cancelled waiter's key is still queued {PROMPT:?} after the link healed \
             (the client and its lease live on): {keys:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    println!("the key went {:?} after the heal", healed.elapsed());
    guard.release().await.expect("release");
    drop(waiter);
}
