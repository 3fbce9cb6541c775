//! Servers that answer from a state the leader has moved past: a follower cut off from its
//! leader (it serves reads for `syncLimit` ticks while the leader expires the sessions it
//! held), and a leader that has not committed a create yet when the client comes to it.
//! The ensembles route their quorum links through fault proxies
//! ([`ZkOptions::peer_links`]), so a member can be cut off or slowed down while its
//! clients still reach it.

use std::sync::Arc;
use std::time::Duration;

use harness::proxy::{FaultProxy, ProxyMode};
use harness::{or_skip, ZkEnsemble, ZkOptions};
use lock_core::{DistributedLockExt, ReleaseOutcome};
use lock_zookeeper::{lock_dir, ZkLock};
use testkit::zookeeper::{
    config, create_persistent, queue, raw_client, record_states, seen, unique_name, with_ttl, BASE,
};
use tokio::time::{sleep, timeout, Instant};

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
    let holder = ZkLock::connect(config(only_follower, options.clone()))
        .await
        .expect("the holder connects to the follower");
    let other = ZkLock::connect(config(majority, options))
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

/// How late every quorum message reaches its peer.
const LAG: Duration = Duration::from_millis(1000);

/// The client's create goes to one follower; the connection to it breaks before the reply
/// and the client moves to the other follower. That one confirms the session with the
/// leader (the create reached the leader first) but applies the create only later, when
/// its commit arrives. The client must find its node rather than queue a second one
/// (which, same session and a higher sequence, would wait for the first forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_unseen_by_the_server_the_client_moves_to_leaves_one_node() {
    // Followers wait 10 s for their leader: the lag does not make them give up.
    let options = ZkOptions::default().peer_links(true).sync_limit(20);
    let Some(ensemble) = or_skip(ZkEnsemble::start_with(options).await) else {
        return;
    };
    let leader = ensemble.leader().await.expect("a leader");
    let first = (leader + 1) % ensemble.len();
    let second = (leader + 2) % ensemble.len();
    let admin = raw_client(&[ensemble.member(leader).connect_string()]).await;
    let lock = unique_name("lagging/unseen-create");
    create_persistent(&admin, [BASE.to_owned(), lock_dir(BASE, &lock)]).await;
    let to_first = FaultProxy::start(ensemble.member(first).addr())
        .await
        .expect("proxy");
    let to_second = FaultProxy::start(ensemble.member(second).addr())
        .await
        .expect("proxy");
    // Refused at first: the client starts on the first follower.
    to_second.set_mode(ProxyMode::Reset);
    // A long session: reconnecting through the slow links takes two lags.
    let mut options = with_ttl(Duration::from_secs(12));
    options.request_timeout = Duration::from_secs(10);
    let hosts = vec![to_first.addr().to_string(), to_second.addr().to_string()];
    let client = Arc::new(
        ZkLock::connect(config(hosts, options))
            .await
            .expect("the client connects to the first follower"),
    );
    to_second.set_mode(ProxyMode::Pass);

    for member in 0..ensemble.len() {
        ensemble
            .set_peer_links(
                member,
                ProxyMode::Delay {
                    base: LAG,
                    jitter: Duration::ZERO,
                },
            )
            .expect("slow quorum links");
    }
    let acquire = tokio::spawn({
        let (client, lock) = (Arc::clone(&client), lock.clone());
        async move {
            client
                .lock_timeout(lock.as_str(), Duration::from_secs(20))
                .await
        }
    });
    // The create reaches the leader after one lag and commits after three (a follower's
    // ack); the second follower confirms the moved session after the first lag plus two
    // and applies the create after four.
    sleep(LAG / 2).await;
    to_first.set_mode(ProxyMode::Reset);
    sleep(LAG * 5).await;
    for member in 0..ensemble.len() {
        ensemble
            .set_peer_links(member, ProxyMode::Pass)
            .expect("fast quorum links");
    }
    let acquired = timeout(Duration::from_secs(25), acquire)
        .await
        .expect("the acquire ends")
        .expect("the acquire task");
    let nodes = queue(&admin, &lock).await;
    let guard = acquired.unwrap_or_else(|err| {
        panic!("the acquire failed: {err}; nodes in the lock directory: {nodes:?}")
    });
    assert!(
        to_second.accepted() > 0,
        "the client moved to the second follower"
    );
    assert_eq!(client.backend().session_epoch(), 1, "the session survived");
    assert_eq!(nodes.len(), 1, "one node for one acquire: {nodes:?}");
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(queue(&admin, &lock).await.is_empty());
}
