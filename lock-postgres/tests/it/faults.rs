//! Faults of PostgreSQL's own: the client's server connections ended by an operator
//! (`pg_terminate_backend`), and a failover to a streaming replica promoted after the
//! primary was killed.

use std::sync::Arc;
use std::time::Duration;

use harness::{or_skip, PostgresReplicated};
use lock_core::{DistributedLock, DistributedLockExt, LockState, LostReason};
use lock_postgres::PostgresLock;
use testkit::postgres::{with_ttl, PostgresFactory};
use tokio::time::{sleep, timeout, Instant};

fn name(what: &str) -> String {
    format!("faults/{what}/{}", uuid::Uuid::new_v4().simple())
}

/// Holds live in the table, not in a session: they outlive their client's connections,
/// and a waiter is still woken (its listener reconnects and wakes everyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_outlive_terminated_connections() {
    let Some(factory) = PostgresFactory::shared().await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let holder = factory.typed_client(with_ttl(ttl)).await;
    let waiter = factory.typed_client(with_ttl(ttl)).await;
    let name = name("terminated");
    let guard = holder.lock(&name).await.expect("lock");
    let waiting = {
        let (waiter, name) = (Arc::clone(&waiter), name.clone());
        tokio::spawn(async move { waiter.lock(&name).await })
    };
    sleep(Duration::from_millis(200)).await;
    let ended = factory.terminate_clients().await;
    assert!(ended >= 2, "ended {ended} connections");
    // Past a renewal: the holder keeps its hold through new connections.
    sleep(ttl).await;
    assert_eq!(guard.state(), LockState::Held, "the hold survived");
    assert!(!waiting.is_finished(), "granted while held");
    let released = Instant::now();
    guard.release().await.expect("release");
    let next = timeout(Duration::from_secs(2), waiting)
        .await
        .expect("the waiter is granted after the release")
        .expect("task")
        .expect("lock");
    println!("granted {:?} after the release", released.elapsed());
    next.release().await.expect("release");
}

/// With advisory locks, holds live and die with the holding connection: ending it ends
/// them (at once, not at the TTL), and the name is free for others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_holds_end_with_their_connection() {
    let Some(factory) = PostgresFactory::shared().await else {
        return;
    };
    let factory = factory.with_advisory_locks();
    let ttl = Duration::from_secs(10);
    let holder = factory.typed_client(with_ttl(ttl)).await;
    let other = factory.typed_client(with_ttl(ttl)).await;
    let name = name("advisory_terminated");
    let guard = holder.lock(&name).await.expect("lock");
    let ended = Instant::now();
    factory.terminate_clients().await;
    let reason = timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost when its holding connection ended, long before the TTL");
    assert_eq!(reason.without_side(), LostReason::SessionExpired);
    println!("lost {:?} after the connection ended", ended.elapsed());
    let next = other
        .lock_timeout(&name, Duration::from_secs(3))
        .await
        .expect("the name is free");
    next.release().await.expect("release");
}

/// The primary is killed and its streaming replica promoted: a client that lists both
/// servers with `target_session_attrs=read-write` follows, a hold replicated before the
/// kill lives on (its row is on the new primary) and is renewed there, and new grants
/// carry higher fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_follows_a_failover_to_the_replica() {
    let Some(servers) = or_skip(PostgresReplicated::start().await) else {
        return;
    };
    // A lease longer than the failover (kill, promotion, reconnection) on a loaded machine.
    let locks = failover_client(&servers, Duration::from_secs(10)).await;
    let kept = name("kept");
    let guard = locks.lock(&kept).await.expect("lock");
    let first = guard.fencing_token();
    servers
        .wait_replica_caught_up()
        .await
        .expect("the replica catches up");
    servers.primary().kill9().await.expect("kill the primary");
    servers
        .promote_replica()
        .await
        .expect("promote the replica");
    let promoted = Instant::now();
    let fresh = name("fresh");
    let deadline = promoted + Duration::from_secs(15);
    let next = loop {
        match locks.try_lock(&fresh).await {
            Ok(Some(next)) => break next,
            Ok(None) => panic!("a fresh name is held"),
            Err(err) if err.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("no grant on the promoted replica: {err}"),
        }
    };
    println!(
        "granted on the promoted replica {:?} after promotion",
        promoted.elapsed()
    );
    // Past a renewal on the new primary: the replicated hold is still held.
    sleep(Duration::from_secs(4)).await;
    assert_eq!(
        guard.state(),
        LockState::Held,
        "the replicated hold lives on"
    );
    let again = locks.try_lock(&kept).await.expect("try");
    assert!(again.is_none(), "the replicated hold still excludes");
    assert!(first.0 >= 1);
    next.release().await.expect("release");
    guard.release().await.expect("release");
    locks.close().await.expect("close");
}

/// A client of both servers that follows the primary (`target_session_attrs=read-write`),
/// with holds of `ttl`.
async fn failover_client(servers: &PostgresReplicated, ttl: Duration) -> Arc<PostgresLock> {
    lock_core::raw::driver::register::<lock_postgres::PostgresBackend>();
    let addrs = [servers.primary().addr(), servers.replica().addr()];
    let mut options = with_ttl(ttl);
    options.request_timeout = Duration::from_secs(2);
    let mut config = testkit::postgres::config(&addrs, "failover", options);
    config.read_write = true;
    let connect = || PostgresLock::connect(config.clone());
    Arc::new(conformance::connect_patiently("connect", connect).await)
}

/// Stops the replica's WAL receiver (its link to the primary), waiting until it is gone.
async fn cut_replication(servers: &PostgresReplicated) {
    let replica = servers.replica();
    replica
        .query("ALTER SYSTEM SET primary_conninfo = ''")
        .await
        .expect("clear primary_conninfo");
    replica
        .query("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let receivers = replica
            .query_value("SELECT count(*) FROM pg_stat_wal_receiver")
            .await
            .expect("read the WAL receiver");
        if receivers.as_deref() == Some("0") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the WAL receiver still runs after 10 s"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// What asynchronous replication cannot keep, shown rather than hidden: a grant the
/// replica had not received when the primary died is gone after the failover. Its holder
/// learns it at its next renewal, another client takes the name meanwhile, and the
/// fencing counter went back, so the new grant repeats the lost one's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreplicated_grant_is_lost_in_a_failover() {
    let Some(servers) = or_skip(PostgresReplicated::start().await) else {
        return;
    };
    let (holder, other) = (
        failover_client(&servers, Duration::from_secs(3)).await,
        failover_client(&servers, Duration::from_secs(3)).await,
    );
    let name = name("unreplicated");
    let replicated = holder.lock(&name).await.expect("lock");
    let replicated_token = replicated.fencing_token();
    replicated.release().await.expect("release");
    servers
        .wait_replica_caught_up()
        .await
        .expect("the replica catches up");
    cut_replication(&servers).await;
    let lost = holder.lock(&name).await.expect("lock");
    let lost_token = lost.fencing_token();
    servers.primary().kill9().await.expect("kill the primary");
    servers
        .promote_replica()
        .await
        .expect("promote the replica");
    let reason = timeout(Duration::from_secs(10), lost.lost())
        .await
        .expect("the holder learns at a renewal on the new primary");
    println!("the unreplicated hold was lost: {reason:?}");
    let next = other
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("another client takes the name on the new primary");
    println!(
        "tokens: replicated {replicated_token:?}, lost {lost_token:?}, after failover {:?}",
        next.fencing_token()
    );
    assert!(lost_token > replicated_token);
    assert!(
        next.fencing_token() <= lost_token,
        "the counter did not go back: the grant was replicated after all?"
    );
    next.release().await.expect("release");
}
