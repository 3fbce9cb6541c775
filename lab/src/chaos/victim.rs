//! Scenarios around one victim holder: it holds the lock and sits in a critical
//! section while a fault strikes its link, its servers or its key; healthy contenders
//! keep going; then the victim writes anyway and the fence decides.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, LockState};
use tokio::time::{sleep, Instant};

use super::workload::{
    contend, crash_members, first_other_start, options, recover, report, signed_ms, watch_lost,
};
use super::{ChaosTarget, Link, Plan, ScenarioReport, Scene};
use conformance::fence::FencedResource;
use conformance::rules::unique_name;
use harness::proxy::ProxyMode;
use harness::ClockJump;

/// The fault of a victim scenario.
enum Fault<'a> {
    /// Cut the victim's link for `duration`.
    Partition(Duration),
    /// The victim is `pinned` (a client and its link) instead of a linked client of the
    /// target; its link is cut for `duration`.
    Pinned {
        pinned: (Arc<dyn DistributedLock>, Link),
        duration: Duration,
    },
    /// Delay the victim's link by `delay` for `duration`.
    Delay { delay: Duration, duration: Duration },
    /// SIGSTOP every server for `duration`.
    StuckServer(Duration),
    /// Kill every server and restart it (wiped or not) after `down`.
    ServerCrash { wipe: bool, down: Duration },
    /// Remove the lock behind the victim's back.
    Steal(&'a dyn ChaosTarget),
    /// Kill `servers` (indices), restart after `down` (wiped or not).
    Members {
        which: Vec<usize>,
        wipe: bool,
        down: Duration,
    },
    /// Step every server's wall clock (for good: an NTP step is not undone), then wait a
    /// TTL.
    ClockJump(ClockJump),
}

impl Fault<'_> {
    /// Every server killed and restarted (`wipe`d or with its data) after a quarter TTL.
    fn server_crash(plan: Plan, wipe: bool) -> Self {
        Fault::ServerCrash {
            wipe,
            down: plan.ttl / 4,
        }
    }

    /// Every server's wall clock stepped by [`CLOCK_STEP`], ahead or back.
    fn clock_step(direction: fn(Duration) -> ClockJump) -> Self {
        Fault::ClockJump(direction(CLOCK_STEP))
    }
}

/// How far the clock-jump scenarios step the servers' wall clocks: far beyond any TTL and
/// any stay of a queued waiter, and longer than a scenario runs (so that after a step
/// back every clock-seeded fencing token of the run would come out below the tokens
/// granted before it).
pub const CLOCK_STEP: Duration = Duration::from_secs(600);

/// A victim holds the lock and sits in a critical section (read done, write pending)
/// while `fault` strikes; healthy contenders keep going; then the victim writes anyway
/// (as a paused process would) and the fence decides.
async fn victim_scenario(scene: Scene<'_>, fault: Fault<'_>) -> ScenarioReport {
    let Scene {
        scenario,
        target,
        plan,
    } = scene;
    let name = unique_name(scenario);
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let (victim, link) = match &fault {
        Fault::Pinned { pinned, .. } => pinned.clone(),
        _ => target.linked_client(options(&plan)).await,
    };
    let guard = victim
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("victim acquires a free lock");
    let section = resource
        .begin(guard.fencing_token())
        .expect("the first token is never stale");
    let seen = section.read();
    let (lost_at, lost_task) = watch_lost(&guard);
    let mut contenders = Vec::new();
    for _ in 0..plan.contenders {
        contenders.push(target.client(options(&plan)).await);
    }
    let fault_at = Instant::now();
    let until = fault_at + plan.contend;
    let contention = tokio::spawn(contend(
        contenders,
        name.clone(),
        resource.clone(),
        until,
        Arc::clone(&notes),
    ));
    let note = |text: String| notes.lock().expect("notes").push(text);
    let clock_jump = matches!(fault, Fault::ClockJump(_));
    match fault {
        Fault::Partition(duration) | Fault::Pinned { duration, .. } => {
            link.cut();
            sleep(duration).await;
            link.heal();
        }
        Fault::Delay { delay, duration } => {
            link.set_mode(ProxyMode::Delay {
                base: delay,
                jitter: delay / 10,
            });
            sleep(duration).await;
            link.heal();
        }
        Fault::StuckServer(duration) => {
            for server in target.servers() {
                if let Err(err) = server.pause() {
                    note(format!("pause {}: {err}", server.label()));
                }
            }
            sleep(duration).await;
            for server in target.servers() {
                if let Err(err) = server.resume() {
                    note(format!("resume {}: {err}", server.label()));
                }
            }
        }
        Fault::ServerCrash { wipe, down } => {
            let servers = target.servers();
            let all: Vec<usize> = (0..servers.len()).collect();
            crash_members(&servers, &all, wipe, down, &note).await;
        }
        Fault::Members { which, wipe, down } => {
            crash_members(&target.servers(), &which, wipe, down, &note).await;
        }
        Fault::Steal(target) => {
            target.steal(&name).await;
            sleep(plan.ttl).await;
        }
        Fault::ClockJump(jump) => {
            for server in target.servers() {
                match server.jump_clock(jump) {
                    Ok(ms) => note(format!("{} clock {jump:?}: now {ms:+} ms", server.label())),
                    Err(err) => note(format!("{} clock {jump:?}: {err}", server.label())),
                }
            }
            sleep(plan.ttl).await;
        }
    }
    // The victim wakes up a TTL later (whoever could take over has done so by then)
    // and writes without looking, as a paused process would.
    sleep(plan.ttl).await;
    let victim_write_accepted = Some(section.write(seen + 1).is_ok());
    section.end();
    if let Err(err) = contention.await {
        note(format!("contention panicked: {err}"));
    }
    let victim_lost = match guard.state() {
        LockState::Lost(reason) => Some(reason),
        _ => None,
    };
    let _ = guard.release().await;
    lost_task.abort();
    let recovery = recover(target, &name, plan).await;
    let backwards = if clock_jump {
        token_after(target, &name, &resource, plan, &note).await
    } else {
        None
    };
    let takeover = first_other_start(&resource, fault_at);
    let lost_signal_lead_ms = lost_at
        .lock()
        .expect("lost")
        .zip(first_other_start(&resource, fault_at))
        .map(|((lost, _), other)| signed_ms(other, lost));
    let notes = notes.lock().expect("notes").clone();
    let mut out = report(scenario, target, &resource, recovery, notes);
    out.fence.tokens_backwards.extend(backwards);
    out.victim_write_accepted = victim_write_accepted;
    out.victim_lost = victim_lost;
    out.lost_signal_lead_ms = lost_signal_lead_ms;
    out.takeover = takeover.map(|at| at.saturating_duration_since(fault_at));
    out
}

/// A fresh grant after the run must carry a token above every token the resource saw:
/// `(highest, fresh)` when it does not (its section is refused).
async fn token_after(
    target: &dyn ChaosTarget,
    name: &lock_core::LockName,
    resource: &FencedResource,
    plan: Plan,
    note: &(dyn Fn(String) + Sync),
) -> Option<(u64, u64)> {
    let client = target.client(options(&plan)).await;
    let guard = match client.lock_timeout(name.as_str(), plan.ttl * 3).await {
        Ok(guard) => guard,
        Err(err) => {
            note(format!("no grant to check the tokens with: {err}"));
            return None;
        }
    };
    let stale = resource
        .increment(guard.fencing_token(), async {})
        .await
        .err();
    let _ = guard.release().await;
    let (highest, fresh) = stale.map(|s| (s.highest, s.offered))?;
    note(format!(
        "a grant after the clock jump got token {fresh}, below {highest} granted before"
    ));
    Some((highest, fresh))
}

/// The victim's link is cut for 2 x TTL: its lease ends, others take over, its late write
/// is refused.
pub async fn holder_partitioned(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::Partition(scene.plan.ttl * 2)).await
}

/// The victim reaches one follower only, and that follower is cut off from its peers for
/// 2 x TTL: it answers the victim for a while on its own (ZooKeeper: `syncLimit` ticks)
/// while the others end the victim's session or lease and take over. `None` where the
/// target cannot pin a client to a follower.
pub async fn follower_partition(scene: Scene<'_>) -> Option<ScenarioReport> {
    let pinned = scene.target.follower_link(options(&scene.plan)).await?;
    let fault = Fault::Pinned {
        pinned,
        duration: scene.plan.ttl * 2,
    };
    Some(victim_scenario(scene, fault).await)
}

/// The victim stops for 2 x TTL mid-section (renewals included, as with SIGSTOP of its
/// process), then writes without looking.
pub async fn holder_paused_beyond_ttl(scene: Scene<'_>) -> ScenarioReport {
    // From the servers' side a stopped process and a cut link look the same: silence.
    victim_scenario(scene, Fault::Partition(scene.plan.ttl * 2)).await
}

/// The victim's traffic is delayed by more than the TTL for 2 x TTL.
pub async fn long_network_delay(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(
        scene,
        Fault::Delay {
            delay: scene.plan.ttl + scene.plan.ttl / 2,
            duration: scene.plan.ttl * 2,
        },
    )
    .await
}

/// Every server is stopped (SIGSTOP) for 2 x TTL, then continued.
pub async fn stuck_server(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::StuckServer(scene.plan.ttl * 2)).await
}

/// Every server is killed (SIGKILL) and restarted with its data.
pub async fn server_crash_restart(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::server_crash(scene.plan, false)).await
}

/// Every server is killed and restarted with its data wiped.
pub async fn server_restart_without_data(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::server_crash(scene.plan, true)).await
}

/// The lock is removed behind the victim's back (operator, server clock jump).
pub async fn early_key_expiry(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::Steal(scene.target)).await
}

/// Every server's wall clock steps ahead by [`CLOCK_STEP`] (far past the TTL) while the
/// victim holds the lock and contenders wait for it (an NTP step, an operator's `date
/// -s`). A server that expires holds by its wall clock (Redis: key expiry) ends the hold
/// at once, while the victim's guard, timed on the client's monotonic clock, vouches
/// until its next renewal finds the key gone: only the fence turns the victim away. A
/// server that times sessions and leases on a monotonic clock (ZooKeeper) is not moved.
pub async fn server_clock_jump_forward(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::clock_step(ClockJump::Forward)).await
}

/// Every server's wall clock steps back by [`CLOCK_STEP`] while the victim holds the lock
/// and contenders wait for it: holds last no shorter, and fencing tokens never go back
/// (Redis seeds them from its clock, but never below the counter + 1): a grant after
/// the run must carry a token above every one before.
pub async fn server_clock_jump_back(scene: Scene<'_>) -> ScenarioReport {
    victim_scenario(scene, Fault::clock_step(ClockJump::Back)).await
}

/// One member (the leader, where there is one) is killed while the lock is held and
/// restarted after 2 x TTL.
pub async fn member_crash(scene: Scene<'_>) -> ScenarioReport {
    let which = vec![scene.target.leader().await.unwrap_or(0)];
    victim_scenario(
        scene,
        Fault::Members {
            which,
            wipe: false,
            down: scene.plan.ttl * 2,
        },
    )
    .await
}

/// RedLock: a majority of nodes crash and restart at once, empty.
pub async fn redlock_restart_immediate(scene: Scene<'_>) -> ScenarioReport {
    let n = scene.target.servers().len();
    victim_scenario(
        scene,
        Fault::Members {
            which: (0..n / 2 + 1).collect(),
            wipe: true,
            down: Duration::from_millis(50),
        },
    )
    .await
}

/// RedLock: a minority of nodes crash and restart empty only after the TTL (the
/// documented operating rule).
pub async fn redlock_restart_delayed(scene: Scene<'_>) -> ScenarioReport {
    let n = scene.target.servers().len();
    victim_scenario(
        scene,
        Fault::Members {
            which: (0..n.saturating_sub(1) / 2).collect(),
            wipe: true,
            down: scene.plan.ttl + scene.plan.ttl / 2,
        },
    )
    .await
}
