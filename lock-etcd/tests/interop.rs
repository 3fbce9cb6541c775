//! Interoperability with the Go client's `concurrency.Mutex`, as `etcdctl lock NAME`
//! uses it: for a plain name, an `etcdctl lock` holder blocks our acquire and our holder
//! blocks `etcdctl lock`.

mod common;

use std::time::Duration;

use common::{keys_under, plain_client, raw_client, single, EtcdctlLock};
use lock_core::{DistributedLockExt, ErrorKind, ReleaseOutcome};
use tokio::time::{sleep, timeout, Instant};

fn plain_name() -> String {
    format!("interop-{}", uuid::Uuid::new_v4().simple())
}

/// An `etcdctl lock` holder blocks our acquire; when it lets go, our waiter gets the
/// lock promptly with a higher fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_holder_blocks_our_acquire() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours = plain_client(server.addr()).await;
    let name = plain_name();

    let mut etcdctl = EtcdctlLock::spawn(server.addr(), &name);
    let their_key = etcdctl
        .held_key(Duration::from_secs(10))
        .await
        .expect("etcdctl acquires a free lock");
    assert!(
        their_key.starts_with(&format!("{name}/")),
        "etcdctl key {their_key}"
    );
    let keys = keys_under(&admin, &format!("{name}/")).await;
    let their_revision = keys
        .iter()
        .find(|(key, _)| *key == their_key)
        .map(|(_, revision)| *revision)
        .expect("etcdctl's key is in our lock's range");

    assert!(
        ours.try_lock(&name).await.expect("try").is_none(),
        "we acquired a lock etcdctl holds"
    );
    let err = ours
        .lock_timeout(&name, Duration::from_millis(800))
        .await
        .expect_err("etcdctl still holds the lock");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");

    let waiter = tokio::spawn(async move {
        let guard = ours
            .lock_timeout(&name, Duration::from_secs(20))
            .await
            .expect("acquire after etcdctl lets go");
        (Instant::now(), guard)
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "our waiter must wait for etcdctl");
    let interrupted_at = Instant::now();
    etcdctl.interrupt().await;
    let (acquired_at, guard) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("our waiter takes over promptly")
        .expect("waiter task");
    eprintln!(
        "took over {:?} after interrupting etcdctl",
        acquired_at - interrupted_at
    );
    assert!(guard.fencing_token().get() > u64::try_from(their_revision).expect("positive"));
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Our holder blocks `etcdctl lock`: it prints nothing while we hold the lock and gets
/// it once we release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_holder_blocks_etcdctl() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours = plain_client(server.addr()).await;
    let name = plain_name();

    let guard = ours.lock(&name).await.expect("acquire");
    let mut etcdctl = EtcdctlLock::spawn(server.addr(), &name);
    assert_eq!(
        etcdctl.held_key(Duration::from_millis(1500)).await,
        None,
        "etcdctl acquired a lock we hold"
    );
    // etcdctl is queued behind us, in our lock's range.
    let keys = keys_under(&admin, &format!("{name}/")).await;
    assert_eq!(keys.len(), 2, "our key and etcdctl's: {keys:?}");

    let released_at = Instant::now();
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let key = etcdctl
        .held_key(Duration::from_secs(5))
        .await
        .expect("etcdctl gets the lock after our release");
    eprintln!(
        "etcdctl took over {:?} after our release",
        released_at.elapsed()
    );
    assert!(key.starts_with(&format!("{name}/")));
    assert!(
        ours.try_lock(&name).await.expect("try").is_none(),
        "etcdctl holds it now"
    );
    etcdctl.interrupt().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !keys_under(&admin, &format!("{name}/")).await.is_empty() {
        assert!(Instant::now() < deadline, "keys left after etcdctl exited");
        sleep(Duration::from_millis(50)).await;
    }
}

/// A second acquisition of one name on our client queues under `<lease hex>_1`: once it
/// holds the lock, that key blocks `etcdctl lock` as the plain key does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_second_local_holder_blocks_etcdctl() {
    let Some(server) = single().await else {
        return;
    };
    let ours = std::sync::Arc::new(plain_client(server.addr()).await);
    let admin = raw_client(&[server.addr()]).await;
    let name = plain_name();

    let first = ours.lock(&name).await.expect("acquire");
    let second = tokio::spawn({
        let (ours, name) = (std::sync::Arc::clone(&ours), name.clone());
        async move { ours.lock(&name).await.expect("second local acquire") }
    });
    sleep(Duration::from_millis(300)).await;
    let mut etcdctl = EtcdctlLock::spawn(server.addr(), &name);
    sleep(Duration::from_millis(300)).await;
    first.release().await.expect("release");
    let second = timeout(Duration::from_secs(5), second)
        .await
        .expect("our second acquisition is next in line")
        .expect("waiter task");
    let lease = ours.backend().lease_id().expect("a live lease");
    let keys = keys_under(&admin, &format!("{name}/")).await;
    assert_eq!(keys.len(), 2, "our second key and etcdctl's: {keys:?}");
    assert_eq!(keys[0].0, format!("{name}/{lease:x}_1"), "{keys:?}");
    second
        .extend()
        .await
        .expect("the renewal check finds the `_1` key");
    assert!(second.is_held());
    assert_eq!(
        etcdctl.held_key(Duration::from_millis(1500)).await,
        None,
        "etcdctl acquired a lock our second acquisition holds: {keys:?}"
    );
    assert_eq!(
        second.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let key = etcdctl
        .held_key(Duration::from_secs(5))
        .await
        .expect("etcdctl gets the lock after our release");
    assert!(key.starts_with(&format!("{name}/")));
    etcdctl.interrupt().await;
}
