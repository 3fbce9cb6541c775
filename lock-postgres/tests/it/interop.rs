//! distlock beside applications that lock names with `pg_advisory_lock` on the key
//! madelson's DistributedLock derives (`advisory_locks=on`), each application a plain SQL
//! session: they exclude each other both ways, readers share with the application's
//! shared locks, and a distlock holder that hangs with its connection open is ended once
//! its lease runs out. Without the option, the application's locks are not seen.

use std::sync::Arc;
use std::time::Duration;

use lab::chaos::ChaosTarget;
use lock_core::{DistributedLock, DistributedLockExt, RwLock};
use lock_postgres::madelson_key;
use testkit::postgres::{with_ttl, PostgresFactory};
use tokio::time::{sleep, timeout, Instant};

/// A short ASCII name (madelson's `int4` pair key space) and a long one (its hashed
/// `bigint` key), unique to the test: advisory keys are shared by the whole database.
fn names() -> [String; 2] {
    let id = uuid::Uuid::new_v4().simple().to_string();
    [format!("j{}", &id[..8]), format!("reports/{id}/daily")]
}

/// Runs `pg_<function>` on `name`'s madelson key in `session`; its boolean answer (true
/// for the functions that return nothing).
async fn advisory(session: &tokio_postgres::Client, function: &str, name: &str) -> bool {
    let key = madelson_key(name);
    let (args, params) = key.sql_args();
    let sql = format!("SELECT pg_{function}({args})::text");
    let row = session.query_one(&sql, &params).await.expect(&sql);
    row.get::<_, Option<String>>(0).as_deref() != Some("false")
}

async fn factory() -> Option<PostgresFactory> {
    Some(PostgresFactory::shared().await?.with_advisory_locks())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_and_distlock_exclude_each_other() {
    let Some(factory) = factory().await else {
        return;
    };
    let client = factory.typed_client(with_ttl(Duration::from_secs(2))).await;
    for name in names() {
        // The application holds: distlock waits, and gets it once the application lets go.
        let app = factory.admin().await;
        assert!(advisory(&app, "advisory_lock", &name).await);
        assert!(
            client.try_lock(&name).await.expect("try").is_none(),
            "{name}: granted while an application holds the key"
        );
        let waiting = {
            let (client, name) = (Arc::clone(&client), name.clone());
            tokio::spawn(async move { client.lock(&name).await })
        };
        sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "{name}: granted while held");
        let released = Instant::now();
        assert!(advisory(&app, "advisory_unlock", &name).await);
        let guard = timeout(Duration::from_secs(2), waiting)
            .await
            .expect("granted once the application lets go")
            .expect("task")
            .expect("lock");
        println!(
            "{name}: granted {:?} after the application let go",
            released.elapsed()
        );
        // distlock holds: the application is refused, until the release.
        assert!(
            !advisory(&app, "try_advisory_lock", &name).await,
            "{name}: an application took the key of a held name"
        );
        guard.release().await.expect("release");
        assert!(advisory(&app, "try_advisory_lock", &name).await);
        assert!(advisory(&app, "advisory_unlock", &name).await);
    }
    client.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_with_application_readers_and_exclude_writers() {
    let Some(factory) = factory().await else {
        return;
    };
    let client: Arc<dyn DistributedLock> =
        factory.typed_client(with_ttl(Duration::from_secs(2))).await;
    let [_, name] = names();
    let rwlock = RwLock::new(Arc::clone(&client), &name).expect("a read-write lock");
    let app = factory.admin().await;
    let reader = rwlock.read().await.expect("read");
    assert!(
        advisory(&app, "try_advisory_lock_shared", &name).await,
        "an application reader shares"
    );
    assert!(
        !advisory(&app, "try_advisory_lock", &name).await,
        "an application writer waits"
    );
    let second = rwlock
        .try_read()
        .await
        .expect("try read")
        .expect("readers share");
    second.release().await.expect("release");
    // An application reader keeps a distlock writer out.
    reader.release().await.expect("release");
    assert!(rwlock.try_write().await.expect("try write").is_none());
    assert!(advisory(&app, "advisory_unlock_shared", &name).await);
    let writer = rwlock.write().await.expect("write");
    assert!(!advisory(&app, "try_advisory_lock_shared", &name).await);
    writer.release().await.expect("release");
    client.close().await.expect("close");
}

/// A holder whose link goes silent keeps its holding connection open on the server (as
/// a hung process would): once its lease ran out, the next grant ends that connection and
/// takes the name, within the TTL and a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_holder_is_ended_after_its_lease() {
    let Some(factory) = factory().await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let (holder, link) = factory.linked_client(with_ttl(ttl)).await;
    let other = factory.typed_client(with_ttl(ttl)).await;
    let [name, _] = names();
    let guard = holder.lock(&name).await.expect("lock");
    link.cut();
    let cut = Instant::now();
    let next = other
        .lock_timeout(&name, ttl * 2 + Duration::from_secs(3))
        .await
        .expect("granted once the hung holder's lease ran out");
    let waited = cut.elapsed();
    assert!(
        waited >= ttl - Duration::from_millis(200),
        "granted after {waited:?}"
    );
    println!("granted {waited:?} after the holder hung (ttl {ttl:?})");
    let app = factory.admin().await;
    assert!(
        !advisory(&app, "try_advisory_lock", &name).await,
        "the new holder has the key"
    );
    next.release().await.expect("release");
    drop(guard);
    link.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_application_locks_are_not_seen() {
    let Some(factory) = PostgresFactory::shared().await else {
        return;
    };
    let client = factory.typed_client(with_ttl(Duration::from_secs(2))).await;
    let [name, _] = names();
    let app = factory.admin().await;
    assert!(advisory(&app, "advisory_lock", &name).await);
    let guard = client.try_lock(&name).await.expect("try");
    assert!(guard.is_some(), "advisory_locks is off by default");
    assert!(advisory(&app, "advisory_unlock", &name).await);
    client.close().await.expect("close");
}
