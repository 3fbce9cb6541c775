//! Fault scenarios on the dual lock, with faults on either side: the victim holder's old
//! side partitioned, the new side restarted without data under a running fleet, the holder
//! paused past the TTL, and an acquire dropped at each of its await points. The fenced
//! resource checks every run: no overlapping accepted sections, no token going back.
//!
//! The first three are the chaos framework's scenarios ([`lab::chaos`]) on a
//! [`DualFactory`] whose faults hit one side (or both); a dual holds through a fault on
//! one side, so every run must be safe, more than the faulted backend promises alone.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use conformance::rules::{eventually_empty, unique_name};
use conformance::{lock_patiently, with_ttl, Factory};
use harness::proxy::ProxyMode;
use lab::chaos::{self, ChaosTarget, Expect, Plan, ScenarioReport};
use lab::dual::{DualFactory, SideFactory, Sides};
use lock_core::migration::Side;
use lock_core::{DistributedLock, DistributedLockExt, LockOptions, LostReason};
use lock_zookeeper::lock_dir;
use tokio::time::{sleep, timeout, Instant};

/// Generous bound for "promptly", as the conformance rules use it.
const PROMPT: Duration = Duration::from_secs(3);

use testkit::dual::{etcd_redis, zk_redis, zk_redlock};
use testkit::zookeeper::{queue, BASE};

/// Runs `scenario` on `target` (the short plan of `make test`) and asserts it was safe.
async fn run_safe(scenario: &str, target: &dyn ChaosTarget) -> ScenarioReport {
    let plan = Plan::short(target.short_ttl());
    let report = chaos::run(scenario, target, plan)
        .await
        .unwrap_or_else(|| panic!("{scenario} applies to {}", target.label()));
    eprintln!("[dual] {report}");
    report.assert_meets(Expect::Safe);
    report
}

/// Asserts that the victim of `report` was told it lost the lock (with a reason that
/// `side_ok` accepts), that another dual client took over and that the fence refused the
/// victim's late write.
fn assert_victim_lost_and_refused(report: &ScenarioReport, side_ok: fn(LostReason) -> bool) {
    let reason = report
        .victim_lost
        .unwrap_or_else(|| panic!("the victim's guard is not Lost: {report}"));
    assert!(
        side_ok(reason),
        "the victim lost its lock by {reason:?}: {report}"
    );
    assert!(
        report.takeover.is_some(),
        "no other holder took over: {report}"
    );
    assert_eq!(
        report.victim_write_accepted,
        Some(false),
        "the fence accepted the victim's late write: {report}"
    );
}

/// Runs `scenario` with its faults on `sides` of `dual` (skipped when `dual` could not
/// start) and asserts that the victim lost the lock by a reason `side_ok` accepts and
/// that the fence refused it ([`assert_victim_lost_and_refused`]).
async fn victim_lost_and_refused<O: SideFactory, N: SideFactory>(
    dual: Option<DualFactory<O, N>>,
    sides: Sides,
    scenario: &str,
    side_ok: fn(LostReason) -> bool,
) {
    let Some(dual) = dual else {
        return;
    };
    let report = run_safe(scenario, &dual.faults(sides)).await;
    assert_victim_lost_and_refused(&report, side_ok);
}

/// The holder's link to the old side (ZooKeeper) is cut for 2 x TTL: its guard turns
/// Lost on the old side, another dual client takes over after the old side's session
/// ends, and the fence refuses the old holder's late write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_side_partitioned() {
    victim_lost_and_refused(
        zk_redis().await,
        Sides::Old,
        "holder_partitioned",
        lost_on_old_side,
    )
    .await;
}

/// The same on etcd -> Redis: the holder's etcd lease ends while it is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_side_partitioned_etcd() {
    victim_lost_and_refused(
        etcd_redis().await,
        Sides::Old,
        "holder_partitioned",
        lost_on_old_side,
    )
    .await;
}

/// The new side (a single Redis) is killed and restarted without data while a dual fleet
/// contends: the old side still excludes, the victim's guard turns Lost on the new side,
/// and no token goes back although the new side's counter is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_side_restarted_without_data() {
    victim_lost_and_refused(
        zk_redis().await,
        Sides::New,
        "server_restart_without_data",
        lost_on_new_side,
    )
    .await;
}

/// Restarts the servers the faults of `dual` hit, without their data.
async fn restart_wiped(dual: &dyn ChaosTarget) {
    for server in dual.servers() {
        server
            .restart_wiped()
            .await
            .expect("new side restarts empty");
    }
}

/// A dual hold after the new side lost its counter takes the old hold's token (the czxid
/// of its ZooKeeper node), never a clock seed, and so stays above every earlier token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_after_new_side_wipe_is_the_old_token() {
    let Some(dual) = zk_redis().await.map(|dual| dual.faults(Sides::New)) else {
        return;
    };
    let name = unique_name("dual-wipe");
    let client = dual.client(with_ttl(dual.short_ttl())).await;
    let mut last = None;
    for round in 0..3 {
        let guard = lock_patiently(&*client, &name, Duration::from_secs(30)).await;
        let token = guard.fencing_token();
        let nodes = queue(dual.old().admin(), &name).await;
        let path = format!("{}/{}", lock_dir(BASE, &name), nodes[0]);
        let (_, stat) = dual.old().admin().get_data(&path).await.expect("node");
        let czxid = u64::try_from(stat.czxid).expect("czxid");
        if round > 0 {
            // The counter is gone: the token is the old side's.
            assert_eq!(token.get(), czxid, "round {round}: token is not the czxid");
        }
        assert!(
            token.get() >= czxid,
            "round {round}: token below the old token"
        );
        assert!(Some(token) > last, "round {round}: {token} after {last:?}");
        last = Some(token);
        guard.release().await.expect("release");
        restart_wiped(&dual).await;
    }
}

/// The limit docs/migration.md states: while dual and new-only processes coexist, a new
/// side that loses its data loses the counter, and the next dual hold takes the old
/// token, below the clock-seeded token a new-only holder had before. Exclusion and the
/// fence stay sound (a fenced resource refuses the lower token), but tokens go back:
/// this test shows it, so that the runbook's advice (persistence on Redis for the whole
/// migration) rests on a measured fact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_side_wipe_after_a_new_only_grant_takes_tokens_back() {
    let Some(dual) = zk_redis().await.map(|dual| dual.faults(Sides::New)) else {
        return;
    };
    let name = unique_name("dual-wipe-new-only");
    let new_only = dual.new_side().client(with_ttl(dual.short_ttl())).await;
    let guard = lock_patiently(&*new_only, &name, Duration::from_secs(30)).await;
    let new_only_token = guard.fencing_token();
    guard.release().await.expect("release");
    restart_wiped(&dual).await;
    let client = dual.client(with_ttl(dual.short_ttl())).await;
    let guard = lock_patiently(&*client, &name, Duration::from_secs(30)).await;
    assert!(
        guard.fencing_token() < new_only_token,
        "dual token {} after new-only {new_only_token}: the limit is gone, update \
         docs/migration.md",
        guard.fencing_token()
    );
    guard.release().await.expect("release");
}

/// The holder stops for 2 x TTL mid-section on both sides (as a SIGSTOPped process: no
/// renewal reaches either side), then writes without looking: others take over only
/// after both sides let go, and the fence refuses the late write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_paused_beyond_ttl() {
    victim_lost_and_refused(
        zk_redis().await,
        Sides::Both,
        "holder_paused_beyond_ttl",
        |_| true,
    )
    .await;
}

/// A dual hold lost on its new side (its key removed behind its back) lets go of its old
/// side promptly, while its guard is still alive: ZooKeeper keeps a node as long as the
/// session lives, so a kept old side would block every other dual client until the guard
/// is released or dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_side_lost_frees_the_old_side() {
    let Some(old) = testkit::zookeeper::ZkFactory::start().await else {
        return;
    };
    let dual = DualFactory::new(old, conformance::memory::MemoryFactory::new());
    let ttl = dual.short_ttl();
    let name = unique_name("dual-lost-side");
    let holder = dual.client(with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    dual.new_side().steal(&name).await;
    let reason = timeout(ttl + PROMPT, guard.lost())
        .await
        .expect("the loss of the new side is noticed within the renewal interval");
    assert!(lost_on_new_side(reason), "lost by {reason:?}");
    let deadline = Instant::now() + PROMPT;
    loop {
        let left = dual.old().leftovers(std::slice::from_ref(&name)).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old side is still held {PROMPT:?} after the hold was lost on the new side \
             (guard {:?}): {left:?}",
            guard.state()
        );
        sleep(Duration::from_millis(50)).await;
    }
    drop(guard);
}

/// A dual hold lost on one side stops vouching before its other side can be taken: with
/// the new side's key removed behind the holder's back, the old side is all that keeps
/// another dual client out, so it must stay held until the holder's guard is Lost (or past
/// its validity). The holder's link to the old side is slowed (a twentieth of the TTL
/// each way) to make the window between the old side being freed and the guard turning
/// Lost wide enough to see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_hold_stops_vouching_before_its_other_side_is_freed() {
    let Some(dual) = zk_redis().await else {
        return;
    };
    let dual = dual.faults(Sides::Old);
    let ttl = dual.short_ttl();
    let name = unique_name("dual-free-order");
    let (holder, link) = dual.linked_client(with_ttl(ttl)).await;
    let guard = holder.lock(name.as_str()).await.expect("acquire");
    let contender = dual.client(with_ttl(ttl)).await;
    let watch = guard.watch();
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            let granted = contender
                .lock_timeout(name.as_str(), Duration::from_secs(30))
                .await;
            // Whether the holder's guard still vouched when the contender got in.
            let vouching = !watch.state().is_lost() && Instant::now() < watch.valid_until();
            (granted, vouching, watch.state())
        }
    });
    link.set_mode(ProxyMode::Delay {
        base: ttl / 20,
        jitter: Duration::ZERO,
    });
    dual.new_side().steal(&name).await;
    let (granted, vouching, state) = timeout(Duration::from_secs(40), waiting)
        .await
        .expect("the contender's acquire is bounded")
        .expect("the contender's task");
    let other = granted.expect("the contender gets the lock once the holder lost it");
    assert!(
        !vouching,
        "another dual client got the lock while the holder's guard still vouched for it \
         ({state:?}): the holder freed its old side before it stopped vouching"
    );
    link.heal();
    other.release().await.expect("release");
    drop(guard);
}

/// Polls `future` until it is ready or has been polled `polls` times, then drops it.
async fn poll_then_drop<F: Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut left = polls;
    poll_fn(move |cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => {
            left -= 1;
            if left == 0 {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

/// Who holds the name while the dual acquire runs.
#[derive(Debug, Clone, Copy)]
enum Blocker {
    /// Nobody: the acquire completes.
    Free,
    /// An old-only client: the dual acquire waits on the old side.
    OldOnly,
    /// A new-only client: the dual acquire wins the old side, then waits on the new one.
    NewOnly,
}

/// Most polls of an acquire behind a blocker (it waits there; later polls repeat the wait).
const BLOCKED_POLLS: usize = 16;
/// Bound on the polls of an acquire of a free lock.
const FREE_POLLS: usize = 200;

/// A dual acquire dropped after 1, 2, 3, … polls, until it completes (free lock) or waits
/// (behind an old-only or a new-only holder): after each drop, and the blocker's release,
/// nothing is left on either side.
async fn cancel_at_every_await_point<O: SideFactory, N: SideFactory>(
    dual: DualFactory<O, N>,
    blocker: Blocker,
) {
    let mut options = LockOptions::default();
    // Waiting polls come every recheck too, so the blocked rounds stay short.
    options.recheck = Duration::from_millis(25);
    let client = dual.client(options.clone()).await;
    let blocking: Option<std::sync::Arc<dyn DistributedLock>> = match blocker {
        Blocker::Free => None,
        Blocker::OldOnly => Some(dual.old().client(options.clone()).await),
        Blocker::NewOnly => Some(dual.new_side().client(options.clone()).await),
    };
    let name = unique_name("dual-cancel");
    let limit = match blocker {
        Blocker::Free => FREE_POLLS,
        _ => BLOCKED_POLLS,
    };
    for polls in 1..=limit {
        let held = match &blocking {
            Some(blocking) => Some(blocking.lock(name.as_str()).await.expect("block")),
            None => None,
        };
        let acquired = timeout(
            Duration::from_secs(30),
            poll_then_drop(client.lock(name.as_str()), polls),
        )
        .await
        .unwrap_or_else(|_| panic!("{blocker:?}: {polls} polls took over 30 s"));
        let done = match acquired {
            Some(guard) => {
                assert!(held.is_none(), "{blocker:?}: acquired a held lock");
                guard
                    .expect("dual acquire")
                    .release()
                    .await
                    .expect("release");
                true
            }
            None => false,
        };
        if let Some(held) = held {
            held.release().await.expect("blocker release");
        }
        let what = format!("dual acquire dropped after {polls} polls ({blocker:?})");
        eventually_empty(&dual, std::slice::from_ref(&name), &what).await;
        if done {
            eprintln!("[dual] {blocker:?}: the acquire completed at poll {polls}");
            return;
        }
    }
    assert!(
        !matches!(blocker, Blocker::Free),
        "an acquire of a free lock did not complete in {FREE_POLLS} polls"
    );
}

/// [`cancel_at_every_await_point`] with each blocker in turn, each on a deployment that
/// `start` makes afresh (skipped when it could not start).
async fn cancel_with_every_blocker<O, N, F>(start: impl Fn() -> F)
where
    O: SideFactory,
    N: SideFactory,
    F: Future<Output = Option<DualFactory<O, N>>>,
{
    for blocker in [Blocker::Free, Blocker::OldOnly, Blocker::NewOnly] {
        let Some(dual) = start().await else {
            return;
        };
        cancel_at_every_await_point(dual, blocker).await;
    }
}

/// Cancellation of a dual acquire on ZooKeeper -> Redis at every await point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_every_await_point() {
    cancel_with_every_blocker(zk_redis).await;
}

/// The same on ZooKeeper -> RedLock (3 nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_every_await_point_redlock() {
    cancel_with_every_blocker(zk_redlock).await;
}

/// The same on etcd -> Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_every_await_point_etcd() {
    cancel_with_every_blocker(etcd_redis).await;
}

/// A loss reported on the old side.
fn lost_on_old_side(reason: LostReason) -> bool {
    matches!(
        reason,
        LostReason::OnSide {
            side: Side::Old,
            ..
        }
    )
}

/// A loss reported on the new side.
fn lost_on_new_side(reason: LostReason) -> bool {
    matches!(
        reason,
        LostReason::OnSide {
            side: Side::New,
            ..
        }
    )
}
