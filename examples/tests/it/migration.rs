//! A live migration from ZooKeeper to Redis with fleets of real processes (`fleet_member`)
//! on one lock name, every hold writing one fenced resource: adjacent phases side by side
//! (with Curator and plain `SET NX` clients among them), a rolling migration forward and
//! back, and the check before each step; the rolling migration also from PostgreSQL to
//! Redis and from ZooKeeper to PostgreSQL.
//!
//! Without ZooKeeper, Redis or (for the Curator member) java the tests print a loud notice
//! and pass, unless `LOCK_TEST_STRICT=1`, where they fail.

use std::time::Duration;

use crate::fleet::{Backend, Fleet, Member, Spec, Summary};
use distlock::migration::Side;
use distlock::migration::{CheckOptions, CheckReport, Step};
use distlock::LockName;

/// Cycles of each distlock member of a mixed fleet.
const CYCLES: u64 = 600;
/// Cycles of each foreign member of a mixed fleet.
const FOREIGN_CYCLES: u64 = 300;
/// Cycles each newly started member of a rolling migration runs before the next restart.
const ROLLING_CYCLES: u64 = 25;

fn spec(kind: &'static str, url: String, cycles: u64) -> Spec {
    Spec {
        kind,
        url,
        cycles,
        hold: Duration::ZERO,
        pause: Duration::ZERO,
    }
}

/// Starts `specs` together, lets them run all their cycles and checks the history.
async fn run_mixed(fleet: &Fleet, specs: &[(&str, Spec)]) -> Vec<Summary> {
    let mut members: Vec<Member> = specs
        .iter()
        .map(|(label, spec)| fleet.spawn(label, spec))
        .collect();
    for member in &mut members {
        member.ready().await;
    }
    fleet.go();
    let mut summaries = Vec::new();
    for member in members {
        let label = member.label.clone();
        let summary = member.finish().await;
        eprintln!("{label}: {summary:?}");
        summaries.push(summary);
    }
    let report = fleet.assert_safe(&summaries);
    eprintln!(
        "{} sections, {} accepted writes",
        report.sections, report.accepted_writes
    );
    summaries
}

/// Old-only clients (distlock on `zk://` and a Curator `InterProcessMutex`) and dual clients
/// on one name exclude each other through ZooKeeper; tokens never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_only_and_dual_with_curator_exclude_each_other() {
    let Some(mut fleet) = Fleet::start("old-dual").await else {
        return;
    };
    if !fleet.with_curator().await {
        return;
    }
    let specs = [
        ("old", spec("distlock", fleet.old(), CYCLES)),
        ("old", spec("distlock", fleet.old(), CYCLES)),
        ("curator", spec("curator", fleet.old(), FOREIGN_CYCLES)),
        ("dual", spec("distlock", fleet.dual(), CYCLES)),
        ("dual", spec("distlock", fleet.dual(), CYCLES)),
    ];
    run_mixed(&fleet, &specs).await;
}

/// Dual clients and new-only clients (distlock on `redis://` and a plain `SET NX PX`
/// client) on one name exclude each other through Redis; tokens never go back.
///
/// The `SET NX` client never wakes queued waiters (they notice its releases at their next
/// recheck), and takes a free key at once: it pauses between its cycles and the waiters
/// recheck often, so that it takes turns with the others instead of running all its cycles
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_and_new_only_with_set_nx_exclude_each_other() {
    let Some(fleet) = Fleet::start_with("dual-new", "?recheck=20ms").await else {
        return;
    };
    let set_nx = Spec {
        pause: Duration::from_millis(5),
        ..spec("set-nx", fleet.new_only(), FOREIGN_CYCLES)
    };
    let specs = [
        ("dual", spec("distlock", fleet.dual(), CYCLES)),
        ("dual", spec("distlock", fleet.dual(), CYCLES)),
        ("new", spec("distlock", fleet.new_only(), CYCLES)),
        ("new", spec("distlock", fleet.new_only(), CYCLES)),
        ("set-nx", set_nx),
    ];
    run_mixed(&fleet, &specs).await;
}

/// Members of a rolling migration run until stopped (this bounds them all the same).
const UNTIL_STOPPED: u64 = 1_000_000;
/// How long the check before a step watches, and how often it looks.
const CHECK: CheckOptions = CheckOptions {
    watch: Duration::from_millis(1500),
    interval: Duration::from_millis(20),
};

/// Restarts every member one by one with `url`: each stops after its current cycle, its
/// successor starts and runs [`ROLLING_CYCLES`] cycles among the others before the next
/// restart.
async fn roll(
    fleet: &Fleet,
    members: &mut [Member],
    label: &str,
    url: &str,
    ended: &mut Vec<Summary>,
) {
    let next = spec("distlock", url.to_owned(), UNTIL_STOPPED);
    roll_kind(fleet, members, label, &next, ended).await;
}

/// [`roll`], each successor started as `next` says.
async fn roll_kind(
    fleet: &Fleet,
    members: &mut [Member],
    label: &str,
    next: &Spec,
    ended: &mut Vec<Summary>,
) {
    for member in members.iter_mut() {
        let mut next = fleet.spawn(label, next);
        next.ready().await;
        let previous = std::mem::replace(member, next);
        ended.push(previous.stop().await);
        member.reach(ROLLING_CYCLES).await;
    }
}

async fn check(fleet: &Fleet, step: Step) -> CheckReport {
    let name = LockName::new(fleet.name.as_str()).expect("name");
    let report = distlock::raw::driver::registry()
        .migration_check(&fleet.dual(), step, &[name], &CHECK)
        .await
        .expect("the check runs");
    let verdict = report.to_string();
    eprintln!(
        "{} ({} unmarked, {} token gaps)",
        verdict.lines().next().unwrap_or_default(),
        report.unmarked.len(),
        report.token_gaps.len()
    );
    assert!(report.failures.is_empty(), "{report}");
    report
}

/// A rolling migration while the resource keeps being written: four old-only processes
/// restart one by one into dual and roll back one by one to old only (no new-only grant
/// yet, so the check before that step is clear); then into dual again, one by one into new
/// only, and back one by one into dual. No overlap, no token going back, every acquire
/// within its bound, every process ends when asked (no deadlock). Before rolling back to
/// old only a second time the check reports that tokens could go back: new-only grants
/// took Redis's clock-seeded tokens, above every ZooKeeper zxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_migration_forward_and_back() {
    let Some(fleet) = Fleet::start("rolling").await else {
        return;
    };
    let mut walk = roll_forward_and_back(&fleet, 4).await;
    assert!(walk.back.unmarked.is_empty(), "{}", walk.back);
    let zxid = current_zxid(&fleet).await;
    let new_tokens = walk.new_only_tokens(&fleet);
    assert!(
        new_tokens.iter().all(|t| *t > zxid),
        "{new_tokens:?} vs zxid {zxid}"
    );
    assert!(!walk.back.token_gaps.is_empty(), "{}", walk.back);
    walk.finish(&fleet).await;
}

/// [`rolling_migration_forward_and_back`] from PostgreSQL (old) to Redis (new), with three
/// processes: a team leaving Postgres locks. Redis's clock-seeded new-only tokens are far
/// above the Postgres counter, so the check before old only reports the token gap.
/// Before it (no new-only grant yet) the check is clear: a dual waiter queued on Redis
/// that is handed the lock by a release (its Postgres token as the Redis token) and whose
/// next attempt runs before it takes that grant finds the key its own and keeps that
/// token (lock-redis's `a_handed_waiter_takes_the_token_it_was_handed`), so dual tokens
/// stay equal to their Postgres tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_migration_from_postgres_to_redis() {
    let start = Fleet::start_between("pg-redis", Backend::Postgres, Backend::Redis, "");
    let Some(fleet) = start.await else {
        return;
    };
    let mut walk = roll_forward_and_back(&fleet, 3).await;
    assert!(walk.back.unmarked.is_empty(), "{}", walk.back);
    assert!(!walk.back.token_gaps.is_empty(), "{}", walk.back);
    walk.finish(&fleet).await;
}

/// [`rolling_migration_forward_and_back`] from ZooKeeper (old) to PostgreSQL (new), with
/// three processes: the new side's counter is raised to each dual hold's ZooKeeper token
/// (`fence_at_least`), so no token goes back on the resource in any phase. Whether the
/// new-only grants left a token gap depends on how far ZooKeeper's zxid moved since, so
/// the check back is asserted on its sightings only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_migration_from_zookeeper_to_postgres() {
    let start = Fleet::start_between("zk-pg", Backend::ZooKeeper, Backend::Postgres, "");
    let Some(fleet) = start.await else {
        return;
    };
    let mut walk = roll_forward_and_back(&fleet, 3).await;
    assert!(walk.back.unmarked.is_empty(), "{}", walk.back);
    walk.finish(&fleet).await;
}

/// A rolling migration under way: the members running, the summaries of those that ended,
/// and the check before the last step back to old only.
struct Walk {
    members: Vec<Member>,
    ended: Vec<Summary>,
    back: CheckReport,
}

impl Walk {
    /// The last tokens of the new-only members.
    fn new_only_tokens(&self, fleet: &Fleet) -> Vec<u64> {
        let new = fleet.new_only();
        self.ended
            .iter()
            .filter(|s| s.url == new)
            .filter_map(|s| s.last_token)
            .collect()
    }

    /// Stops the members still running and checks the whole history.
    async fn finish(&mut self, fleet: &Fleet) {
        for member in self.members.drain(..) {
            self.ended.push(member.stop().await);
        }
        let longest = self.ended.iter().map(|s| s.max_wait_ms).max();
        eprintln!(
            "{} processes, longest acquire {longest:?} ms",
            self.ended.len()
        );
        fleet.assert_safe(&self.ended);
    }
}

/// The walk of [`rolling_migration_forward_and_back`] with `processes` members, up to the
/// check before the second step back to old only (returned, not yet judged).
async fn roll_forward_and_back(fleet: &Fleet, processes: usize) -> Walk {
    let (old, dual, new) = (fleet.old(), fleet.dual(), fleet.new_only());
    let mut members: Vec<Member> = (0..processes)
        .map(|_| fleet.spawn("old", &spec("distlock", old.clone(), UNTIL_STOPPED)))
        .collect();
    for member in &mut members {
        member.ready().await;
    }
    fleet.go();
    let mut ended = Vec::new();
    roll(fleet, &mut members, "dual", &dual, &mut ended).await;
    let report = check(fleet, Step::DualToOld).await;
    assert!(report.is_clear(), "{report}");
    roll(fleet, &mut members, "old", &old, &mut ended).await;
    let report = check(fleet, Step::OldToDual).await;
    assert!(report.is_clear(), "{report}");
    roll(fleet, &mut members, "dual", &dual, &mut ended).await;
    let report = check(fleet, Step::DualToNew).await;
    assert!(report.is_clear(), "{report}");
    roll(fleet, &mut members, "new", &new, &mut ended).await;
    roll(fleet, &mut members, "dual", &dual, &mut ended).await;
    let back = check(fleet, Step::DualToOld).await;
    Walk {
        members,
        ended,
        back,
    }
}

/// A rolling migration of an elected job: four candidate processes (each cycle a term:
/// campaign, a fenced write with the term as token, resign) restart one by one from old
/// only into dual, into new only and back into dual, with the check before each step
/// covering the election's name. Never two leaders (no overlapping sections), no term going
/// back, every campaign within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_migration_of_an_elected_job() {
    let Some(fleet) = Fleet::start("elected").await else {
        return;
    };
    let (old, dual, new) = (fleet.old(), fleet.dual(), fleet.new_only());
    let elect = |url: &str| spec("elect", url.to_owned(), UNTIL_STOPPED);
    let mut members: Vec<Member> = (0..4).map(|_| fleet.spawn("old", &elect(&old))).collect();
    for member in &mut members {
        member.ready().await;
    }
    fleet.go();
    let mut ended = Vec::new();
    assert!(check(&fleet, Step::OldToDual).await.is_clear());
    roll_kind(&fleet, &mut members, "dual", &elect(&dual), &mut ended).await;
    assert!(check(&fleet, Step::DualToNew).await.is_clear());
    roll_kind(&fleet, &mut members, "new", &elect(&new), &mut ended).await;
    assert!(check(&fleet, Step::NewToDual).await.is_clear());
    roll_kind(&fleet, &mut members, "dual", &elect(&dual), &mut ended).await;
    for member in members {
        ended.push(member.stop().await);
    }
    let longest = ended.iter().map(|s| s.max_wait_ms).max();
    eprintln!(
        "{} candidates, longest campaign {longest:?} ms",
        ended.len()
    );
    fleet.assert_safe(&ended);
}

/// A fleet of semaphore holders (one permit) and one of writers roll old -> dual -> new ->
/// dual as the elected job does: no two holders at once on the fenced resource, no token
/// going back, and the check before each step is clear on the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_migration_of_permits_and_writers() {
    for kind in ["permit", "write"] {
        let Some(fleet) = Fleet::start(kind).await else {
            return;
        };
        let (old, dual, new) = (fleet.old(), fleet.dual(), fleet.new_only());
        let member = |url: &str| spec(kind, url.to_owned(), UNTIL_STOPPED);
        let mut members: Vec<Member> = (0..3).map(|_| fleet.spawn("old", &member(&old))).collect();
        for member in &mut members {
            member.ready().await;
        }
        fleet.go();
        let mut ended = Vec::new();
        assert!(check(&fleet, Step::OldToDual).await.is_clear());
        roll_kind(&fleet, &mut members, "dual", &member(&dual), &mut ended).await;
        assert!(check(&fleet, Step::DualToNew).await.is_clear());
        roll_kind(&fleet, &mut members, "new", &member(&new), &mut ended).await;
        assert!(check(&fleet, Step::NewToDual).await.is_clear());
        roll_kind(&fleet, &mut members, "dual", &member(&dual), &mut ended).await;
        for member in members {
            ended.push(member.stop().await);
        }
        fleet.assert_safe(&ended);
    }
}

/// The ZooKeeper server's last zxid.
async fn current_zxid(fleet: &Fleet) -> u64 {
    let srvr = fleet.zk().four_letter("srvr").await.expect("srvr");
    srvr.lines()
        .find_map(|line| line.strip_prefix("Zxid: 0x"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no zxid in {srvr:?}"))
}

/// Before `new only`, the check reports an old-only process (distlock on `zk://`) that
/// takes the lock among dual ones, and reports none once it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_before_new_only_reports_a_running_old_only_process() {
    let Some(fleet) = Fleet::start("check-old").await else {
        return;
    };
    check_reports_until_stopped(&fleet, fleet.old(), Step::DualToNew, Side::Old).await;
}

/// Before `old only`, the check reports a new-only process (distlock on `redis://`) that
/// takes the lock among dual ones, and reports none once it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_before_old_only_reports_a_running_new_only_process() {
    let Some(fleet) = Fleet::start("check-new").await else {
        return;
    };
    check_reports_until_stopped(&fleet, fleet.new_only(), Step::DualToOld, Side::New).await;
}

async fn check_reports_until_stopped(fleet: &Fleet, single: String, step: Step, side: Side) {
    let busy = |url: String| Spec {
        hold: Duration::from_millis(2),
        ..spec("distlock", url, UNTIL_STOPPED)
    };
    let mut dual = fleet.spawn("dual", &busy(fleet.dual()));
    let mut single = fleet.spawn("single", &busy(single));
    dual.ready().await;
    single.ready().await;
    fleet.go();
    single.reach(1).await;
    let running = check(fleet, step).await;
    assert!(
        running.unmarked.iter().any(|seen| seen.side == side),
        "{running}"
    );
    let single = single.stop().await;
    let stopped = check(fleet, step).await;
    assert!(stopped.unmarked.is_empty(), "{stopped}");
    fleet.assert_safe(&[single, dual.stop().await]);
}
/// Old-only and new-only processes on one name do not exclude each other (they are not
/// adjacent phases): the fenced resource sees it, so the checks above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_only_and_new_only_do_not_exclude_each_other() {
    let Some(fleet) = Fleet::start("old-new").await else {
        return;
    };
    let busy = |url: String| Spec {
        hold: Duration::from_millis(2),
        ..spec("distlock", url, 200)
    };
    let mut old = fleet.spawn("old", &busy(fleet.old()));
    let mut new = fleet.spawn("new", &busy(fleet.new_only()));
    old.ready().await;
    new.ready().await;
    fleet.go();
    let (old, new) = tokio::join!(old.end(), new.end());
    let report = fleet.resource.check();
    eprintln!(
        "{old:?}\n{new:?}\n{} overlaps, {} stale begins, {} stale writes",
        report.overlaps.len(),
        report.rejected_begins,
        report.rejected_writes
    );
    assert!(
        !report.is_safe() || report.rejected_begins + report.rejected_writes > 0,
        "{report:?}"
    );
}
