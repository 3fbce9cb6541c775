//! The fenced-store checks on the stores lock-core ships: in memory, and a local file
//! written by many tasks and by the processes' OS locks.

use std::sync::Arc;

use conformance::fence::store::{concurrent_writers_keep_the_highest, stale_write_changes_nothing};
use lock_core::fence::{FencedStore, FileFence, MemoryFence};
use lock_core::{ErrorKind, FencingToken};

#[tokio::test]
async fn memory_refuses_stale_writes() {
    stale_write_changes_nothing(&MemoryFence::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_concurrent_writers_keep_the_highest() {
    concurrent_writers_keep_the_highest(Arc::new(MemoryFence::new()), 50).await;
}

#[tokio::test]
async fn file_refuses_stale_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = FileFence::new(dir.path().join("resource")).expect("store");
    stale_write_changes_nothing(&store).await;
    // What a reader of the file sees: the token line, then the value.
    let bytes = std::fs::read(store.path()).expect("the file");
    assert_eq!(bytes, b"distlock-fence 11\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_concurrent_writers_keep_the_highest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = FileFence::new(dir.path().join("resource")).expect("store");
    concurrent_writers_keep_the_highest(Arc::new(store), 40).await;
}

#[tokio::test]
async fn file_bad_input_gets_typed_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let no_dir = FileFence::new(dir.path().join("missing/resource")).expect_err("no dir");
    assert_eq!(no_dir.kind(), ErrorKind::InvalidConfig);
    assert_eq!(
        FileFence::new("/").expect_err("no name").kind(),
        ErrorKind::InvalidConfig
    );
    assert_eq!(
        FileFence::new("").expect_err("empty").kind(),
        ErrorKind::InvalidConfig
    );

    // A file that is not a fenced file is neither read nor overwritten.
    let path = dir.path().join("plain");
    std::fs::write(&path, b"someone else's data").expect("write");
    let store = FileFence::new(&path).expect("store");
    let err = store
        .write(FencingToken(1), b"x")
        .await
        .expect_err("not fenced");
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert_eq!(
        store.read().await.expect_err("not fenced").kind(),
        ErrorKind::Protocol
    );
    assert_eq!(std::fs::read(&path).expect("read"), b"someone else's data");
}
