//! A name used as two kinds (a mutex on a semaphore's or a read-write lock's name) is a
//! typed `Conflict` on every topology and path: queued or not, and on RedLock.

use std::time::Duration;

use lock_core::{DistributedLock, DistributedLockExt, ErrorKind, RwLock, Semaphore};
use testkit::redis::{unique_name as name, with_ttl, RedisFactory};

use crate::primitives::try_once;

/// A client without the queue meets a semaphore's or a read-write lock's name with the
/// same typed conflict as a queued client, not a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_off_mutex_on_a_shared_kind_is_a_conflict() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(5));
    let client = factory.make(options.clone()).await;
    let mut config = testkit::redis::config_for(&factory.servers.addrs(), false, options);
    config.queue = false;
    let plain = lock_redis::RedisLock::connect(config)
        .await
        .expect("connect");
    let sem_name = name("queue_off_on_sem");
    let held = Semaphore::new(client.clone(), sem_name.as_str(), 2)
        .expect("semaphore")
        .acquire_with(&try_once())
        .await
        .expect("permit")
        .expect("free");
    let err = plain
        .try_lock(sem_name.as_str())
        .await
        .expect_err("a queue-off mutex on a semaphore");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("2 permits"), "{err}");
    held.release().await.expect("release");
    let rw_name = name("queue_off_on_rw");
    let read = RwLock::new(client.clone(), rw_name.as_str())
        .expect("rwlock")
        .read_with(&try_once())
        .await
        .expect("read")
        .expect("free");
    let err = plain
        .try_lock(rw_name.as_str())
        .await
        .expect_err("a queue-off mutex on a read-write lock");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    read.release().await.expect("release");
    plain.close().await.expect("close");
}

/// RedLock: a mutex on a name that a majority of its servers keep as a semaphore
/// (taken there by one-server clients, since RedLock grants no shared kind) is the same
/// typed conflict, not a count of servers that did not answer; and it leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_mutex_on_a_shared_kind_is_a_conflict() {
    let Some(factory) = RedisFactory::redlock(3).await else {
        return;
    };
    let options = with_ttl(Duration::from_secs(5));
    let redlock = factory.make(options.clone()).await;
    let sem_name = name("redlock_on_sem");
    let mut permits = Vec::new();
    for addr in factory.servers.addrs() {
        let config = testkit::redis::config_for(&[addr], false, options.clone());
        let one = lock_redis::RedisLock::connect(config)
            .await
            .expect("connect");
        let permit = Semaphore::new(std::sync::Arc::new(one), sem_name.as_str(), 2)
            .expect("semaphore")
            .acquire_with(&try_once())
            .await
            .expect("permit")
            .expect("free");
        permits.push(permit);
    }
    for wait in [None, Some(Duration::from_secs(2))] {
        let err = match wait {
            None => redlock.try_lock(sem_name.as_str()).await.map(|_| ()),
            Some(limit) => redlock
                .lock_timeout(sem_name.as_str(), limit)
                .await
                .map(|_| ()),
        }
        .expect_err("a RedLock mutex on a semaphore");
        assert_eq!(err.kind(), ErrorKind::Conflict, "wait {wait:?}: {err}");
        assert!(err.to_string().contains("2 permits"), "{err}");
    }
    for permit in permits {
        permit.release().await.expect("release");
    }
    assert_eq!(
        redlock.inspect(&sem_name).await.expect("inspect").waiters,
        Vec::new(),
        "the refused acquires left a waiter"
    );
    redlock.close().await.expect("close");
}
