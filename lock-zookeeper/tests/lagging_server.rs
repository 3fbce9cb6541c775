//! Servers that answer from a state the leader has moved past: a follower cut off from its
//! leader (it serves reads for `syncLimit` ticks while the leader expires the sessions it
//! held), and a leader that has not committed a create yet when the client comes to it.
//! The ensembles route their quorum links through fault proxies
//! ([`ZkOptions::peer_links`]), so a member can be cut off or slowed down while its
//! clients still reach it.

mod common;

use std::time::Duration;

use common::{config, record_states, seen, unique_name, with_ttl};
use conformance::harness::{or_skip, ZkEnsemble, ZkOptions};
use lock_core::{DistributedLockExt, ReleaseOutcome};
use lock_zookeeper::ZkBackend;
use tokio::time::{sleep, Instant};

/// Signed milliseconds from `origin` to `at`.
fn ms_since(origin: Instant, at: Instant) -> f64 {
    if at >= origin {
        (at - origin).as_secs_f64() * 1000.0
    } else {
        -((origin - at).as_secs_f64() * 1000.0)
    }
}

/// A holder whose client reaches one follower only; that follower is cut off from its
/// peers; the leader expires the holder's session and a client on the majority side
/// acquires. The holder's guard must have stopped vouching (Lost, or its validity
/// deadline passed) before that grant, although the cut-off follower still answers
/// reads for `syncLimit` x `tickTime` = 5 s, longer than the 2 s session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_on_a_cut_off_follower_stops_vouching_before_another_client_gets_the_lock() {
    let options = ZkOptions::default().peer_links(true).sync_limit(10);
    let Some(ensemble) = or_skip(ZkEnsemble::start_with(options).await) else {
        return;
    };
    let leader = ensemble.leader().await.expect("a leader");
    let follower = (leader + 1) % ensemble.len();
    let majority: Vec<String> = (0..ensemble.len())
        .filter(|i| *i != follower)
        .map(|i| ensemble.member(i).connect_string())
        .collect();
    let ttl = Duration::from_secs(2);
    let mut options = with_ttl(ttl);
    options.request_timeout = Duration::from_secs(1);
    let only_follower = vec![ensemble.member(follower).connect_string()];
    let holder = ZkBackend::connect(config(only_follower, options.clone()))
        .await
        .expect("the holder connects to the follower");
    let other = ZkBackend::connect(config(majority, options))
        .await
        .expect("the other client connects to the majority");
    let lock = unique_name("lagging/cut-off-follower");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let states = record_states(&guard);

    // Cut the follower off between two renewals, once it has reported the last one to
    // the leader (a follower reports its sessions' activity at the leader's next ping,
    // within tickTime / 2).
    let before = guard.valid_until();
    let waited = Instant::now();
    while guard.valid_until() == before {
        assert!(waited.elapsed() < ttl, "no renewal within the TTL");
        sleep(Duration::from_millis(5)).await;
    }
    sleep(Duration::from_millis(400)).await;
    ensemble.partition(follower).expect("cut the follower off");
    let cut_at = Instant::now();

    let next = other
        .lock_timeout(lock.as_str(), Duration::from_secs(20))
        .await
        .expect("the majority side acquires once the holder's session expires");
    let granted_at = next.acquired_at();
    let valid_until = guard.valid_until();
    let log = states.lock().expect("log").clone();
    let lost_at = log.iter().find(|(_, s)| s.is_lost()).map(|(at, _)| *at);
    let report = format!(
        "cut at 0 ms; other client granted at {:.0} ms; holder valid until {:.0} ms, lost at {:?} ms; states {:?}",
        ms_since(cut_at, granted_at),
        ms_since(cut_at, valid_until),
        lost_at.map(|at| ms_since(cut_at, at).round()),
        seen(&states),
    );
    eprintln!("{report}");
    assert!(
        valid_until <= granted_at || lost_at.is_some_and(|at| at <= granted_at),
        "the holder on the cut-off follower still vouched for the lock after another client's grant: {report}"
    );

    next.release().await.expect("release");
    ensemble.heal().expect("heal");
    assert!(matches!(
        guard.release().await.expect("release"),
        ReleaseOutcome::AlreadyLost(_)
    ));
}
