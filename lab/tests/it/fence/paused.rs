//! A holder process frozen past its lease writes late through each store, with the lock on
//! that store's own server (the local file with its lock on Redis): refused by the store.

use super::holder::{act_as_holder_if_asked, paused_holder_is_refused, test_name, StoreSpec};
use super::{etcd, postgres, redis};

fn key() -> String {
    format!("fenced/{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_a_paused_holders_late_write() {
    if act_as_holder_if_asked().await {
        return;
    }
    let Some(server) = redis().await else { return };
    let url = server.url();
    let store = StoreSpec::Redis {
        url: url.clone(),
        key: key(),
    };
    let test = test_name(module_path!(), "redis_refuses_a_paused_holders_late_write");
    paused_holder_is_refused(&test, &url, &url, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_paused_holders_late_write() {
    if act_as_holder_if_asked().await {
        return;
    }
    let Some(server) = etcd().await else { return };
    let url = server.url();
    let store = StoreSpec::Etcd {
        url: url.clone(),
        key: key(),
    };
    let lock_url = format!("{url}/fence-paused");
    let test = test_name(module_path!(), "etcd_refuses_a_paused_holders_late_write");
    paused_holder_is_refused(&test, &lock_url, &lock_url, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_paused_holders_late_write() {
    if act_as_holder_if_asked().await {
        return;
    }
    let Some(server) = postgres().await else {
        return;
    };
    let url = server.url();
    let store = StoreSpec::Postgres {
        url: url.clone(),
        table: "fenced".into(),
        row: key(),
    };
    let test = test_name(
        module_path!(),
        "postgres_refuses_a_paused_holders_late_write",
    );
    paused_holder_is_refused(&test, &url, &url, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_refuses_a_paused_holders_late_write() {
    if act_as_holder_if_asked().await {
        return;
    }
    let Some(server) = redis().await else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let store = StoreSpec::File {
        path: dir.path().join("resource"),
    };
    let test = test_name(module_path!(), "file_refuses_a_paused_holders_late_write");
    paused_holder_is_refused(&test, &server.url(), &server.url(), store).await;
}
