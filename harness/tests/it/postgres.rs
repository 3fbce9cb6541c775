//! The PostgreSQL servers: one server serves, pauses, survives a kill with its data and
//! dies with its handle (workers too); a replica follows its primary and takes over.

use std::time::{Duration, Instant};

use harness::require_server;
use harness::{PostgresOptions, PostgresReplicated, PostgresServer};
use tokio_postgres::NoTls;

use super::harness::assert_gone;

const PAUSED_WAIT: Duration = Duration::from_millis(500);
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// State and parent pid of `pid` (`None`: no such process).
fn proc_stat(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit(')').next()?.split_whitespace();
    let state = fields.next()?.to_owned();
    Some((state, fields.next()?.parse().ok()?))
}

/// The children of `pid` (the postmaster's workers).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| proc_stat(p).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// Asserts the postmaster `pid` is gone and, within 2 s, each of its `workers` is dead
/// (a zombie at worst: nobody may reap orphans here).
async fn assert_all_gone(pid: u32, workers: &[u32]) {
    assert_gone(pid);
    let started = Instant::now();
    let alive = || {
        workers
            .iter()
            .copied()
            .filter(|&w| proc_stat(w).is_some_and(|(state, _)| state != "Z"))
            .collect::<Vec<_>>()
    };
    while !alive().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "workers of {pid} still alive: {:?}",
            alive()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn postgres_serves_pauses_survives_a_kill_and_dies_with_its_handle() {
    let started = Instant::now();
    let server = require_server!(PostgresServer::start().await);
    eprintln!("postgres started in {:?}", started.elapsed());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());
    assert_eq!(server.url(), url);
    let pid = server.pid().expect("running");
    let workers = children_of(pid);
    assert!(!workers.is_empty(), "the postmaster runs workers");

    let (client, connection) = tokio_postgres::connect(&server.conninfo(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute("CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')")
        .await
        .expect("write");

    server.pause().expect("pause");
    let paused = tokio::time::timeout(PAUSED_WAIT, client.simple_query("SELECT 1")).await;
    assert!(paused.is_err(), "a paused server answered: {paused:?}");
    assert!(!server.is_ready().await);
    server.resume().expect("resume");
    let row = tokio::time::timeout(IO_TIMEOUT, client.query_one("SELECT count(*) FROM t", &[]))
        .await
        .expect("answers once resumed")
        .expect("count");
    assert_eq!(row.get::<_, i64>(0), 1);

    let workers = children_of(pid);
    server.kill9().await.expect("kill");
    assert!(server.pid().is_none());
    assert_all_gone(pid, &workers).await;
    let restarted = Instant::now();
    server.restart().await.expect("restart");
    eprintln!("postgres restarted in {:?}", restarted.elapsed());
    let pid = server.pid().expect("running again");
    assert_eq!(
        server.query_value("SELECT v FROM t").await.expect("read"),
        Some("kept".to_owned()),
        "the data dir is kept across a kill"
    );

    drop(client);
    server.pause().expect("pause before drop");
    let workers = children_of(pid);
    drop(server);
    assert_all_gone(pid, &workers).await;
}

#[tokio::test]
async fn postgres_replica_follows_its_primary_and_takes_over_when_promoted() {
    let started = Instant::now();
    let pair = require_server!(PostgresReplicated::start().await);
    eprintln!("primary and replica started in {:?}", started.elapsed());
    let (primary, replica) = (pair.primary(), pair.replica());
    assert_ne!(primary.port(), replica.port());
    assert!(!primary.is_in_recovery().await.expect("primary"));
    assert!(replica.is_in_recovery().await.expect("replica"));

    primary
        .query("CREATE TABLE t (v text); INSERT INTO t VALUES ('replicated')")
        .await
        .expect("write on the primary");
    pair.wait_replica_caught_up().await.expect("catch up");
    assert_eq!(
        replica.query_value("SELECT v FROM t").await.expect("read"),
        Some("replicated".to_owned())
    );
    assert!(
        replica.query("INSERT INTO t VALUES ('x')").await.is_err(),
        "a standby is read-only"
    );

    let primary_pid = primary.pid().expect("primary");
    let primary_workers = children_of(primary_pid);
    primary.kill9().await.expect("kill the primary");
    assert_all_gone(primary_pid, &primary_workers).await;
    pair.promote_replica().await.expect("promote");
    replica
        .query("INSERT INTO t VALUES ('after failover')")
        .await
        .expect("write on the promoted replica");
    assert_eq!(
        replica
            .query_value("SELECT count(*) FROM t")
            .await
            .expect("count"),
        Some("2".to_owned())
    );
    let replica_pid = replica.pid().expect("replica");
    let replica_workers = children_of(replica_pid);
    drop(pair);
    assert_all_gone(replica_pid, &replica_workers).await;
}

/// A server serving TLS only over TCP: it starts (its key file passes the server's
/// ownership and mode check), the harness's own sessions (socket) work and say TLS is
/// on, and a plain TCP session is refused by `pg_hba.conf`.
#[tokio::test]
async fn postgres_serves_tls_only_over_tcp() {
    let certs = tempfile::tempdir().expect("tempdir");
    harness::tls::make_certificates(certs.path()).await;
    let options = PostgresOptions::default().tls(certs.path()).tls_only(true);
    let server = require_server!(PostgresServer::start_with(options).await);
    assert_eq!(
        server
            .query_value("SHOW ssl")
            .await
            .expect("query")
            .as_deref(),
        Some("on")
    );
    let plain = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        server.port()
    );
    let err = tokio::time::timeout(IO_TIMEOUT, tokio_postgres::connect(&plain, NoTls))
        .await
        .expect("answered")
        .err()
        .expect("a plain TCP session is refused");
    let refusal = err.as_db_error().map(|db| db.message().to_owned());
    assert!(
        refusal
            .as_deref()
            .is_some_and(|m| m.contains("no encryption")),
        "{err:?}"
    );
}
