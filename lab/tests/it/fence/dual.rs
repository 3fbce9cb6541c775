//! The holders of a migration from etcd to Redis (`dual:etcd://…|redis://…`) write through
//! one store: an old-only holder frozen past its lease, a dual holder taking over and
//! writing, the old-only holder's late write refused by the store; then a new-only holder
//! (Redis alone, the migration's last phase) writes with a newer token, accepted.

use lock_core::fence::FenceOutcome;
use lock_core::DistributedLockExt;

use super::holder::{
    act_as_holder_if_asked, paused_holder_is_refused, test_name, StoreSpec, FRESH,
};
use super::{etcd, postgres, redis};

/// The servers a store may live on, besides the migration's own.
struct Sides {
    etcd: String,
    redis: String,
}

/// Runs the migration's holders against the store `store` names.
async fn migration(function: &str, store: impl FnOnce(&Sides) -> Option<StoreSpec>) {
    let (Some(old), Some(new)) = (etcd().await, redis().await) else {
        return;
    };
    let sides = Sides {
        etcd: old.url(),
        redis: new.url(),
    };
    let Some(store) = store(&sides) else { return };
    let prefix = format!("fence-dual-{}", uuid::Uuid::new_v4().simple());
    let old_only = format!("{}/{prefix}", sides.etcd);
    let new_only = format!("{}?prefix={prefix}", sides.redis);
    let dual = format!("dual:{old_only}|{new_only}");
    let test = test_name(module_path!(), function);
    let refused = paused_holder_is_refused(&test, &old_only, &dual, store).await;

    // The last phase: a new-only holder's token is above the dual holder's; accepted.
    let locks = lock_core::connect(&new_only)
        .await
        .expect("new-only client");
    let guard = locks.lock(&refused.name).await.expect("new-only hold");
    let token = guard.fencing_token();
    assert!(
        token > refused.newest,
        "new-only {token} after dual {}",
        refused.newest
    );
    let written = refused
        .store
        .write(token, b"new-only")
        .await
        .expect("write");
    assert_eq!(written, FenceOutcome::Written);
    let stale = refused
        .store
        .write(refused.newest, FRESH)
        .await
        .expect("write");
    assert_eq!(
        stale,
        FenceOutcome::Stale { newest: token },
        "the dual holder is stale now"
    );
    let stored = refused.store.read().await.expect("read").expect("a write");
    assert_eq!(
        (stored.token, stored.value.as_slice()),
        (token, &b"new-only"[..])
    );
    guard.release().await.expect("release");
    locks.close().await.expect("close");
}

fn key() -> String {
    format!("fenced/{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_checks_a_migrations_tokens() {
    if act_as_holder_if_asked().await {
        return;
    }
    migration("redis_store_checks_a_migrations_tokens", |sides| {
        Some(StoreSpec::Redis {
            url: sides.redis.clone(),
            key: key(),
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_checks_a_migrations_tokens() {
    if act_as_holder_if_asked().await {
        return;
    }
    migration("etcd_store_checks_a_migrations_tokens", |sides| {
        Some(StoreSpec::Etcd {
            url: sides.etcd.clone(),
            key: key(),
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_checks_a_migrations_tokens() {
    if act_as_holder_if_asked().await {
        return;
    }
    let Some(server) = postgres().await else {
        return;
    };
    migration("postgres_store_checks_a_migrations_tokens", |_| {
        Some(StoreSpec::Postgres {
            url: server.url(),
            table: "fenced".into(),
            row: key(),
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_checks_a_migrations_tokens() {
    if act_as_holder_if_asked().await {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    migration("file_store_checks_a_migrations_tokens", |_| {
        Some(StoreSpec::File {
            path: dir.path().join("resource"),
        })
    })
    .await;
}
