//! Shutdown: a closed client leaves nothing behind, even when its process ends at once,
//! ends its acquires that still wait, and refuses every call after.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, Election, ErrorKind, LockName, MultiLock,
    ReleaseOutcome, RwLock, Semaphore,
};
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
            ended.kind() == ErrorKind::Closed && ended.to_string() == refused.to_string(),
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

/// A closed client refuses every call at once with [`ErrorKind::Closed`], its message
/// naming the lock: acquires (a try, a wait with a timeout, a wait, a reentrant one), the
/// operator's inspect, list, break and change feed, and where the backend offers them an
/// election's campaign, leader and observer, a semaphore's permit and occupancy, a
/// read-write lock's read, write and occupancy, and a multi-lock; the `extend` of a guard
/// it held says so too (its release, and a leadership's resign, say the hold is already
/// lost). Closing again is harmless, nothing of the closed client is left on the server,
/// and another client takes what it held at once.
pub async fn closed_client_refuses_every_call(factory: &dyn Factory) {
    const RULE: &str = "closed_client_refuses_every_call";
    let held = unique_name("closed_held");
    let led = unique_name("closed_led");
    let free = unique_name("closed_free");
    let other = factory.client(with_ttl(LONG_TTL)).await;
    let closing = factory.client(with_ttl(LONG_TTL)).await;
    let offers = closing.capabilities();
    let guard = closing.lock(held.as_str()).await.expect("acquire");
    let election = offers
        .election
        .then(|| Election::new(Arc::clone(&closing), led.as_str()).expect("an election"));
    let leadership = match &election {
        Some(election) => Some(
            election
                .campaign_with("closing", &AcquireOptions::try_once())
                .await
                .expect("campaign")
                .expect("nobody else campaigns"),
        ),
        None => None,
    };
    closing.close().await.expect("close");

    let mut calls = Calls::default();
    let once = AcquireOptions::try_once();
    calls
        .refused("try", &free, closing.acquire(&free, &once))
        .await;
    let limit = Duration::from_secs(1);
    calls
        .refused(
            "wait with a timeout",
            &free,
            closing.lock_timeout(free.as_str(), limit),
        )
        .await;
    calls
        .refused("wait", &free, closing.lock(free.as_str()))
        .await;
    let reentrant = AcquireOptions::try_once().reentrant("closed-owner");
    calls
        .refused("reentrant try", &held, closing.acquire(&held, &reentrant))
        .await;
    calls
        .refused("inspect", &held, closing.inspect(&held))
        .await;
    let prefix = held
        .as_str()
        .rsplit_once('/')
        .map_or("", |(prefix, _)| prefix);
    calls
        .refused(
            "list",
            &LockName::new(prefix).expect("a prefix is a name"),
            closing.list(prefix),
        )
        .await;
    calls
        .refused("force_release", &held, closing.force_release(&held))
        .await;
    calls
        .refused("changes", &held, closing.changes(&held))
        .await;
    calls.refused("extend", &held, guard.extend()).await;
    if let Some(election) = &election {
        calls
            .refused("campaign", &led, election.campaign_with("again", &once))
            .await;
        calls.refused("leader", &led, election.leader()).await;
        calls
            .refused("observe", &led, election.observe().next())
            .await;
    }
    if offers.semaphore {
        let semaphore =
            Semaphore::new(Arc::clone(&closing), free.as_str(), 2).expect("a semaphore");
        calls
            .refused("semaphore permit", &free, semaphore.acquire_with(&once))
            .await;
        calls
            .refused("semaphore occupancy", &free, semaphore.occupancy())
            .await;
    }
    if offers.rwlock {
        let rwlock = RwLock::new(Arc::clone(&closing), free.as_str()).expect("a read-write lock");
        calls.refused("read", &free, rwlock.read_with(&once)).await;
        calls
            .refused("write", &free, rwlock.write_with(&once))
            .await;
        calls
            .refused("read-write lock occupancy", &free, rwlock.occupancy())
            .await;
    }
    let multi =
        MultiLock::new(Arc::clone(&closing), [free.as_str(), held.as_str()]).expect("a multi-lock");
    calls
        .refused("multi-lock", &free, multi.acquire_with(&once))
        .await;
    let released = guard.release().await;
    if !matches!(released, Ok(ReleaseOutcome::AlreadyLost(_))) {
        calls
            .wrong
            .push(format!("release of a guard held at close: {released:?}"));
    }
    if let Some(leadership) = leadership {
        let resigned = leadership.resign().await;
        if !matches!(resigned, Ok(ReleaseOutcome::AlreadyLost(_))) {
            calls.wrong.push(format!(
                "resign of a leadership held at close: {resigned:?}"
            ));
        }
    }
    if let Err(err) = closing.close().await {
        calls.wrong.push(format!("closing again: {err}"));
    }
    assert!(
        calls.wrong.is_empty(),
        "[{RULE}] {}: calls on a closed client that did not report ErrorKind::Closed:\n  {}",
        factory.label(),
        calls.wrong.join("\n  ")
    );

    let taken = timeout(PROMPT, other.try_lock(held.as_str()))
        .await
        .expect("a try answers promptly")
        .expect("try");
    let taken = taken.unwrap_or_else(|| {
        panic!(
            "[{RULE}] {}: what the closed client held is still held",
            factory.label()
        )
    });
    taken.release().await.expect("release");
    eventually_empty(factory, &[held, led, free], RULE).await;
}

/// The calls of [`closed_client_refuses_every_call`] that did not come to
/// [`ErrorKind::Closed`] naming their lock, each described.
#[derive(Default)]
struct Calls {
    wrong: Vec<String>,
}

impl Calls {
    /// Runs `call` on a closed client: it must fail within [`PROMPT`] with
    /// [`ErrorKind::Closed`], its message naming `name`.
    async fn refused<T>(
        &mut self,
        what: &str,
        name: &LockName,
        call: impl Future<Output = lock_core::Result<T>>,
    ) {
        let wrong = match timeout(PROMPT, call).await {
            Err(_) => format!("{what}: still running after {PROMPT:?}"),
            Ok(Ok(_)) => format!("{what}: succeeded"),
            Ok(Err(err)) if err.kind() != ErrorKind::Closed => {
                format!("{what}: {:?}: {err}", err.kind())
            }
            Ok(Err(err)) if !err.to_string().contains(name.as_str()) => {
                format!("{what}: the message does not name `{name}`: {err}")
            }
            Ok(Err(_)) => return,
        };
        self.wrong.push(wrong);
    }
}
