//! Shutdown: a closed client leaves nothing behind, even when its process ends at once,
//! and ends its acquires that still wait.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockName};
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, unique_name, waiters_reach, PROMPT};
use crate::factory::{with_ttl, Factory};

/// A lease long enough that a grant within [`PROMPT`] cannot come from its expiry.
const LONG_TTL: Duration = Duration::from_secs(10);

/// Closing a client frees at once what it held and what it queued, although its runtime
/// ends right after, as a process exiting would end it (no background task of the client
/// runs after that): another client gets the held name within a few seconds, not after the
/// lease (TTL, session, lease of 10 s), the name it was queued for follows its holder's
/// release, the closed client acquires no more, and nothing is left on the server.
pub async fn close_frees_everything(factory: &dyn Factory) {
    let held = unique_name("close_held");
    let queued = unique_name("close_queued");
    let other = factory.client(with_ttl(LONG_TTL)).await;
    let blocker = other.lock(queued.as_str()).await.expect("acquire");
    // The rule runs on a multi-thread runtime only (see explore::MULTI_THREAD_RULES).
    let acquired_after_close = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| close_in_a_runtime_of_its_own(factory, &held, &queued))
                .join()
                .expect("the closing client's thread")
        })
    });
    let closed_at = Instant::now();
    blocker.release().await.expect("release");
    let next = timeout(PROMPT, other.lock(queued.as_str()))
        .await
        .expect("the name a closed client queued for is granted promptly")
        .expect("acquire");
    next.release().await.expect("release");
    loop {
        if let Some(guard) = other.try_lock(held.as_str()).await.expect("try") {
            guard.release().await.expect("release");
            break;
        }
        assert!(
            closed_at.elapsed() < PROMPT,
            "[close_frees_everything] {}: the name a closed client held is still held \
             {PROMPT:?} after close (its lease is {LONG_TTL:?})",
            factory.label()
        );
        sleep(Duration::from_millis(50)).await;
    }
    eventually_empty(factory, &[held, queued], "close_frees_everything").await;
    assert!(
        acquired_after_close.is_err(),
        "a closed client acquires no more: {acquired_after_close:?}"
    );
}

/// Closing a client ends its waiting acquire with the closed client's error and takes its
/// waiter off the server before `close()` returns.
pub async fn close_ends_waiting_acquires(factory: &dyn Factory) {
    const RULE: &str = "close_ends_waiting_acquires";
    let name = unique_name("close_waiting");
    let holder = factory.client(with_ttl(LONG_TTL)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let closing = factory.client(with_ttl(LONG_TTL)).await;
    let waiting = tokio::spawn({
        let (closing, name) = (Arc::clone(&closing), name.clone());
        async move { closing.lock(name.as_str()).await.map(drop) }
    });
    if closing.capabilities().fair {
        waiters_reach(&*holder, &name, 1).await;
    } else {
        // Its waiters leave no trace on the server to wait for.
        sleep(Duration::from_millis(300)).await;
    }
    closing.close().await.expect("close");
    let left = holder.inspect(&name).await.expect("inspect").waiters;
    // The acquire has ended; its task may still be on its way to report it.
    let ended = timeout(Duration::from_secs(1), waiting).await;
    assert!(
        left.is_empty(),
        "[{RULE}] {}: waiters left after close() returned: {left:?}",
        factory.label()
    );
    let ended = ended
        .unwrap_or_else(|_| panic!("[{RULE}] {}: the acquire still waits", factory.label()))
        .expect("the waiting task");
    let refused = closing
        .acquire(&name, &AcquireOptions::try_once())
        .await
        .map(|guard| guard.is_some());
    match (&ended, &refused) {
        (Err(ended), Err(refused)) => assert!(
            ended.kind() == ErrorKind::Unsupported && ended.to_string() == refused.to_string(),
            "[{RULE}] {}: the ended acquire reports `{ended}`, an acquire after close `{refused}`",
            factory.label()
        ),
        _ => panic!(
            "[{RULE}] {}: the waiting acquire came to {ended:?}, one after close to {refused:?}",
            factory.label()
        ),
    }
    guard.release().await.expect("release");
    eventually_empty(factory, &[name], RULE).await;
}

/// In a runtime of its own, which ends when this returns: a client holds `held`, gives up
/// a wait for `queued`, and is closed with its guard still alive (dropped only once the
/// runtime is gone); what an acquire after the close came to (whether it got a guard, or
/// its error).
fn close_in_a_runtime_of_its_own(
    factory: &dyn Factory,
    held: &LockName,
    queued: &LockName,
) -> Result<bool, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let (guard, after) = runtime.block_on(async {
        let closing = factory.client(with_ttl(LONG_TTL)).await;
        let guard = closing.lock(held.as_str()).await.expect("acquire");
        let gave_up = timeout(Duration::from_millis(300), closing.lock(queued.as_str())).await;
        assert!(
            gave_up.is_err(),
            "the queued name is held by another client"
        );
        closing.close().await.expect("close");
        let after = closing.acquire(held, &AcquireOptions::try_once()).await;
        let after = after
            .map(|guard| guard.is_some())
            .map_err(|err| err.to_string());
        (guard, after)
    });
    // The runtime ends with the guard alive, as a process would exit; the guard goes only
    // after, when nothing of the client runs any more.
    drop(runtime);
    drop(guard);
    after
}
