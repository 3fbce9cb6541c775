//! `PostgresFence`, the fenced resource on PostgreSQL, against a real server: the store
//! checks of `conformance::fence::store`, what the table holds, and bad input.

use std::sync::Arc;
use std::time::Duration;

use conformance::fence::store::{concurrent_writers_keep_the_highest, stale_write_changes_nothing};
use harness::{or_skip, PostgresServer};
use lock_core::fence::FencedStore;
use lock_core::{ErrorKind, FencingToken};
use lock_postgres::PostgresFence;

fn resource(test: &str) -> String {
    format!("fenced/{test}/{}", uuid::Uuid::new_v4().simple())
}

async fn store(server: &PostgresServer, test: &str) -> PostgresFence {
    let store = PostgresFence::connect(&server.url(), "fenced", &resource(test))
        .await
        .expect("store");
    store.create_table().await.expect("table");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_stale_writes_and_keeps_the_token_in_the_row() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    let store = store(&server, "stale").await;
    stale_write_changes_nothing(&store).await;
    // The server's own record: the row holds the newest token and its value.
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("raw client");
    let _connection = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT token, value FROM distlock.fenced WHERE resource = $1",
            &[&store.name()],
        )
        .await
        .expect("the row");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, Vec<u8>>(1)),
        (11, Vec::new())
    );
    // A second create is harmless; a token beyond bigint is a typed error, stored nothing.
    store.create_table().await.expect("again");
    let huge = store
        .write(FencingToken(u64::MAX), b"x")
        .await
        .expect_err("too big");
    assert_eq!(huge.kind(), ErrorKind::Unsupported);
    assert_eq!(
        store.read().await.expect("read").map(|f| f.token),
        Some(FencingToken(11))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_highest_token() {
    let Some(server) = or_skip(PostgresServer::start().await) else {
        return;
    };
    let store = store(&server, "concurrent").await;
    concurrent_writers_keep_the_highest(Arc::new(store), 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let url = "postgres://postgres@127.0.0.1:1/postgres?request_timeout=500ms";
    for (table, resource) in [("", "r"), (&*"t".repeat(64), "r"), ("t", ""), ("t", "a\0b")] {
        let err = PostgresFence::connect(url, table, resource)
            .await
            .expect_err("bad input");
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidConfig,
            "{table:?} {resource:?}"
        );
    }
    let started = tokio::time::Instant::now();
    let err = PostgresFence::connect(url, "t", "r")
        .await
        .expect_err("nobody listens");
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the request timeout"
    );
}
