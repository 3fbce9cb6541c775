//! Read-write locks: readers together and never beside a writer, FIFO so that writers
//! are not starved, a downgrade without a window, cancellation leaves nothing; one
//! upgradeable reader beside readers, upgrading without a writer in between.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{
    AcquireOptions, DistributedLock, ErrorKind, LockOptions, ReadGuard, RwLock,
    UpgradeableReadGuard, WriteGuard,
};
use rand::Rng;
use tokio::time::{sleep, timeout, Instant};

use super::semaphore::semaphore;
use super::{
    cut_off_then_replaced, eventually_empty, offered, push_only_options, unique_name,
    waiters_reach, PROMPT,
};
use crate::factory::Factory;
use crate::limits::HoldLog;
use crate::with_ttl;

/// The read-write lock `name` on `client`, or `None` (said loudly) when the backend has
/// none.
fn rwlock(client: &Arc<dyn DistributedLock>, name: &str, rule: &str) -> Option<RwLock> {
    offered(RwLock::new(Arc::clone(client), name), rule)
}

async fn read(lock: &RwLock, limit: Duration) -> ReadGuard {
    lock.read_with(&AcquireOptions::timeout(limit))
        .await
        .expect("read within the limit")
        .expect("a waiting read ends holding")
}

async fn write(lock: &RwLock, limit: Duration) -> WriteGuard {
    lock.write_with(&AcquireOptions::timeout(limit))
        .await
        .expect("write within the limit")
        .expect("a waiting write ends holding")
}

async fn upgradeable(lock: &RwLock, limit: Duration) -> UpgradeableReadGuard {
    lock.upgradeable_read_with(&AcquireOptions::timeout(limit))
        .await
        .expect("upgradeable read within the limit")
        .expect("a waiting upgradeable read ends holding")
}

/// The read-write lock `name` on a new client whose waiters act only on pushes.
async fn push_only_rwlock(factory: &dyn Factory, name: &lock_core::LockName, rule: &str) -> RwLock {
    let client = factory.client(push_only_options()).await;
    rwlock(&client, name.as_str(), rule).expect("capable")
}

/// `acquire` in a task of its own, which ends with the guard and when it was granted.
fn timed<G: Send + 'static>(
    acquire: impl std::future::Future<Output = G> + Send + 'static,
) -> tokio::task::JoinHandle<(G, Instant)> {
    tokio::spawn(async move {
        let guard = acquire.await;
        (guard, Instant::now())
    })
}

/// The guard of `task` (see [`timed`]), which must end within `limit` (`what` says why)
/// and be granted no earlier than `after`.
async fn served<G>(
    task: tokio::task::JoinHandle<(G, Instant)>,
    limit: Duration,
    after: Instant,
    what: &str,
) -> G {
    let (guard, at) = timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .expect("task");
    assert!(at >= after, "{what}: granted too early");
    guard
}

/// Whether `lock`'s service offers upgradeable readers; where it does not, its refusal
/// must be a typed [`ErrorKind::Unsupported`] (said loudly, the rule does not apply).
async fn upgradeable_offered(client: &dyn DistributedLock, lock: &RwLock, rule: &str) -> bool {
    if client.capabilities().upgradeable {
        return true;
    }
    let err = lock
        .try_upgradeable_read()
        .await
        .expect_err("a service without upgradeable readers refuses them");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "[{rule}] {err}");
    eprintln!("[conformance] {rule}: {err}; the rule does not apply");
    false
}

/// A fresh name for `rule` and its read-write lock on a first client made with
/// `options`, or `None` where the backend offers no upgradeable readers (see
/// [`upgradeable_offered`]) or no read-write locks.
async fn upgradeable_rule(
    factory: &dyn Factory,
    rule: &str,
    options: LockOptions,
) -> Option<(lock_core::LockName, Arc<dyn DistributedLock>, RwLock)> {
    let name = unique_name(rule);
    let client = factory.client(options).await;
    let lock = rwlock(&client, name.as_str(), rule)?;
    upgradeable_offered(&*client, &lock, rule)
        .await
        .then_some((name, client, lock))
}

/// Four readers and two writers take the lock 4 times each: no writer is ever beside
/// anyone, and readers do hold together.
pub async fn rwlock_readers_share_writers_exclude(factory: &dyn Factory) {
    const READERS: usize = 4;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 4;
    let rule = "rwlock_readers_share_writers_exclude";
    let name = unique_name(rule);
    let log = HoldLog::new();
    let mut tasks = Vec::new();
    for i in 0..READERS + WRITERS {
        let client = factory.client(LockOptions::default()).await;
        let Some(lock) = rwlock(&client, name.as_str(), rule) else {
            return;
        };
        let log = log.clone();
        let writer = i >= READERS;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                // The time inside starts once the hold is granted.
                let inside = || sleep(Duration::from_millis(60));
                if writer {
                    let guard = write(&lock, Duration::from_secs(60)).await;
                    log.inside(&guard, true, inside()).await;
                    guard.release().await.expect("release");
                } else {
                    let guard = read(&lock, Duration::from_secs(60)).await;
                    log.inside(&guard, false, inside()).await;
                    guard.release().await.expect("release");
                }
                let pause = rand::rng().random_range(0..20);
                sleep(Duration::from_millis(pause)).await;
            }
            drop(client);
        }));
    }
    for task in join_all(tasks).await {
        task.expect("contender task");
    }
    let report = log.check();
    assert_eq!(
        report.unvouched, 0,
        "every guard vouched while inside: {report:?}"
    );
    assert!(
        report.exclusive_overlaps.is_empty(),
        "a writer beside someone: {report:?}"
    );
    assert!(
        report.most_at_once >= 2,
        "readers never held together: {report:?}"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// A writer waiting behind a reader is not overtaken by later readers: a reader's try
/// fails while the writer waits, the writer is served by a push when the first reader
/// leaves, and the later reader after the writer.
pub async fn rwlock_writer_not_starved(factory: &dyn Factory) {
    let rule = "rwlock_writer_not_starved";
    let name = unique_name(rule);
    let first = factory.client(LockOptions::default()).await;
    let Some(on_first) = rwlock(&first, name.as_str(), rule) else {
        return;
    };
    let on_writer = push_only_rwlock(factory, &name, rule).await;
    let on_later = push_only_rwlock(factory, &name, rule).await;

    let reading = read(&on_first, PROMPT).await;
    let waiting_writer = timed(async move { write(&on_writer, Duration::from_secs(30)).await });
    waiters_reach(&*first, &name, 1).await;
    assert!(
        on_later
            .read_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a reader's try must not overtake a waiting writer"
    );
    let later_reader = timed(async move { read(&on_later, Duration::from_secs(30)).await });
    waiters_reach(&*first, &name, 2).await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        !later_reader.is_finished(),
        "a later reader waits for the writer"
    );
    let released = Instant::now();
    reading.release().await.expect("release");
    let (writing, wrote_at) = timeout(PROMPT, waiting_writer)
        .await
        .expect("the writer is served by a push")
        .expect("writer task");
    assert!(wrote_at - released < PROMPT);
    sleep(Duration::from_millis(200)).await;
    assert!(!later_reader.is_finished(), "no reader beside the writer");
    let freed = Instant::now();
    writing.release().await.expect("release");
    let late = served(
        later_reader,
        PROMPT,
        freed,
        "the later reader is served after the writer",
    )
    .await;
    late.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// A writer downgrades to a reader with a reader and then a writer queued behind it: the
/// guard stays Held with its fencing token throughout, the queued reader joins it by a
/// push, the queued writer waits until both readers leave.
pub async fn rwlock_downgrade_without_window(factory: &dyn Factory) {
    let rule = "rwlock_downgrade_without_window";
    let name = unique_name(rule);
    let owner = factory.client(LockOptions::default()).await;
    let Some(on_owner) = rwlock(&owner, name.as_str(), rule) else {
        return;
    };
    let on_reader = push_only_rwlock(factory, &name, rule).await;
    let on_writer = push_only_rwlock(factory, &name, rule).await;

    let writing = write(&on_owner, PROMPT).await;
    let token = writing.fencing_token();
    let watch = writing.watch();
    let queued_reader =
        tokio::spawn(async move { read(&on_reader, Duration::from_secs(30)).await });
    waiters_reach(&*owner, &name, 1).await;
    let queued_writer =
        tokio::spawn(async move { write(&on_writer, Duration::from_secs(30)).await });
    waiters_reach(&*owner, &name, 2).await;

    let reading = writing.downgrade().await.expect("downgrade");
    assert!(reading.is_held(), "held through the downgrade");
    assert_eq!(reading.fencing_token(), token, "the fencing token stays");
    let joined = timeout(PROMPT, queued_reader)
        .await
        .expect("the queued reader joins the downgraded holder by a push")
        .expect("reader task");
    sleep(Duration::from_millis(300)).await;
    assert!(
        !queued_writer.is_finished(),
        "the queued writer waits for both readers"
    );
    assert!(
        !watch.state().is_lost(),
        "the downgraded guard never turned Lost"
    );
    let inspected = on_owner.occupancy().await.expect("inspect");
    assert_eq!(inspected.holders().count(), 2, "two readers: {inspected:?}");
    reading.release().await.expect("release");
    sleep(Duration::from_millis(200)).await;
    assert!(
        !queued_writer.is_finished(),
        "the queued writer waits for the other reader"
    );
    joined.release().await.expect("release");
    let last = timeout(PROMPT, queued_writer)
        .await
        .expect("the writer is served once the readers left")
        .expect("writer task");
    last.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// Acquires of permits, reads and writes dropped at random points under contention leave
/// no entry behind, and a semaphore's permits are all free right after.
pub async fn primitives_cancellation_leaves_nothing(factory: &dyn Factory) {
    const ROUNDS: usize = 24;
    let rule = "primitives_cancellation_leaves_nothing";
    let (sem_name, rw_name) = (unique_name(rule), unique_name(rule));
    let holder = factory.client(LockOptions::default()).await;
    let Some(on_holder) = rwlock(&holder, rw_name.as_str(), rule) else {
        return;
    };
    let Some(held_sem) = semaphore(&holder, sem_name.as_str(), 2, rule) else {
        return;
    };
    let writing = write(&on_holder, PROMPT).await;
    let permits = [
        held_sem
            .acquire_with(&AcquireOptions::try_once())
            .await
            .expect("permit")
            .expect("free"),
        held_sem
            .acquire_with(&AcquireOptions::try_once())
            .await
            .expect("permit")
            .expect("free"),
    ];
    let mut releases = Some((writing, permits));
    let client = factory.client(LockOptions::default()).await;
    let lock = rwlock(&client, rw_name.as_str(), rule).expect("capable");
    let sem = semaphore(&client, sem_name.as_str(), 2, rule).expect("capable");
    let mut contenders = Vec::new();
    for round in 0..ROUNDS {
        let (lock, sem) = (lock.clone(), sem.clone());
        let cut_after = Duration::from_micros(rand::rng().random_range(0..30_000));
        contenders.push(tokio::spawn(async move {
            let forever = AcquireOptions::forever();
            // Whatever happens, the future is dropped: at a random await point, or just
            // after it was granted (the guard is then dropped too).
            match round % 3 {
                0 => drop(timeout(cut_after, lock.read_with(&forever)).await),
                1 => drop(timeout(cut_after, lock.write_with(&forever)).await),
                _ => drop(timeout(cut_after, sem.acquire_with(&forever)).await),
            }
        }));
        if round == ROUNDS / 2 {
            if let Some((writing, permits)) = releases.take() {
                writing.release().await.expect("release");
                for permit in permits {
                    permit.release().await.expect("release");
                }
            }
        }
        let pause = Duration::from_millis(rand::rng().random_range(0..5));
        sleep(pause).await;
    }
    for task in contenders {
        task.await.expect("contender task");
    }
    let names = [sem_name.clone(), rw_name.clone()];
    eventually_empty(factory, &names, rule).await;
    let fresh = factory.client(LockOptions::default()).await;
    let sem = semaphore(&fresh, sem_name.as_str(), 2, rule).expect("capable");
    let both = [
        sem.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try"),
        sem.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try"),
    ];
    assert!(
        both.iter().all(Option::is_some),
        "both permits are free again"
    );
    for permit in both.into_iter().flatten() {
        permit.release().await.expect("release");
    }
    let lock = rwlock(&fresh, rw_name.as_str(), rule).expect("capable");
    let writing = lock
        .write_with(&AcquireOptions::try_once())
        .await
        .expect("try")
        .expect("the lock is free right after the cancellations");
    writing.release().await.expect("release");
    eventually_empty(factory, &names, rule).await;
}

/// A writer cut off from the server turns Lost before a waiting writer is given the lock,
/// which happens within the TTL; the waiter, granted by its own acquire once the cut-off
/// lease ran out, holds for its own TTL (the lease oracle reads its server's lease).
pub async fn rwlock_cut_off_writer_is_replaced(factory: &dyn Factory) {
    let rule = "rwlock_cut_off_writer_is_replaced";
    if !super::leased(factory, rule).await {
        return;
    }
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let (a, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let b = factory.client(with_ttl(ttl)).await;
    let Some(on_a) = rwlock(&a, name.as_str(), rule) else {
        return;
    };
    let on_b = rwlock(&b, name.as_str(), rule).expect("capable");
    let first = write(&on_a, PROMPT).await;
    let next = async {
        let waiting = tokio::spawn(async move { write(&on_b, ttl * 4 + PROMPT).await });
        waiting.await.expect("the waiting writer")
    };
    let second = cut_off_then_replaced(first.watch(), &*crash, ttl, next).await;
    sleep(ttl / 2).await;
    assert!(second.is_held(), "[{rule}] the new writer holds on");
    second.release().await.expect("release");
    drop(first);
}

/// One upgradeable reader at a time, beside plain readers and no writer: beside a reader
/// it is granted, a second one's try fails and a writer's too, a reader's try succeeds;
/// a queued second one is granted by a push once the first leaves.
pub async fn rwlock_upgradeable_one_beside_readers(factory: &dyn Factory) {
    let rule = "rwlock_upgradeable_one_beside_readers";
    let Some((name, first, on_first)) =
        upgradeable_rule(factory, rule, LockOptions::default()).await
    else {
        return;
    };
    let on_second = push_only_rwlock(factory, &name, rule).await;

    let reading = read(&on_second, PROMPT).await;
    let upgrading = upgradeable(&on_first, PROMPT).await;
    assert!(upgrading.is_held());
    let tries = (
        on_second.try_upgradeable_read().await.expect("try"),
        on_second.try_write().await.expect("try"),
        on_second.try_read().await.expect("try"),
    );
    assert!(
        tries.0.is_none(),
        "[{rule}] two upgradeable readers at once"
    );
    assert!(
        tries.1.is_none(),
        "[{rule}] a writer beside an upgradeable reader"
    );
    let also = tries.2.expect("a reader beside the upgradeable reader");
    let inspected = on_first.occupancy().await.expect("inspect");
    assert_eq!(inspected.holders().count(), 3, "{inspected:?}");
    assert!(
        inspected
            .holders()
            .any(|p| p.kind == Some(lock_core::raw::backend::HoldKind::Upgradeable)),
        "inspections show the upgradeable reader: {inspected:?}"
    );
    let queued = timed(async move { upgradeable(&on_second, Duration::from_secs(30)).await });
    waiters_reach(&*first, &name, 1).await;
    sleep(Duration::from_millis(200)).await;
    assert!(!queued.is_finished(), "[{rule}] the second one waits");
    let released = Instant::now();
    upgrading.release().await.expect("release");
    let next = served(
        queued,
        PROMPT,
        released,
        "the queued upgradeable reader is served by a push",
    )
    .await;
    for guard in [reading.into_guard(), also.into_guard(), next.into_guard()] {
        guard.release().await.expect("release");
    }
    eventually_empty(factory, &[name], rule).await;
}

/// Upgradeable readers that upgrade, readers and writers take the lock 3 times each:
/// no writer is ever beside anyone, no two upgradeable readers are side by side, and no
/// writer comes between an upgradeable reader's grant and the end of the writer it
/// became ([`HoldLog`]); readers do hold beside upgradeable readers.
pub async fn rwlock_upgrade_no_writer_between(factory: &dyn Factory) {
    const UPGRADERS: usize = 2;
    const READERS: usize = 3;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 3;
    let rule = "rwlock_upgrade_no_writer_between";
    let name = unique_name(rule);
    let log = HoldLog::new();
    let mut tasks = Vec::new();
    for i in 0..UPGRADERS + READERS + WRITERS {
        let client = factory.client(LockOptions::default()).await;
        let Some(lock) = rwlock(&client, name.as_str(), rule) else {
            return;
        };
        if i == 0 && !upgradeable_offered(&*client, &lock, rule).await {
            return;
        }
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let limit = Duration::from_secs(60);
            for _ in 0..ROUNDS {
                let inside = || sleep(Duration::from_millis(50));
                if i < UPGRADERS {
                    let guard = upgradeable(&lock, limit).await;
                    let start = Instant::now();
                    inside().await;
                    let writing = timeout(limit, guard.upgrade())
                        .await
                        .expect("upgrade within the limit")
                        .expect("upgrade");
                    log.upgradeable_since(&writing, start);
                    log.inside(&writing, true, inside()).await;
                    writing.release().await.expect("release");
                } else if i < UPGRADERS + READERS {
                    let guard = read(&lock, limit).await;
                    log.inside(&guard, false, inside()).await;
                    guard.release().await.expect("release");
                } else {
                    let guard = write(&lock, limit).await;
                    log.inside(&guard, true, inside()).await;
                    guard.release().await.expect("release");
                }
                let pause = rand::rng().random_range(0..20);
                sleep(Duration::from_millis(pause)).await;
            }
            drop(client);
        }));
    }
    for task in join_all(tasks).await {
        task.expect("contender task");
    }
    let report = log.check();
    assert_eq!(report.unvouched, 0, "every guard vouched: {report:?}");
    assert!(
        report.exclusive_overlaps.is_empty(),
        "[{rule}] a writer beside someone, or two upgradeable readers: {report:?}"
    );
    assert!(report.most_at_once >= 2, "nobody ever shared: {report:?}");
    eventually_empty(factory, &[name], rule).await;
}

/// An upgrade waits for the readers that hold beside it (queued before it and after it),
/// and readers and writers that come once it began wait behind it: it ends by a push when the last reader leaves,
/// keeping its fencing token (above the writer's before it, below the writer's after).
pub async fn rwlock_upgrade_waits_for_readers(factory: &dyn Factory) {
    let rule = "rwlock_upgrade_waits_for_readers";
    let Some((name, _owner, on_owner)) = upgradeable_rule(factory, rule, push_only_options()).await
    else {
        return;
    };
    let on_other = push_only_rwlock(factory, &name, rule).await;

    let before = write(&on_other, PROMPT).await;
    let before_token = before.fencing_token();
    before.release().await.expect("release");
    // Readers beside it: one queued before it, one after it.
    let reading = read(&on_other, PROMPT).await;
    let upgrading = upgradeable(&on_owner, PROMPT).await;
    let behind = read(&on_other, PROMPT).await;
    let token = upgrading.fencing_token();
    assert!(token > before_token, "[{rule}] tokens rise");
    let watch = upgrading.watch();
    let upgrade = tokio::spawn(async move { (upgrading.upgrade().await, Instant::now()) });
    // Once the upgrade began, a new reader waits (one that came just before it is
    // granted, and let go at once).
    let deadline = Instant::now() + PROMPT;
    loop {
        match on_other.try_read().await.expect("try") {
            None => break,
            Some(early) => {
                early.release().await.expect("release");
            }
        }
        assert!(Instant::now() < deadline, "[{rule}] readers never waited");
        sleep(Duration::from_millis(20)).await;
    }
    assert!(
        on_other.try_write().await.expect("try").is_none(),
        "[{rule}] a writer's try during the upgrade"
    );
    let on_later = on_other.clone();
    let later_reader = timed(async move { read(&on_later, Duration::from_secs(30)).await });
    sleep(Duration::from_millis(300)).await;
    assert!(
        !upgrade.is_finished(),
        "[{rule}] the upgrade ended beside a reader"
    );
    assert!(
        !later_reader.is_finished(),
        "[{rule}] a reader overtook the upgrade"
    );
    reading.release().await.expect("release");
    sleep(Duration::from_millis(300)).await;
    assert!(
        !upgrade.is_finished(),
        "[{rule}] the upgrade ended beside the reader queued after it"
    );
    let left = Instant::now();
    behind.release().await.expect("release");
    let (upgraded, upgraded_at) = timeout(PROMPT, upgrade)
        .await
        .expect("the upgrade ends by a push once the reader left")
        .expect("task");
    let writing = upgraded.expect("upgrade");
    assert!(upgraded_at >= left);
    assert!(writing.is_held(), "held through the upgrade");
    assert!(!watch.state().is_lost(), "never Lost through the upgrade");
    assert_eq!(writing.fencing_token(), token, "[{rule}] the token stays");
    sleep(Duration::from_millis(200)).await;
    assert!(
        !later_reader.is_finished(),
        "[{rule}] a reader beside the writer"
    );
    writing.release().await.expect("release");
    let (late, _) = timeout(PROMPT, later_reader)
        .await
        .expect("the later reader is served after the writer")
        .expect("task");
    late.release().await.expect("release");
    let after = write(&on_other, PROMPT).await;
    assert!(after.fencing_token() > token, "[{rule}] tokens rise after");
    after.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// A writer queued behind an upgradeable reader is not starved by the upgradeable
/// readers that come after it: their tries fail, they queue behind it, and the writer
/// is served by a push when the holder leaves, before any of them.
pub async fn rwlock_writer_not_starved_by_upgradeable(factory: &dyn Factory) {
    const LATER: usize = 3;
    let rule = "rwlock_writer_not_starved_by_upgradeable";
    let Some((name, first, on_first)) =
        upgradeable_rule(factory, rule, LockOptions::default()).await
    else {
        return;
    };
    let on_writer = push_only_rwlock(factory, &name, rule).await;
    let on_later = push_only_rwlock(factory, &name, rule).await;

    let holding = upgradeable(&on_first, PROMPT).await;
    let waiting_writer = timed(async move { write(&on_writer, Duration::from_secs(30)).await });
    waiters_reach(&*first, &name, 1).await;
    assert!(
        on_later
            .try_upgradeable_read()
            .await
            .expect("try")
            .is_none(),
        "[{rule}] an upgradeable reader's try overtook a waiting writer"
    );
    assert!(
        on_later.try_read().await.expect("try").is_none(),
        "[{rule}] a reader's try overtook a waiting writer"
    );
    let mut stream = Vec::new();
    for n in 0..LATER {
        let on_later = on_later.clone();
        stream.push(timed(async move {
            upgradeable(&on_later, Duration::from_secs(30)).await
        }));
        waiters_reach(&*first, &name, n + 2).await;
    }
    let released = Instant::now();
    holding.release().await.expect("release");
    let writing = served(
        waiting_writer,
        PROMPT,
        released,
        "the writer is served by a push",
    )
    .await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        stream.iter().all(|t| !t.is_finished()),
        "[{rule}] an upgradeable reader beside the writer"
    );
    let freed = Instant::now();
    writing.release().await.expect("release");
    // Then one upgradeable reader after another.
    for task in stream {
        let guard = served(
            task,
            PROMPT * 2,
            freed,
            "each upgradeable reader is served in turn",
        )
        .await;
        guard.release().await.expect("release");
    }
    eventually_empty(factory, &[name], rule).await;
}

/// Upgrades and upgradeable acquires dropped at random points under contention (readers
/// holding beside them, writers queued) release the upgradeable reader cleanly: the
/// others go on, and nothing is left behind. An upgradeable reader or a writer queued
/// before an upgrade that gives up after it lets no reader queued behind it in beside
/// the writer.
pub async fn rwlock_upgrade_cancellation_leaves_nothing(factory: &dyn Factory) {
    const ROUNDS: usize = 12;
    let rule = "rwlock_upgrade_cancellation_leaves_nothing";
    let Some((name, _holder, on_holder)) =
        upgradeable_rule(factory, rule, LockOptions::default()).await
    else {
        return;
    };
    let client = factory.client(LockOptions::default()).await;
    let lock = rwlock(&client, name.as_str(), rule).expect("capable");

    // A waiting upgrade, cut off: the guard goes with it, the reader beside it goes on,
    // and a writer queued behind is served once the reader leaves.
    let reading = read(&on_holder, PROMPT).await;
    let upgrading = upgradeable(&lock, PROMPT).await;
    let cut = timeout(Duration::from_millis(300), upgrading.upgrade()).await;
    assert!(cut.is_err(), "[{rule}] the upgrade waits for the reader");
    assert!(reading.is_held(), "the reader goes on");
    let on_writer = on_holder.clone();
    let writer = tokio::spawn(async move { write(&on_writer, Duration::from_secs(30)).await });
    sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "[{rule}] a writer beside the reader");
    reading.release().await.expect("release");
    let writing = timeout(PROMPT, writer)
        .await
        .expect("the writer is served once the reader left")
        .expect("writer task");
    writing.release().await.expect("release");

    // An upgradeable reader, then a writer, queued before an upgrade with a reader
    // behind each: the upgrade ends at once (neither holds), and when the one queued
    // gives up, the reader behind it still waits for the writer the upgrade made.
    for first in [true, false] {
        let upgrading = upgradeable(&lock, PROMPT).await;
        let on_first = on_holder.clone();
        let queued = tokio::spawn(async move {
            let forever = AcquireOptions::forever();
            if first {
                drop(on_first.upgradeable_read_with(&forever).await);
            } else {
                drop(on_first.write_with(&forever).await);
            }
        });
        waiters_reach(&*client, &name, 1).await;
        let on_reader = on_holder.clone();
        let reader = timed(async move { read(&on_reader, Duration::from_secs(30)).await });
        waiters_reach(&*client, &name, 2).await;
        let writing = timeout(PROMPT, upgrading.upgrade())
            .await
            .expect("nobody beside it: upgraded at once")
            .expect("upgrade");
        queued.abort();
        let _ = queued.await;
        sleep(Duration::from_millis(300)).await;
        assert!(
            !reader.is_finished(),
            "[{rule}] a reader beside the upgraded writer once the one before it gave up"
        );
        writing.release().await.expect("release");
        let (late, _) = timeout(PROMPT, reader)
            .await
            .expect("the reader is served after the writer")
            .expect("task");
        late.release().await.expect("release");
    }

    let mut contenders = Vec::new();
    let reading = read(&on_holder, PROMPT).await;
    let mut held = Some(reading);
    for round in 0..ROUNDS {
        let lock = lock.clone();
        let cut_after = Duration::from_micros(rand::rng().random_range(0..40_000));
        contenders.push(tokio::spawn(async move {
            let forever = AcquireOptions::forever();
            match round % 3 {
                0 => drop(timeout(cut_after, lock.upgradeable_read_with(&forever)).await),
                1 => {
                    // Granted or not, then an upgrade cut at a random point.
                    let taken = timeout(cut_after, lock.upgradeable_read_with(&forever)).await;
                    if let Ok(Ok(Some(guard))) = taken {
                        drop(timeout(cut_after, guard.upgrade()).await);
                    }
                }
                _ => drop(timeout(cut_after, lock.write_with(&forever)).await),
            }
        }));
        if round == ROUNDS / 2 {
            if let Some(reading) = held.take() {
                reading.release().await.expect("release");
            }
        }
        let pause = Duration::from_millis(rand::rng().random_range(0..10));
        sleep(pause).await;
    }
    for task in contenders {
        task.await.expect("contender task");
    }
    eventually_empty(factory, std::slice::from_ref(&name), rule).await;
    let fresh = factory.client(LockOptions::default()).await;
    let lock = rwlock(&fresh, name.as_str(), rule).expect("capable");
    let writing = lock
        .try_write()
        .await
        .expect("try")
        .expect("the lock is free right after the cancellations");
    writing.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}
