//! Interoperability with the Go client's `concurrency.Mutex`, as `etcdctl lock NAME`
//! uses it: for a plain name, an `etcdctl lock` holder blocks our acquire and our holder
//! blocks `etcdctl lock`. And with its `concurrency.Election`, as `etcdctl elect NAME`
//! uses it: one leader between distlock and etcdctl, each reading the other's value.
//!
//! The clients here have no key prefix, so lock or election `NAME` (a name without `/`
//! or `%`) is the key range `NAME/`, exactly etcdctl's.

use std::time::Duration;

use std::sync::Arc;

use etcd_client::Client;
use lock_core::{
    AcquireOptions, DistributedLock, DistributedLockExt, Election, ErrorKind, ReleaseOutcome,
    RwLock,
};
use testkit::etcd::{keys_under, plain_client, raw_client, single, EtcdctlElect, EtcdctlLock};
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

/// A second acquisition of one name on our client queues under `<lease hex>_1.kind`: once it
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
    assert_eq!(keys[0].0, format!("{name}/{lease:x}_1.kind"), "{keys:?}");
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

/// The keys under `NAME/` with their create revisions and values, in create order.
async fn candidates(admin: &Client, name: &str) -> Vec<(String, i64, String)> {
    let options = etcd_client::GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let response = admin
        .kv_client()
        .get(format!("{name}/"), Some(options))
        .await
        .expect("range read");
    response
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect()
}

/// `etcdctl elect NAME PROPOSAL` leads: our campaign on NAME waits (a try does not lead),
/// `Election::leader` shows etcdctl's proposal and term; when etcdctl is interrupted it
/// resigns, and our campaign leads promptly with a greater term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_leader_makes_our_campaign_wait() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = plain_name();
    let election = Election::new(ours.clone(), &name).expect("election");

    let mut etcdctl = EtcdctlElect::campaign(server.addr(), &name, "go-proposal");
    let (their_key, their_value) = etcdctl
        .next_leader(Duration::from_secs(10))
        .await
        .expect("etcdctl is elected in a free election");
    assert!(their_key.starts_with(&format!("{name}/")), "{their_key}");
    assert_eq!(their_value, "go-proposal");
    let keys = candidates(&admin, &name).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let their_revision = keys[0].1;

    let leader = election
        .leader()
        .await
        .expect("read")
        .expect("etcdctl leads");
    assert_eq!(leader.value_text(), "go-proposal");
    assert_eq!(
        leader.term.get(),
        u64::try_from(their_revision).expect("positive")
    );
    assert!(
        election
            .campaign_with("distlock", &AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "we led while etcdctl leads"
    );

    let waiting = tokio::spawn({
        let election = election.clone();
        async move {
            let leadership = election
                .campaign_with(
                    "distlock",
                    &AcquireOptions::timeout(Duration::from_secs(20)),
                )
                .await
                .expect("campaign")
                .expect("leads once etcdctl resigns");
            (Instant::now(), leadership)
        }
    });
    sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "our campaign must wait for etcdctl");
    let keys = candidates(&admin, &name).await;
    let lease = ours.backend().lease_id().expect("a live lease");
    assert_eq!(keys.len(), 2, "etcdctl's key and ours: {keys:?}");
    assert_eq!(keys[1].0, format!("{name}/{lease:x}"), "{keys:?}");
    assert_eq!(keys[1].2, "distlock", "our key stores our proposal");
    let leader = election.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.value_text(), "go-proposal", "etcdctl still leads");

    let interrupted_at = Instant::now();
    etcdctl.interrupt().await;
    let (led_at, leadership) = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("our campaign leads promptly after etcdctl resigns")
        .expect("campaign task");
    eprintln!(
        "led {:?} after interrupting etcdctl",
        led_at.saturating_duration_since(interrupted_at)
    );
    assert!(leadership.term().get() > u64::try_from(their_revision).expect("positive"));
    let leader = election.leader().await.expect("read").expect("we lead");
    assert_eq!(
        (leader.value_text().as_str(), leader.term),
        ("distlock", leadership.term())
    );
    let keys = candidates(&admin, &name).await;
    assert_eq!(keys.len(), 1, "only our key is left: {keys:?}");
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    assert!(candidates(&admin, &name).await.is_empty());
}

/// Our leader makes `etcdctl elect NAME P2` wait (it never prints itself elected while we
/// lead); `etcdctl elect -l NAME` shows our value, then our proclaimed value; when we
/// resign, etcdctl is elected, and both sides read it as the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_leader_makes_etcdctl_elect_wait() {
    let Some(server) = single().await else {
        return;
    };
    let admin = raw_client(&[server.addr()]).await;
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = plain_name();
    let election = Election::new(ours.clone(), &name).expect("election");

    let mut leadership = election
        .campaign_with("distlock-leader", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("a free election");
    let lease = ours.backend().lease_id().expect("a live lease");
    let our_key = format!("{name}/{lease:x}");
    let keys = candidates(&admin, &name).await;
    assert_eq!(
        keys,
        vec![(
            our_key.clone(),
            i64::try_from(leadership.term().get()).expect("fits"),
            "distlock-leader".to_owned()
        )],
        "our key is the Go layout's: NAME/<lease hex>, the proposal as its value"
    );

    let mut theirs = EtcdctlElect::campaign(server.addr(), &name, "P2");
    let mut listener = EtcdctlElect::listen(server.addr(), &name);
    assert_eq!(
        listener.next_leader(Duration::from_secs(10)).await,
        Some((our_key.clone(), "distlock-leader".to_owned())),
        "etcdctl elect -l shows our value"
    );
    assert_eq!(
        theirs.next_leader(Duration::from_millis(1500)).await,
        None,
        "etcdctl was elected while we lead"
    );
    assert_eq!(
        candidates(&admin, &name).await.len(),
        2,
        "etcdctl campaigns behind us"
    );

    leadership
        .proclaim("distlock-moved")
        .await
        .expect("proclaim");
    assert_eq!(
        listener.next_leader(Duration::from_secs(5)).await,
        Some((our_key.clone(), "distlock-moved".to_owned())),
        "etcdctl elect -l shows our proclaimed value"
    );
    assert!(leadership.is_leader());
    let our_term = leadership.term();

    let resigned_at = Instant::now();
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    let (their_key, their_value) = theirs
        .next_leader(Duration::from_secs(5))
        .await
        .expect("etcdctl is elected after our resign");
    eprintln!(
        "etcdctl elected {:?} after our resign",
        resigned_at.elapsed()
    );
    assert_eq!(their_value, "P2");
    assert_eq!(
        listener.next_leader(Duration::from_secs(5)).await,
        Some((their_key.clone(), "P2".to_owned())),
        "etcdctl elect -l follows to etcdctl's leader"
    );
    let leader = election
        .leader()
        .await
        .expect("read")
        .expect("etcdctl leads");
    assert_eq!(leader.value_text(), "P2");
    assert!(leader.term > our_term, "terms increase across leaders");
    assert!(
        election
            .campaign_with("distlock-again", &AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "we led while etcdctl leads"
    );
    theirs.interrupt().await;
    listener.interrupt().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !candidates(&admin, &name).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "keys left after etcdctl resigned"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// An `etcdctl elect` leader whose proposal reads like a reader's entry of ours is a
/// candidate like any other: `Election::leader` shows its proposal, our campaign finds a
/// leader (no conflict), and our reader on the name is refused, never held beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_tag_shaped_proposal_is_a_proposal() {
    let Some(server) = single().await else {
        return;
    };
    let ours = Arc::new(plain_client(server.addr()).await);
    let name = plain_name();
    let proposal = format!("read/{}", uuid::Uuid::new_v4());
    let mut etcdctl = EtcdctlElect::campaign(server.addr(), &name, &proposal);
    let (_, their_value) = etcdctl
        .next_leader(Duration::from_secs(10))
        .await
        .expect("etcdctl is elected in a free election");
    assert_eq!(their_value, proposal);

    let election = Election::new(ours.clone(), &name).expect("election");
    let leader = election
        .leader()
        .await
        .expect("read")
        .expect("etcdctl leads");
    assert_eq!(leader.value_text(), proposal);
    let ours_too = election
        .campaign_with("distlock", &AcquireOptions::try_once())
        .await;
    assert!(matches!(ours_too, Ok(None)), "{ours_too:?}");
    let lock: Arc<dyn DistributedLock> = ours.clone();
    let read = RwLock::new(lock, &name)
        .expect("rwlock")
        .read_with(&AcquireOptions::try_once())
        .await
        .map(|held| held.is_some());
    assert!(
        matches!(&read, Err(err) if err.kind() == ErrorKind::Conflict),
        "a reader beside etcdctl's leader: {read:?}"
    );
    etcdctl.interrupt().await;
}
