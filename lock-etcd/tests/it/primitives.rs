//! Semaphores and read-write locks on etcd beyond the conformance rules: the key layout
//! the README documents (one `.kind` key per acquisition, the kind and owner token in its
//! value, as `etcdctl get` shows it), a disagreement on permits refused with no key left,
//! a writer queued behind readers not overtaken by later readers, a downgrade that keeps
//! the writer's key and wakes the readers behind it at once, an entry of the earlier
//! layout never held beside, and a leftover key of another kind cleared.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions};
use harness::EtcdServer;
use lock_core::raw::backend::HoldKind;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, ErrorKind, LockName, ReadGuard, RwLock,
    Semaphore, WriteGuard,
};
use lock_etcd::EtcdLock;
use testkit::etcd::{client, go_key, keys_under, raw_client, single, with_ttl, PREFIX};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// A plain name (no `/` or `%`: its range is `<PREFIX>/<name>/`, as etcdctl spells it).
fn plain_name(what: &str) -> String {
    format!("{what}-{}", uuid::Uuid::new_v4().simple())
}

/// A client whose waiters re-check only every 30 s: only a push makes them act promptly.
async fn pushed_client(addr: SocketAddr) -> Arc<dyn DistributedLock> {
    let mut options = with_ttl(Duration::from_secs(10));
    options.recheck = Duration::from_secs(30);
    let lock: Arc<EtcdLock> = client(&[addr], options).await;
    lock
}

/// The keys under `range` with their values and create revisions, in create order.
async fn entries(admin: &Client, range: &str) -> Vec<(String, String, i64)> {
    let mut kv = admin.kv_client();
    let options = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let response = kv.get(range, Some(options)).await.expect("range read");
    response
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
            )
        })
        .collect()
}

/// Waits (at most 10 s) until `range` holds `n` keys.
async fn until_keys(admin: &Client, range: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let keys = keys_under(admin, range).await;
        if keys.len() == n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} keys expected: {keys:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

const SOON: Duration = Duration::from_secs(3);

/// What the acquire running in `task` got, which a push must bring within [`SOON`].
async fn pushed<T>(task: JoinHandle<lock_core::Result<Option<T>>>, what: &str) -> T {
    timeout(SOON, task)
        .await
        .unwrap_or_else(|_| panic!("{what} is pushed"))
        .expect("task")
        .expect("acquire")
        .expect("held")
}

/// Three clients (see [`pushed_client`]) of a fresh server, one name, and the name's
/// read-write lock on each client.
struct Scene {
    /// Keeps the server running.
    _server: EtcdServer,
    admin: Client,
    name: String,
    /// The name's key range.
    range: String,
    clients: Vec<Arc<dyn DistributedLock>>,
    locks: Vec<RwLock>,
}

impl Scene {
    /// The scene for a name made of `what`; `None` without etcd.
    async fn start(what: &str) -> Option<Self> {
        let server = single().await?;
        let admin = raw_client(&[server.addr()]).await;
        let name = plain_name(what);
        let (mut clients, mut locks) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let lock = pushed_client(server.addr()).await;
            locks.push(RwLock::new(Arc::clone(&lock), &name).expect("rwlock"));
            clients.push(lock);
        }
        Some(Scene {
            _server: server,
            admin,
            range: format!("{PREFIX}/{name}/"),
            name,
            clients,
            locks,
        })
    }

    /// The semaphore of `permits` of the name on client `i`.
    fn semaphore(&self, i: usize, permits: u32) -> Semaphore {
        Semaphore::new(Arc::clone(&self.clients[i]), &self.name, permits).expect("semaphore")
    }

    /// Client `i` waits for the write side in a task of its own.
    fn spawn_write(&self, i: usize) -> JoinHandle<lock_core::Result<Option<WriteGuard>>> {
        let lock = self.locks[i].clone();
        tokio::spawn(async move { lock.write_with(&AcquireOptions::forever()).await })
    }

    /// Client `i` waits for the read side in a task of its own.
    fn spawn_read(&self, i: usize) -> JoinHandle<lock_core::Result<Option<ReadGuard>>> {
        let lock = self.locks[i].clone();
        tokio::spawn(async move { lock.read_with(&AcquireOptions::forever()).await })
    }

    /// Waits until the range holds `n` keys.
    async fn until_keys(&self, n: usize) {
        until_keys(&self.admin, &self.range, n).await;
    }
}

/// Two permits of one client and a third waiting from another: one key each under the
/// name's range, `<lease hex>.kind` and `<lease hex>_1.kind` for the one client, each on its lease,
/// valued `permit/2/<owner token>`, their create revisions the fencing tokens; the
/// inspection shows both holders (the second as a co-holder) and the waiter, with
/// their kinds, and the waiter takes over when a permit is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_keys_are_the_documented_layout() {
    let Some(scene) = Scene::start("sem").await else {
        return;
    };
    let (admin, range) = (&scene.admin, scene.range.as_str());
    let (sem_a, sem_b) = (scene.semaphore(0, 2), scene.semaphore(1, 2));
    let forever = AcquireOptions::forever();
    let first = sem_a
        .acquire_with(&forever)
        .await
        .expect("first")
        .expect("held");
    let second = sem_a
        .acquire_with(&forever)
        .await
        .expect("second")
        .expect("held");
    assert!(sem_b
        .acquire_with(&AcquireOptions::try_once())
        .await
        .expect("try")
        .is_none());
    until_keys(admin, range, 2).await;
    let waiter = tokio::spawn(async move { sem_b.acquire_with(&AcquireOptions::forever()).await });
    until_keys(admin, range, 3).await;

    let keys = entries(admin, range).await;
    let leaf = keys[0].0.rsplit('/').next().expect("a leaf");
    let lease = leaf
        .strip_suffix(".kind")
        .expect("a key that says its kind");
    assert_eq!(keys[1].0, format!("{range}{lease}_1.kind"), "{keys:?}");
    for (guard, (key, value, created)) in [&first, &second].into_iter().zip(&keys) {
        assert_eq!(*value, format!("permit/2/{}", guard.owner_token()), "{key}");
        assert_eq!(
            guard.fencing_token().get(),
            u64::try_from(*created).expect("rev")
        );
    }
    assert!(keys[2].1.starts_with("permit/2/"), "{keys:?}");

    let shown = sem_a.occupancy().await.expect("inspect");
    let holders: Vec<_> = shown.holders().collect();
    assert_eq!(holders.len(), 2, "{shown:?}");
    assert_eq!(shown.co_holders.len(), 1, "{shown:?}");
    assert_eq!(shown.waiters.len(), 1, "{shown:?}");
    for participant in shown.participants() {
        assert_eq!(participant.kind, Some(HoldKind::permit(2)));
        assert_eq!(participant.value, None, "no proposal for a permit");
    }
    assert_eq!(
        holders[1].owner_token.as_deref(),
        Some(second.owner_token().as_str())
    );
    let floor = shown.token_floor.expect("a floor");

    let started = Instant::now();
    first.release().await.expect("release");
    let third = pushed(waiter, "the waiter").await;
    assert!(started.elapsed() < SOON);
    assert!(third.fencing_token() > floor);
    second.release().await.expect("release");
    third.release().await.expect("release");
    until_keys(admin, range, 0).await;
}

/// A semaphore of 3 on a name that holds a semaphore of 2 is refused with a typed
/// conflict, waiting or not, and leaves no key behind; the permits in place are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_disagreement_is_refused() {
    let Some(scene) = Scene::start("disagree").await else {
        return;
    };
    let (two, three) = (scene.semaphore(0, 2), scene.semaphore(1, 3));
    let held = two
        .acquire_with(&AcquireOptions::forever())
        .await
        .expect("acquire")
        .expect("held");
    for options in [AcquireOptions::try_once(), AcquireOptions::forever()] {
        let err = timeout(SOON, three.acquire_with(&options))
            .await
            .expect("refused at once")
            .expect_err("a disagreement on permits");
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert!(err.to_string().contains("2 permits"), "{err}");
    }
    scene.until_keys(1).await;
    assert!(held.is_held());
    held.release().await.expect("release");
}

/// A writer queued behind a reader is not overtaken by a later reader (try or waiting):
/// the writer holds when the first reader leaves, the later reader only after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_behind_readers_is_not_starved() {
    let Some(scene) = Scene::start("rw").await else {
        return;
    };
    let locks = &scene.locks;
    let forever = AcquireOptions::forever();
    let reader = locks[0]
        .read_with(&forever)
        .await
        .expect("read")
        .expect("held");
    let also = locks[0]
        .read_with(&forever)
        .await
        .expect("read")
        .expect("shared");
    let writer = scene.spawn_write(1);
    scene.until_keys(3).await;
    assert!(
        locks[2]
            .read_with(&AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a reader overtook a queued writer"
    );
    let late = scene.spawn_read(2);
    scene.until_keys(4).await;
    sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished() && !late.is_finished());

    reader.release().await.expect("release");
    also.release().await.expect("release");
    let writer = pushed(writer, "the writer").await;
    sleep(Duration::from_millis(300)).await;
    assert!(!late.is_finished(), "a reader beside a writer");
    writer.release().await.expect("release");
    let late = pushed(late, "the reader").await;
    late.release().await.expect("release");
}

/// A writer downgrades with a reader and a writer queued behind it: its key stays (same
/// create revision, same lease), its value turns `read/<token>`, the reader holds at
/// once beside it (pushed, not at the re-check), the writer behind waits for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_keeps_the_place_and_wakes_readers() {
    let Some(scene) = Scene::start("downgrade").await else {
        return;
    };
    let (locks, admin, range) = (&scene.locks, &scene.admin, scene.range.as_str());
    let first = locks[0]
        .write_with(&AcquireOptions::forever())
        .await
        .expect("write")
        .expect("held");
    let token = first.fencing_token();
    let reader = scene.spawn_read(1);
    scene.until_keys(2).await;
    let writer = scene.spawn_write(2);
    scene.until_keys(3).await;
    let before = entries(admin, range).await;
    assert!(before[0].1.starts_with("write/"), "{before:?}");

    let started = Instant::now();
    let first = first.downgrade().await.expect("downgrade");
    let reader = pushed(reader, "the reader by the downgrade").await;
    assert!(started.elapsed() < SOON);
    assert!(first.is_held());
    assert_eq!(first.fencing_token(), token);
    let after = entries(admin, range).await;
    assert_eq!(after[0].0, before[0].0, "same key");
    assert_eq!(after[0].2, before[0].2, "same create revision");
    assert_eq!(after[0].1, format!("read/{}", first.owner_token()));

    let shown = locks[0].occupancy().await.expect("inspect");
    assert_eq!(shown.holders().count(), 2, "{shown:?}");
    assert_eq!(shown.waiters.len(), 1, "{shown:?}");
    assert_eq!(shown.waiters[0].kind, Some(HoldKind::Write));

    sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "a writer beside readers");
    first.release().await.expect("release");
    sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "a writer beside a reader");
    reader.release().await.expect("release");
    let writer = pushed(writer, "the writer").await;
    writer.release().await.expect("release");
}

/// What `etcdctl get --prefix RANGE` prints: each key, then its value, on lines of their own.
async fn etcdctl_get(addr: SocketAddr, range: &str) -> Vec<(String, String)> {
    let output = timeout(
        Duration::from_secs(10),
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://{addr}"))
            .args(["get", "--prefix", range])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("etcdctl answers in time")
    .expect("etcdctl (Debian etcd-client) is needed for this test");
    assert!(output.status.success(), "etcdctl get: {output:?}");
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|pair| {
            (
                pair[0].to_owned(),
                pair.get(1).copied().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// `etcdctl get --prefix` shows what the README says: one key per acquisition under
/// `<prefix>/<name>/`, the lease in hex (then `_<n>` for a second acquisition of one
/// client) then `.kind`, valued with the kind and the owner token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_sees_the_documented_keys() {
    let Some(server) = single().await else {
        return;
    };
    let ours: Arc<EtcdLock> = client(&[server.addr()], with_ttl(Duration::from_secs(10))).await;
    let lock: Arc<dyn DistributedLock> = ours.clone();
    let name = plain_name("etcdctl");
    let rw = RwLock::new(Arc::clone(&lock), &name).expect("rwlock");
    let sem_name = plain_name("etcdctl-sem");
    let sem = Semaphore::new(lock, &sem_name, 3).expect("semaphore");
    let forever = AcquireOptions::forever();
    let reader = rw.read_with(&forever).await.expect("read").expect("held");
    let writer_rw = rw.clone();
    let writer =
        tokio::spawn(async move { writer_rw.write_with(&AcquireOptions::forever()).await });
    let permit = sem
        .acquire_with(&forever)
        .await
        .expect("permit")
        .expect("held");
    let lease = format!("{:x}", ours.backend().lease_id().expect("a lease"));
    let range = format!("{PREFIX}/{name}/");
    let deadline = Instant::now() + Duration::from_secs(10);
    let shown = loop {
        let shown = etcdctl_get(server.addr(), &range).await;
        if shown.len() == 2 || Instant::now() > deadline {
            break shown;
        }
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        shown,
        vec![
            (
                format!("{range}{lease}.kind"),
                format!("read/{}", reader.owner_token())
            ),
            (format!("{range}{lease}_1.kind"), shown[1].1.clone()),
        ]
    );
    assert!(shown[1].1.starts_with("write/"), "{shown:?}");
    let sem_range = format!("{PREFIX}/{sem_name}/");
    assert_eq!(
        etcdctl_get(server.addr(), &sem_range).await,
        vec![(
            format!("{sem_range}{lease}.kind"),
            format!("permit/3/{}", permit.owner_token())
        )]
    );
    reader.release().await.expect("release");
    let writer = pushed(writer, "the writer").await;
    writer.release().await.expect("release");
    permit.release().await.expect("release");
    let name = LockName::new(name).expect("name");
    assert!(ours.inspect(&name).await.expect("inspect").holder.is_none());
}

/// A reader's entry as earlier versions put it (the tag in the value of a plain key, here
/// on a lease nobody keeps alive) reads as a mutex's: a reader, a writer and a permit are
/// refused with a conflict, none held beside it; a mutex waits behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_layout_entry_is_never_held_beside() {
    let Some(scene) = Scene::start("earlier").await else {
        return;
    };
    let old = go_key(&scene.admin, &scene.range, 30).await;
    let value = format!("read/{}", uuid::Uuid::new_v4());
    scene
        .admin
        .kv_client()
        .put(
            old.key.as_str(),
            value.as_str(),
            Some(PutOptions::new().with_lease(old.lease)),
        )
        .await
        .expect("rewrite as an earlier reader's entry");
    let once = AcquireOptions::try_once();
    let tries = [
        (
            "a reader",
            scene.locks[0]
                .read_with(&once)
                .await
                .map(|held| held.is_some()),
        ),
        (
            "a writer",
            scene.locks[1]
                .write_with(&once)
                .await
                .map(|held| held.is_some()),
        ),
        (
            "a permit",
            scene
                .semaphore(2, 2)
                .acquire_with(&once)
                .await
                .map(|held| held.is_some()),
        ),
    ];
    for (what, tried) in tries {
        assert!(
            matches!(&tried, Err(err) if err.kind() == ErrorKind::Conflict),
            "{what} beside an earlier reader: {tried:?}"
        );
    }
    let mutex = scene.clients[0].try_lock(&scene.name).await.expect("try");
    assert!(mutex.is_none(), "a mutex beside an earlier reader");
    scene.until_keys(1).await;
}

/// A leftover key of this client in the other form of a slot (a candidate's plain key left
/// behind, here put by hand on the client's lease) is deleted by the next acquisition of
/// that slot as a reader, which is then granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_of_another_kind_is_cleared() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours: Arc<EtcdLock> = client(&[server.addr()], with_ttl(Duration::from_secs(10))).await;
    let name = plain_name("leftover");
    let range = format!("{PREFIX}/{name}/");
    let lock: Arc<dyn DistributedLock> = ours.clone();
    let rw = RwLock::new(lock, &name).expect("rwlock");
    // The session's lease, taken by a first hold.
    rw.read_with(&AcquireOptions::try_once())
        .await
        .expect("read")
        .expect("held")
        .release()
        .await
        .expect("release");
    let lease = ours.backend().lease_id().expect("a live lease");
    admin
        .kv_client()
        .put(
            format!("{range}{lease:x}"),
            uuid::Uuid::new_v4().to_string(),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("a leftover candidate's key");
    let reader = rw
        .read_with(&AcquireOptions::try_once())
        .await
        .expect("read")
        .expect("held: the leftover is gone");
    let keys = entries(&admin, &range).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].0, format!("{range}{lease:x}.kind"));
    reader.release().await.expect("release");
}
