//! Digest authentication, creator-only ACLs, a lock directory without write permission,
//! chroot, and credentials never printed.

mod common;

use std::time::Duration;

use common::{create_persistent, hand_over, queue, unique_name, with_ttl, ZkFactory, BASE};
use lock_core::{DistributedLockExt, ErrorKind, ReleaseOutcome};
use lock_zookeeper::lock_dir;
use zookeeper_client as zk;

const PASSWORD: &str = "s3cret!pw";

/// Digest credentials from the URL with `acl=creator`: nodes carry the digest identity,
/// other identities can neither delete them nor queue, and the password never prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_with_creator_acl() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let hosts = factory.servers.hosts().join(",");
    let url = format!("zk://app:s3cret%21pw@{hosts}/secure?acl=creator&ttl=5s");
    let client = lock_core::connect(&url).await.expect("connect with digest");
    let shown = format!("{client} {client:?}");
    assert!(!shown.contains(PASSWORD), "password printed: {shown}");

    let guard = client.lock("payroll").await.expect("acquire");
    let admin = factory.admin();
    assert_eq!(
        admin.list_children("/secure/payroll").await,
        Err(zk::Error::NoAuth),
        "the lock directory is readable by its creator only"
    );
    let authed = zk::Client::connector()
        .with_auth("digest", format!("app:{PASSWORD}").as_bytes())
        .connect(&hosts)
        .await
        .expect("authenticated raw client");
    let nodes = authed
        .list_children("/secure/payroll")
        .await
        .expect("the creator identity lists the directory");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = format!("/secure/payroll/{}", nodes[0]);
    let (acls, _) = authed.get_acl(&node).await.expect("read acl");
    assert!(
        acls.iter()
            .all(|acl| acl.scheme() == "digest" && acl.id().starts_with("app:")),
        "creator-only ACL expected: {acls:?}"
    );
    assert_eq!(
        admin.delete(&node, None).await,
        Err(zk::Error::NoAuth),
        "an unauthenticated session must not delete the lock node"
    );

    // The same user from another client is excluded as usual.
    let same_user = lock_core::connect(&url).await.expect("connect");
    assert!(same_user.try_lock("payroll").await.expect("try").is_none());

    // A wrong password is another identity: it cannot queue in the directory.
    let wrong = format!("zk://app:wrong-{PASSWORD}@{hosts}/secure?acl=creator&ttl=5s");
    let intruder = lock_core::connect(&wrong).await.expect("connect");
    let err = intruder
        .try_lock("payroll")
        .await
        .expect_err("no permission to create");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable());
    assert!(!format!("{err} {err:?}").contains(PASSWORD));

    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let next = same_user
        .try_lock("payroll")
        .await
        .expect("try")
        .expect("free after release");
    next.release().await.expect("release");
}

/// A lock directory whose ACL lets anyone create, read and delete its children but not
/// write its data still excludes and hands over: the create that would count its
/// children with a `setData` is refused, and creates are listed instead. The directory's
/// data is never written, and the fencing token is still the node's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_directory_without_write_permission() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let admin = factory.admin();
    let lock = unique_name("no_write");
    let dir = lock_dir(BASE, &lock);
    create_persistent(admin, [BASE.to_owned()]).await;
    let no_write = [zk::Acl::new(
        zk::Permission::READ | zk::Permission::CREATE | zk::Permission::DELETE,
        zk::AuthId::anyone(),
    )];
    admin
        .create(
            &dir,
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&no_write)),
        )
        .await
        .expect("create the lock directory");
    let first = factory.zk_client(with_ttl(Duration::from_secs(10))).await;
    let second = factory.zk_client(with_ttl(Duration::from_secs(10))).await;

    for round in 0..2 {
        let guard = first
            .try_lock(lock.as_str())
            .await
            .expect("try")
            .expect("a free lock");
        let nodes = queue(admin, &lock).await;
        let (_, stat) = admin
            .get_data(&format!("{dir}/{}", nodes[0]))
            .await
            .expect("read lock node");
        assert_eq!(guard.fencing_token().0, stat.czxid as u64, "round {round}");
        assert!(second.try_lock(lock.as_str()).await.expect("try").is_none());
        let next = hand_over(guard, &second, &lock).await;
        next.release().await.expect("release");
    }
    let stat = admin.check_stat(&dir).await.expect("stat").expect("exists");
    assert_eq!(stat.version, 0, "the directory's data was never written");
}

/// With `chroot`, every path is below it; a client without it is a different lock space.
/// A missing chroot gives a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chroot_scopes_every_path() {
    let Some(factory) = ZkFactory::start().await else {
        return;
    };
    let hosts = factory.servers.hosts().join(",");
    let admin = factory.admin();
    admin
        .create(
            "/tenant",
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("create chroot");
    let rooted = lock_core::connect(&format!("zk://{hosts}/locks?chroot=/tenant"))
        .await
        .expect("connect with chroot");
    let plain = lock_core::connect(&format!("zk://{hosts}/locks"))
        .await
        .expect("connect without chroot");
    let guard = rooted.lock("jobs").await.expect("acquire");
    let nodes = admin
        .list_children("/tenant/locks/jobs")
        .await
        .expect("the lock lives below the chroot");
    assert_eq!(nodes.len(), 1);
    assert!(nodes[0].starts_with("_c_") && nodes[0].contains("-lock-"));
    let other = plain
        .try_lock("jobs")
        .await
        .expect("try")
        .expect("outside the chroot it is another lock");
    other.release().await.expect("release");
    guard.release().await.expect("release");

    let missing = lock_core::connect(&format!("zk://{hosts}/locks?chroot=/nowhere"))
        .await
        .expect("connect");
    let err = missing.try_lock("jobs").await.expect_err("missing chroot");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("chroot"), "{err}");
}

/// A failed connect says what failed without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_hide_the_password() {
    lock_core::raw::register::<lock_zookeeper::ZkBackend>();
    let port = conformance::harness::free_port().expect("free port");
    let url = format!("zk://app:{PASSWORD}@127.0.0.1:{port}/x?connect_timeout=1s");
    let started = tokio::time::Instant::now();
    let err = lock_core::connect(&url)
        .await
        .expect_err("nothing listens there");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_retryable());
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(shown.contains(&port.to_string()), "{shown}");
}
