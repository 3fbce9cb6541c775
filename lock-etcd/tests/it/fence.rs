//! `EtcdFence`, the fenced resource on etcd, against a real server: the store checks of
//! `conformance::fence::store`, what the server holds, and bad input.

use std::sync::Arc;
use std::time::Duration;

use conformance::fence::store::{concurrent_writers_keep_the_highest, stale_write_changes_nothing};
use harness::{or_skip, EtcdServer};
use lock_core::fence::{FenceOutcome, FencedStore};
use lock_core::{ErrorKind, FencingToken};
use lock_etcd::{EtcdFence, TOKEN_SUFFIX};

fn key(test: &str) -> String {
    format!("fenced/{test}/{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_stale_writes_and_keeps_the_token_beside_the_value() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    let key = key("stale");
    let store = EtcdFence::connect(&server.url(), &key)
        .await
        .expect("store");
    stale_write_changes_nothing(&store).await;
    assert!(store
        .write(FencingToken(12), b"twelve")
        .await
        .expect("write")
        .is_written());
    // The server's own record: the value under the key, the padded token beside it.
    let mut raw = etcd_client::Client::connect([server.url().replace("etcd://", "http://")], None)
        .await
        .expect("raw client");
    let value = raw.get(key.as_bytes(), None).await.expect("get");
    assert_eq!(value.kvs()[0].value(), b"twelve");
    let token = raw
        .get(format!("{key}{TOKEN_SUFFIX}"), None)
        .await
        .expect("get");
    assert_eq!(token.kvs()[0].value(), b"00000000000000000012");
    // Tokens compare exactly over all of u64.
    let top = store.resource(&format!("{key}/top")).expect("resource");
    assert!(top
        .write(FencingToken(u64::MAX), b"max")
        .await
        .expect("write")
        .is_written());
    let below = top
        .write(FencingToken(u64::MAX - 1), b"below")
        .await
        .expect("write");
    assert_eq!(
        below,
        FenceOutcome::Stale {
            newest: FencingToken(u64::MAX)
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_highest_token() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    let store = EtcdFence::connect(&server.url(), &key("concurrent"))
        .await
        .expect("store");
    concurrent_writers_keep_the_highest(Arc::new(store), 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let empty = EtcdFence::connect("etcd://127.0.0.1:1", "")
        .await
        .expect_err("empty");
    assert_eq!(empty.kind(), ErrorKind::InvalidConfig);
    let bad = EtcdFence::connect("etcd://127.0.0.1:1?no_such_option=1", "k").await;
    assert_eq!(bad.expect_err("bad url").kind(), ErrorKind::InvalidConfig);
    let started = tokio::time::Instant::now();
    let closed = EtcdFence::connect("etcd://127.0.0.1:1?request_timeout=500ms", "k").await;
    let err = closed.expect_err("nobody listens");
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the request timeout"
    );
}
