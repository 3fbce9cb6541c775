//! Semaphores: never more holders than permits, the limit reached under load, FIFO with
//! push wake-up, disagreements refused, a cut-off holder Lost before its permit is
//! given to another.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{
    AcquireOptions, DistributedLock, ErrorKind, LockName, LockOptions, Permit, Semaphore,
};
use rand::Rng;
use tokio::time::{sleep, timeout, Instant};

use super::{
    cut_off_then_replaced, eventually_empty, offered, push_only_options, unique_name,
    waiters_reach, PROMPT,
};
use crate::factory::Factory;
use crate::limits::HoldLog;
use crate::with_ttl;

/// The semaphore `name` of `permits` on `client`, or `None` (said loudly) when the
/// backend has none.
pub(super) fn semaphore(
    client: &Arc<dyn DistributedLock>,
    name: &str,
    permits: u32,
    rule: &str,
) -> Option<Semaphore> {
    offered(Semaphore::new(Arc::clone(client), name, permits), rule)
}

/// Takes a permit, waiting at most `limit`.
async fn permit(semaphore: &Semaphore, limit: Duration) -> Permit {
    semaphore
        .acquire_with(&AcquireOptions::timeout(limit))
        .await
        .expect("a permit within the limit")
        .expect("a waiting acquire ends holding")
}

/// Six contenders on a semaphore of 3 take permits 4 times each: never more than 3 hold
/// at once and every permit has a fencing token of its own; then 3 clients hold a permit
/// each at the same time while a fourth's try gets none.
pub async fn semaphore_never_exceeds_permits(factory: &dyn Factory) {
    const PERMITS: u32 = 3;
    const CONTENDERS: usize = 6;
    const ROUNDS: usize = 4;
    let rule = "semaphore_never_exceeds_permits";
    let name = unique_name(rule);
    let log = HoldLog::new();
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let client = factory.client(LockOptions::default()).await;
        let Some(semaphore) = semaphore(&client, name.as_str(), PERMITS, rule) else {
            return;
        };
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..ROUNDS {
                let permit = permit(&semaphore, Duration::from_secs(60)).await;
                log.inside(&permit, false, sleep(Duration::from_millis(60)))
                    .await;
                tokens.push(permit.fencing_token());
                permit.release().await.expect("release");
            }
            drop(client);
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for result in join_all(tasks).await {
        tokens.extend(result.expect("contender task"));
    }
    let report = log.check();
    assert_eq!(
        report.unvouched, 0,
        "every permit vouched while inside: {report:?}"
    );
    assert!(
        report.most_at_once <= PERMITS as usize,
        "more holders than permits: {report:?}"
    );
    assert!(
        report.most_at_once >= 2,
        "permits were never shared: {report:?}"
    );
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        CONTENDERS * ROUNDS,
        "a fencing token per permit"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// With every permit taken, waiters are served in arrival order, each by a push (their
/// recheck is 20 s) as soon as a permit is given back; a try meanwhile gets nothing.
pub async fn semaphore_fifo_with_push(factory: &dyn Factory) {
    const PERMITS: u32 = 2;
    const WAITERS: usize = 3;
    let rule = "semaphore_fifo_with_push";
    let name = unique_name(rule);
    let holder = factory.client(LockOptions::default()).await;
    let Some(held) = semaphore(&holder, name.as_str(), PERMITS, rule) else {
        return;
    };
    if !holder.capabilities().fair {
        eprintln!("[{rule}] {} does not claim fairness", factory.label());
        return;
    }
    let mut permits = Vec::new();
    for _ in 0..PERMITS {
        permits.push(permit(&held, PROMPT).await);
    }
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let (finish, finished) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = factory.client(push_only_options()).await;
        let semaphore = semaphore(&client, name.as_str(), PERMITS, rule).expect("capable");
        let granted_tx = granted_tx.clone();
        let mut finished = finished.clone();
        tasks.push(tokio::spawn(async move {
            let permit = permit(&semaphore, Duration::from_secs(30)).await;
            let _ = granted_tx.send(i);
            // Held until the test ends, so that only released permits serve the next.
            let _ = timeout(Duration::from_secs(30), finished.wait_for(|done| *done)).await;
            permit.release().await.expect("release");
        }));
        waiters_reach(&*holder, &name, i + 1).await;
    }
    assert!(
        held.acquire_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a try gets no permit while all are taken"
    );
    for expected in 0..WAITERS.min(PERMITS as usize) {
        let released = Instant::now();
        permits
            .pop()
            .expect("a permit")
            .release()
            .await
            .expect("release");
        let served = timeout(PROMPT, granted.recv())
            .await
            .expect("a waiter is served by a push")
            .expect("waiters alive");
        assert_eq!(served, expected, "grant order");
        assert!(released.elapsed() < PROMPT);
    }
    sleep(Duration::from_millis(200)).await;
    assert!(
        granted.try_recv().is_err(),
        "no waiter is served without a permit"
    );
    finish.send_replace(true);
    for task in tasks {
        timeout(Duration::from_secs(30), task)
            .await
            .expect("every waiter is served in the end")
            .expect("waiter task");
    }
    eventually_empty(factory, &[name], rule).await;
}

/// An acquire that disagrees on the number of permits with the holders of the name fails
/// with a conflict, once or waiting, and leaves nothing behind.
pub async fn semaphore_permits_disagreement_refused(factory: &dyn Factory) {
    let rule = "semaphore_permits_disagreement_refused";
    let name = unique_name(rule);
    let a = factory.client(LockOptions::default()).await;
    let b = factory.client(LockOptions::default()).await;
    let Some(of_three) = semaphore(&a, name.as_str(), 3, rule) else {
        return;
    };
    let of_four = semaphore(&b, name.as_str(), 4, rule).expect("capable");
    let held = permit(&of_three, PROMPT).await;
    for options in [AcquireOptions::try_once(), AcquireOptions::timeout(PROMPT)] {
        let err = of_four
            .acquire_with(&options)
            .await
            .expect_err("a disagreement on permits is refused");
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert!(!err.is_retryable());
    }
    let inspected = of_three.occupancy().await.expect("inspect");
    assert_eq!(
        inspected.holders().count(),
        1,
        "only the agreeing holder: {inspected:?}"
    );
    assert!(
        inspected.waiters.is_empty(),
        "no waiter left: {inspected:?}"
    );
    held.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// A permit holder cut off from the server turns Lost before another acquirer is given
/// its permit, which happens within the TTL.
pub async fn semaphore_cut_off_holder_is_replaced(factory: &dyn Factory) {
    let rule = "semaphore_cut_off_holder_is_replaced";
    if !super::leased(factory, rule).await {
        return;
    }
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let (a, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let b = factory.client(with_ttl(ttl)).await;
    let Some(on_a) = semaphore(&a, name.as_str(), 1, rule) else {
        return;
    };
    let on_b = semaphore(&b, name.as_str(), 1, rule).expect("capable");
    let first = permit(&on_a, PROMPT).await;
    let next = permit(&on_b, ttl * 4 + PROMPT);
    let second = cut_off_then_replaced(first.watch(), &*crash, ttl, next).await;
    second.release().await.expect("release");
    drop(first);
}

/// A fresh name for `rule`, a client and the semaphore of `permits` there, where the
/// backend takes several permits in one hold; `None` where it has no semaphores, or
/// refuses several permits in one hold (checked: with [`ErrorKind::Unsupported`],
/// leaving nothing), and the rule does not apply.
async fn many_permits(
    factory: &dyn Factory,
    permits: u32,
    rule: &str,
) -> Option<(LockName, Arc<dyn DistributedLock>, Semaphore)> {
    let name = unique_name(rule);
    let client = factory.client(LockOptions::default()).await;
    let semaphore = semaphore(&client, name.as_str(), permits, rule)?;
    if client.capabilities().semaphore_many {
        return Some((name, client, semaphore));
    }
    let err = semaphore
        .try_acquire_many(2)
        .await
        .expect_err("several permits in one hold are refused");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "[{rule}] {err}");
    eprintln!("[conformance] {rule}: {err}; the rule checks only the refusal");
    eventually_empty(factory, &[name], rule).await;
    None
}

/// Contenders on clients of their own, one per entry of `counts`, each taking that many
/// permits of the semaphore `name` of `permits` `rounds` times (each wait at most 60 s),
/// holding them `hold` inside `log`. Returns every hold's fencing token.
async fn contend(
    factory: &dyn Factory,
    (name, permits): (&LockName, u32),
    counts: &[u32],
    rounds: usize,
    hold: Duration,
    log: &HoldLog,
) -> Vec<lock_core::FencingToken> {
    let mut tasks = Vec::new();
    for &n in counts {
        let client = factory.client(LockOptions::default()).await;
        let semaphore =
            Semaphore::new(Arc::clone(&client), name.as_str(), permits).expect("a semaphore");
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..rounds {
                let permit = permits_within(&semaphore, n, Duration::from_secs(60)).await;
                log.inside_many(&permit, n, sleep(hold)).await;
                tokens.push(permit.fencing_token());
                permit.release().await.expect("release");
            }
            drop(client);
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for result in join_all(tasks).await {
        tokens.extend(result.expect("contender task"));
    }
    tokens
}

/// Takes `n` permits, waiting at most `limit`.
async fn permits_within(semaphore: &Semaphore, n: u32, limit: Duration) -> Permit {
    semaphore
        .acquire_many_timeout(n, limit)
        .await
        .unwrap_or_else(|err| panic!("{n} permits within {limit:?}: {err}"))
}

/// Five contenders asking for 1, 2 or 3 permits of a semaphore of 4, four times each:
/// never more than 4 permits held at once (a hold of n counts n), each hold with a
/// fencing token of its own.
pub async fn semaphore_many_never_over_grants(factory: &dyn Factory) {
    const PERMITS: u32 = 4;
    const COUNTS: [u32; 5] = [1, 2, 3, 1, 2];
    const ROUNDS: usize = 4;
    let rule = "semaphore_many_never_over_grants";
    let Some((name, _client, _semaphore)) = many_permits(factory, PERMITS, rule).await else {
        return;
    };
    let log = HoldLog::new();
    let hold = Duration::from_millis(50);
    let mut tokens = contend(factory, (&name, PERMITS), &COUNTS, ROUNDS, hold, &log).await;
    let report = log.check();
    assert_eq!(report.unvouched, 0, "every hold vouched: {report:?}");
    assert!(
        report.most_at_once <= PERMITS as usize,
        "more permits held than the semaphore has: {report:?}"
    );
    assert!(
        report.most_at_once >= 3,
        "holds of several permits never shared the semaphore: {report:?}"
    );
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        COUNTS.len() * ROUNDS,
        "a fencing token per hold"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// A request for 3 permits at the head of the queue of a semaphore of 3 (2 held) holds
/// back a later request for 1 that would fit: that one is served only after it, and a try
/// gets nothing meanwhile; each is served by a push.
pub async fn semaphore_many_fifo_big_head(factory: &dyn Factory) {
    let rule = "semaphore_many_fifo_big_head";
    let Some((name, holder, held)) = many_permits(factory, 3, rule).await else {
        return;
    };
    if !holder.capabilities().fair {
        eprintln!("[{rule}] {} does not claim fairness", factory.label());
        return;
    }
    let two = permits_within(&held, 2, PROMPT).await;
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, n) in [3u32, 1].into_iter().enumerate() {
        let client = factory.client(push_only_options()).await;
        let semaphore = semaphore(&client, name.as_str(), 3, rule).expect("capable");
        let granted_tx = granted_tx.clone();
        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
        tasks.push((
            tokio::spawn(async move {
                let permit = permits_within(&semaphore, n, Duration::from_secs(30)).await;
                let _ = granted_tx.send(n);
                let _ = timeout(Duration::from_secs(30), done).await;
                permit.release().await.expect("release");
                drop(client);
            }),
            done_tx,
        ));
        waiters_reach(&*holder, &name, i + 1).await;
    }
    assert!(
        held.try_acquire().await.expect("try").is_none(),
        "a try overtakes no waiter, though a permit is free"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        granted.try_recv().is_err(),
        "the request for 1 is not served before the request for 3 ahead of it"
    );
    let released = Instant::now();
    two.release().await.expect("release");
    let first = timeout(PROMPT, granted.recv())
        .await
        .expect("the head is served by a push")
        .expect("waiters alive");
    assert_eq!(first, 3, "the request at the head goes first");
    assert!(released.elapsed() < PROMPT);
    sleep(Duration::from_millis(200)).await;
    assert!(
        granted.try_recv().is_err(),
        "nothing is granted beside 3 permits of 3"
    );
    let mut tasks = tasks.into_iter();
    let (big, big_done) = tasks.next().expect("the big request");
    let released = Instant::now();
    let _ = big_done.send(());
    let second = timeout(PROMPT, granted.recv())
        .await
        .expect("the next is served by a push")
        .expect("waiters alive");
    assert_eq!(second, 1);
    assert!(released.elapsed() < PROMPT);
    big.await.expect("big task");
    for (task, done) in tasks {
        let _ = done.send(());
        timeout(Duration::from_secs(30), task)
            .await
            .expect("served in the end")
            .expect("waiter task");
    }
    eventually_empty(factory, &[name], rule).await;
}

/// Callers asking for 2 and 2, 3 and 1 permits of a semaphore of 3 (together more than
/// it has), six times each, all finish within a bound: nobody deadlocks, and never more
/// than 3 permits are held.
pub async fn semaphore_many_no_deadlock(factory: &dyn Factory) {
    const PERMITS: u32 = 3;
    const ROUNDS: usize = 6;
    let rule = "semaphore_many_no_deadlock";
    let Some((name, _client, _semaphore)) = many_permits(factory, PERMITS, rule).await else {
        return;
    };
    let log = HoldLog::new();
    let hold = Duration::from_millis(20);
    let callers = contend(factory, (&name, PERMITS), &[2, 2, 3, 1], ROUNDS, hold, &log);
    timeout(Duration::from_secs(90), callers)
        .await
        .expect("callers asking for n and m permits never deadlock");
    let report = log.check();
    assert!(
        report.most_at_once <= PERMITS as usize,
        "more permits held than the semaphore has: {report:?}"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// With 2 of 3 permits held: a try for 2 gets none and a try for 1 gets one; a wait for 2
/// times out, leaving no waiter; 0 or 4 permits are refused with `InvalidConfig` before any
/// request (a closed client says so too); once all are free, a try takes all 3.
pub async fn semaphore_many_try_and_timeout(factory: &dyn Factory) {
    let rule = "semaphore_many_try_and_timeout";
    let Some((name, _holder, held)) = many_permits(factory, 3, rule).await else {
        return;
    };
    let other = factory.client(LockOptions::default()).await;
    let on_other = semaphore(&other, name.as_str(), 3, rule).expect("capable");
    let two = permits_within(&held, 2, PROMPT).await;
    assert!(
        on_other.try_acquire_many(2).await.expect("try").is_none(),
        "2 permits of 3 with 2 taken"
    );
    let one = on_other
        .try_acquire_many(1)
        .await
        .expect("try")
        .expect("the last permit");
    one.release().await.expect("release");
    let started = Instant::now();
    let err = on_other
        .acquire_many_timeout(2, Duration::from_millis(300))
        .await
        .expect_err("2 permits never come");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(started.elapsed() < PROMPT);
    let deadline = Instant::now() + PROMPT;
    while !held.occupancy().await.expect("inspect").waiters.is_empty() {
        assert!(
            Instant::now() < deadline,
            "a timed-out request stays queued"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let closed = factory.client(LockOptions::default()).await;
    let on_closed = semaphore(&closed, name.as_str(), 3, rule).expect("capable");
    closed.close().await.expect("close");
    for semaphore in [&on_other, &on_closed] {
        for n in [0, 4] {
            let err = semaphore
                .try_acquire_many(n)
                .await
                .expect_err("outside 1 ..= permits");
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{n}: {err}");
        }
    }
    two.release().await.expect("release");
    let all = on_other
        .try_acquire_many(3)
        .await
        .expect("try")
        .expect("all 3 are free again");
    all.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// Requests for 2 or 3 permits dropped at random points, waiting or just granted, leave
/// nothing behind, and all the permits are free again afterwards.
pub async fn semaphore_many_cancellation_leaves_nothing(factory: &dyn Factory) {
    const ROUNDS: u32 = 16;
    let rule = "semaphore_many_cancellation_leaves_nothing";
    let Some((name, _holder, held)) = many_permits(factory, 3, rule).await else {
        return;
    };
    let mut all = Some(permits_within(&held, 3, PROMPT).await);
    let client = factory.client(LockOptions::default()).await;
    let sem = semaphore(&client, name.as_str(), 3, rule).expect("capable");
    let mut contenders = Vec::new();
    for round in 0..ROUNDS {
        let sem = sem.clone();
        let cut_after = Duration::from_micros(rand::rng().random_range(0..30_000));
        let n = 2 + round % 2;
        contenders.push(tokio::spawn(async move {
            drop(timeout(cut_after, sem.acquire_many(n)).await);
        }));
        if round == ROUNDS / 2 {
            if let Some(all) = all.take() {
                all.release().await.expect("release");
            }
        }
        let pause = Duration::from_millis(rand::rng().random_range(0..5));
        sleep(pause).await;
    }
    for task in contenders {
        task.await.expect("contender task");
    }
    eventually_empty(factory, std::slice::from_ref(&name), rule).await;
    let fresh = factory.client(LockOptions::default()).await;
    let sem = semaphore(&fresh, name.as_str(), 3, rule).expect("capable");
    let all = sem
        .try_acquire_many(3)
        .await
        .expect("try")
        .expect("all 3 permits are free again");
    all.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}

/// A semaphore in use resized from 3 to 1 then to 4, while contenders take permits (and
/// switch to the new number when theirs is refused as a conflict): never more permits
/// held than 3 before the shrink returns, 1 after it until the growth starts, 4 after,
/// and no hold lost by a resize; a resize from a number the semaphore no longer has is a
/// conflict. A backend that cannot
/// resize refuses with `Unsupported` and changes nothing.
pub async fn semaphore_resize_never_over_grants(factory: &dyn Factory) {
    const NUMBERS: [u32; 3] = [3, 1, 4];
    const CONTENDERS: usize = 4;
    let rule = "semaphore_resize_never_over_grants";
    let name = unique_name(rule);
    let resizer = factory.client(LockOptions::default()).await;
    let Some(mut resized) = semaphore(&resizer, name.as_str(), NUMBERS[0], rule) else {
        return;
    };
    // Held throughout, so that the semaphore stays in use and keeps its number.
    let pin = permit(&resized, PROMPT).await;
    if !resizer.capabilities().semaphore_resize {
        let err = resized
            .resize(NUMBERS[1], PROMPT)
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        eprintln!("[conformance] {rule}: {err}; the rule checks only the refusal");
        assert_eq!(resized.permits(), NUMBERS[0], "the handle keeps its number");
        let other = factory.client(LockOptions::default()).await;
        let same = semaphore(&other, name.as_str(), NUMBERS[0], rule).expect("capable");
        let second = permit(&same, PROMPT).await;
        second.release().await.expect("release");
        pin.release().await.expect("release");
        eventually_empty(factory, &[name], rule).await;
        return;
    }
    let log = HoldLog::new();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let client = factory.client(LockOptions::default()).await;
        let (log, stop, name) = (log.clone(), Arc::clone(&stop), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut phase = 0;
            let mut held = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let semaphore = Semaphore::new(Arc::clone(&client), name.as_str(), NUMBERS[phase])
                    .expect("capable");
                match semaphore.acquire_timeout(Duration::from_secs(2)).await {
                    Ok(permit) => {
                        log.inside(&permit, false, sleep(Duration::from_millis(30)))
                            .await;
                        permit.release().await.expect("release");
                        held += 1;
                    }
                    Err(err) if err.kind() == ErrorKind::Conflict => {
                        assert!(phase + 1 < NUMBERS.len(), "a conflict past the last: {err}");
                        phase += 1;
                    }
                    Err(err) if err.kind() == ErrorKind::Timeout => {}
                    Err(err) => panic!("a contender's acquire: {err}"),
                }
            }
            drop(client);
            held
        }));
    }
    let mut changes = Vec::new();
    let pinned = log.inside(&pin, false, async {
        for &to in &NUMBERS[1..] {
            sleep(Duration::from_millis(400)).await;
            let issued = Instant::now();
            resized
                .resize(to, Duration::from_secs(10))
                .await
                .unwrap_or_else(|err| panic!("resize to {to}: {err}"));
            changes.push((issued, Instant::now()));
            assert_eq!(resized.permits(), to);
        }
        sleep(Duration::from_millis(400)).await;
    });
    pinned.await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut held = 0;
    for task in tasks {
        held += timeout(Duration::from_secs(30), task)
            .await
            .expect("contenders stop")
            .expect("contender task");
    }
    // Before a change is issued the old number holds, after it returns the new one;
    // in between the larger of the two.
    let limit = |at: Instant| {
        let mut limit = NUMBERS[0];
        for (i, (issued, returned)) in changes.iter().enumerate() {
            let (old, new) = (NUMBERS[i], NUMBERS[i + 1]);
            if at >= *returned {
                limit = new;
            } else if at >= *issued {
                limit = old.max(new);
            }
        }
        limit as usize
    };
    let points: Vec<Instant> = changes.iter().map(|(_, returned)| *returned).collect();
    let beyond = log.beyond(limit, &points);
    assert!(
        beyond.is_empty(),
        "more permits held than the semaphore's number at the time: {beyond:?}, changes {changes:?}"
    );
    assert!(held >= CONTENDERS, "contenders were served ({held})");
    let report = log.check();
    assert_eq!(report.unvouched, 0, "a resize lost no hold: {report:?}");
    let stale = factory.client(LockOptions::default()).await;
    let mut stale_handle = semaphore(&stale, name.as_str(), NUMBERS[0], rule).expect("capable");
    let holding = permit(&resized, PROMPT).await;
    let err = stale_handle
        .resize(2, PROMPT)
        .await
        .expect_err("a resize from a number the semaphore no longer has");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    holding.release().await.expect("release");
    pin.release().await.expect("release");
    eventually_empty(factory, &[name], rule).await;
}
