//! Ensemble members dying under a held lock: the leader, the follower that serves the
//! holder, and over mutual TLS the member the holder is connected to. The lock is kept,
//! nobody else gets it, and the session moves to a live member.

use std::sync::Arc;
use std::time::Duration;

use harness::{ZkEnsemble, ZkServer, ZkTls};
use lock_core::{DistributedLockExt, ErrorKind, LockGuard, LockName, LockState, ReleaseOutcome};
use lock_zookeeper::ZkLock;
use tokio::time::{sleep, Instant};

use super::name;
use testkit::zookeeper::{self as common, record_states, seen, with_ttl, ZkFactory};

/// The index of the member that serves session `sid` (from `cons`).
async fn member_of(members: &[ZkServer], sid: i64) -> Option<usize> {
    let needle = format!("sid=0x{sid:x}");
    for (i, member) in members.iter().enumerate() {
        if !member.is_running() {
            continue;
        }
        if let Ok(out) = member.four_letter("cons").await {
            if out.contains(&needle) {
                return Some(i);
            }
        }
    }
    None
}

/// A client whose session is served by a member for which `wanted` holds (up to 12
/// tries; the client library picks a random member).
async fn client_on(
    factory: &ZkFactory,
    ttl: Duration,
    wanted: impl Fn(usize) -> bool,
) -> (Arc<lock_zookeeper::ZkLock>, Option<usize>) {
    let members = match &*factory.servers {
        common::Servers::Cluster(e) => e.members(),
        common::Servers::Single(_) => panic!("needs an ensemble"),
    };
    let mut last = None;
    for _ in 0..12 {
        let client = factory.zk_client(with_ttl(ttl)).await;
        let sid = client.backend().session_id().expect("connected");
        let member = member_of(members, sid).await;
        if member.is_some_and(&wanted) {
            return (client, member);
        }
        last = Some((client, member));
    }
    last.expect("at least one try")
}

/// A held lock whose ensemble member is about to be killed.
struct Hold<'a> {
    holder: &'a ZkLock,
    guard: &'a LockGuard,
    /// A client that tries to take the lock meanwhile.
    other: &'a ZkLock,
    lock: &'a LockName,
    ttl: Duration,
}

impl Hold<'_> {
    /// Kills member `victim` (the leader when `leader` is set: a new one must be elected);
    /// for 2 x TTL nobody else gets the lock and the guard is never lost; then it is Held
    /// again on the same session.
    async fn outlives_the_kill_of(
        &self,
        ensemble: &ZkEnsemble,
        victim: usize,
        leader: Option<usize>,
    ) {
        let (guard, lock, token) = (self.guard, self.lock, self.guard.fencing_token());
        let sid = self.holder.backend().session_id().expect("session");
        let states = record_states(guard);
        ensemble.member(victim).kill9().await.expect("kill9");
        let killed_at = Instant::now();
        if let Some(leader) = leader {
            ensemble
                .wait_for_new_leader(leader, Duration::from_secs(30))
                .await
                .expect("a new leader is elected");
        }
        let mut excluded = 0;
        while killed_at.elapsed() < self.ttl * 2 {
            if let Ok(Some(stolen)) = self.other.try_lock(lock.as_str()).await {
                panic!(
                    "second holder after killing member {victim}: token {} (ours {token})",
                    stolen.fencing_token()
                );
            }
            excluded += 1;
            assert!(
                !guard.state().is_lost(),
                "lost after killing member {victim}: {:?}",
                seen(&states)
            );
            sleep(Duration::from_millis(250)).await;
        }
        assert!(excluded > 5, "too few exclusion checks: {excluded}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while guard.state() != LockState::Held && Instant::now() < deadline {
            sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(guard.state(), LockState::Held, "states {:?}", seen(&states));
        assert_eq!(
            self.holder.backend().session_id(),
            Some(sid),
            "the session survives"
        );
        assert_eq!(self.holder.backend().session_epoch(), 1);
    }
}

/// Releases `guard` (it says Released); `other` then takes `lock` with a higher token.
async fn release_to_other(guard: LockGuard, other: &ZkLock, lock: &LockName) {
    let token = guard.fencing_token();
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = other
        .lock_timeout(lock.as_str(), Duration::from_secs(5))
        .await
        .expect("the other client acquires after the release");
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
}

/// Kills member `victim` while a lock is held by a client served by `serving`; checks the
/// lock is kept, nobody else gets it, and the session moves to a live member.
async fn kill_member_keeps_lock(kill_leader: bool) {
    let Some(factory) = ZkFactory::start_ensemble().await else {
        return;
    };
    let common::Servers::Cluster(ensemble) = &*factory.servers else {
        unreachable!()
    };
    let ttl = Duration::from_secs(6);
    let leader = ensemble.leader().await.expect("a leader");
    // Leader case: the holder is on the leader. Follower case: on the killed follower.
    let (holder, served_by) = client_on(&factory, ttl, |m| (m == leader) == kill_leader).await;
    let victim = if kill_leader {
        leader
    } else {
        served_by
            .filter(|m| *m != leader)
            .unwrap_or((leader + 1) % ensemble.len())
    };
    let other = factory.zk_client(with_ttl(ttl)).await;
    let lock = name(if kill_leader { "leader" } else { "follower" });
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let states = record_states(&guard);
    let sid = holder.backend().session_id().expect("session");
    let hold = Hold {
        holder: &holder,
        guard: &guard,
        other: &other,
        lock: &lock,
        ttl,
    };
    hold.outlives_the_kill_of(ensemble, victim, kill_leader.then_some(leader))
        .await;
    let now_on = member_of(ensemble.members(), sid).await;
    assert!(
        now_on.is_some_and(|m| m != victim),
        "the session is served by a live member, is on {now_on:?}"
    );
    eprintln!(
        "killed member {victim} ({}), holder was on {served_by:?} and moved to {now_on:?}; states {:?}",
        if kill_leader { "leader" } else { "follower" },
        seen(&states)
    );
    release_to_other(guard, &other, &lock).await;
}

/// Ensemble: killing the leader while a lock is held keeps the lock; the session moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_the_lock() {
    kill_member_keeps_lock(true).await;
}

/// Ensemble: killing the follower serving the holder keeps the lock; the session moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_follower_keeps_the_lock() {
    kill_member_keeps_lock(false).await;
}

/// TLS ensemble (`zks://` to the three members' secure ports, mutual TLS): the member
/// that serves the holder (seen through the fault proxies the holder connects through) is
/// killed while the lock is held; nobody else gets the lock, the guard is never lost, and
/// the same session moves to a live member over TLS. The secure ports speak TLS only:
/// plain `zk://` to them fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_ensemble_killing_the_holders_member_keeps_the_lock() {
    let tls = ZkTls::make().await.expect("certificates").client_auth(true);
    let Some(factory) = ZkFactory::start_tls_ensemble(tls).await else {
        return;
    };
    let common::Servers::Cluster(ensemble) = &*factory.servers else {
        unreachable!()
    };
    let secure: Vec<String> = factory
        .client_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(secure.len(), 3);
    let plain = format!("zk://{}/tls?request_timeout=2s", secure.join(","));
    let err = lock_core::connect(&plain)
        .await
        .expect_err("plain zk:// to the secure ports");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");

    let ttl = Duration::from_secs(6);
    let (holder, proxies) = factory.proxied_client(with_ttl(ttl)).await;
    let serving = || proxies.iter().position(|p| p.connections() > 0);
    let victim = serving().expect("the holder is connected to one member");
    let other = factory.zk_client(with_ttl(ttl)).await;
    let lock = name("tls_ensemble");
    let guard = holder.lock(lock.as_str()).await.expect("acquire");
    let states = record_states(&guard);
    let leader = ensemble.leader().await.expect("a leader");
    let hold = Hold {
        holder: &holder,
        guard: &guard,
        other: &other,
        lock: &lock,
        ttl,
    };
    hold.outlives_the_kill_of(ensemble, victim, (victim == leader).then_some(leader))
        .await;
    let now_on = serving();
    assert!(
        now_on.is_some_and(|m| m != victim),
        "the holder is connected to a live member, is on {now_on:?}"
    );
    eprintln!(
        "killed member {victim} (leader {leader}); the holder moved to {now_on:?} over TLS; \
         states {:?}",
        seen(&states)
    );
    release_to_other(guard, &other, &lock).await;
}
