//! Digest authentication, creator-only ACLs, a lock directory without write permission,
//! chroot, credentials never printed, and TLS (`zks://`): server authentication alone,
//! mutual TLS on a server that requires client certificates, and every refusal a typed
//! error, told at once.

use std::time::Duration;

use harness::{or_skip, ZkOptions, ZkServer, ZkTls};
use lock_core::{DistributedLockExt, ErrorKind, ReleaseOutcome};
use lock_zookeeper::lock_dir;
use testkit::zookeeper::{
    create_persistent, hand_over, queue, unique_name, with_ttl, ZkFactory, BASE,
};
use tokio::time::Instant;
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
    lock_core::raw::driver::register::<lock_zookeeper::ZkBackend>();
    let port = harness::free_port().expect("free port");
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

/// Everything an error shows: its text and debug form, and those of its sources.
fn all_text(err: &lock_core::Error) -> String {
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    text
}

/// A base64 line of the PEM key file at `path`: key material no output may show.
fn key_material(path: &std::path::Path) -> String {
    let pem = std::fs::read_to_string(path).expect("read the key");
    pem.lines().nth(1).expect("a PEM body line").to_owned()
}

/// `zks://` with a CA, a client certificate and its key locks and releases on a server
/// that requires client certificates; Display and Debug show neither the password nor
/// the key. Each refusal is a non-retryable InvalidConfig told well within the request
/// timeout: a CA that did not sign the server's certificate, no client certificate, a
/// client certificate of another CA. Plain `zk://` to the TLS port, and `zks://` to the
/// plain port, fail with a connection error at the limit rather than hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_mutual_tls_and_its_refusals() {
    lock_core::raw::driver::register::<lock_zookeeper::ZkBackend>();
    let tls = ZkTls::make().await.expect("certificates").client_auth(true);
    let Some(server) = or_skip(ZkServer::start_with(ZkOptions::default().tls(tls.clone())).await)
    else {
        return;
    };
    let secure = server.secure_port().expect("a secure port");
    let other = ZkTls::make().await.expect("another CA");
    let key = key_material(&tls.key_file());
    let files = |ca: &ZkTls, client: Option<&ZkTls>| {
        let mut query = format!("ca_file={}", ca.ca_file().display());
        if let Some(client) = client {
            query.push_str(&format!(
                "&cert_file={}&key_file={}",
                client.cert_file().display(),
                client.key_file().display()
            ));
        }
        query
    };
    let url = |query: &str| format!("zks://app:{PASSWORD}@127.0.0.1:{secure}/tls?ttl=5s&{query}");

    let client = lock_core::connect(&url(&files(&tls, Some(&tls))))
        .await
        .expect("mutual TLS connects");
    let shown = format!("{client} {client:?}");
    assert!(shown.contains("zks://"), "{shown}");
    assert!(
        !shown.contains(PASSWORD) && !shown.contains(&key),
        "{shown}"
    );
    let guard = client.lock("payroll").await.expect("acquire over TLS");
    assert!(guard.fencing_token().get() > 0);
    assert_eq!(
        guard.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    let limit = lock_core::raw::durations::DEFAULT_REQUEST_TIMEOUT;
    for (case, query) in [
        (
            "a CA that did not sign the server",
            files(&other, Some(&tls)),
        ),
        ("no client certificate", files(&tls, None)),
        (
            "a client certificate of another CA",
            files(&tls, Some(&other)),
        ),
    ] {
        let started = Instant::now();
        let err = lock_core::connect(&url(&query)).await.expect_err(case);
        let took = started.elapsed();
        println!("{case}: refused in {took:?}: {err}");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{case}: {err}");
        assert!(!err.is_retryable(), "{case}");
        assert!(err.to_string().contains("TLS"), "{case}: {err}");
        assert!(took < limit / 2, "{case}: took {took:?}");
        let text = all_text(&err);
        assert!(!text.contains(PASSWORD) && !text.contains(&key), "{text}");
    }

    for (case, url) in [
        (
            "plain zk:// to the TLS port",
            format!("zk://127.0.0.1:{secure}/tls?request_timeout=2s"),
        ),
        (
            "zks:// to the plain port",
            format!(
                "zks://127.0.0.1:{}/tls?request_timeout=2s&{}",
                server.port(),
                files(&tls, Some(&tls))
            ),
        ),
    ] {
        let started = Instant::now();
        let err = lock_core::connect(&url).await.expect_err(case);
        let took = started.elapsed();
        println!("{case}: failed in {took:?}: {err}");
        assert_eq!(err.kind(), ErrorKind::Connection, "{case}: {err}");
        assert!(took < Duration::from_secs(4), "{case}: took {took:?}");
    }
}

/// Unreadable or malformed certificate files, and TLS options without TLS, are
/// InvalidConfig naming the option, before anything is sent; never quoting the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_certificate_files_are_checked() {
    lock_core::raw::driver::register::<lock_zookeeper::ZkBackend>();
    let tls = ZkTls::make().await.expect("certificates");
    let other = ZkTls::make().await.expect("another CA");
    let key = key_material(&tls.key_file());
    // Nothing listens: every refusal below comes before a connection.
    let port = harness::free_port().expect("free port");
    let (ca, cert, key_file) = (tls.ca_file(), tls.cert_file(), tls.key_file());
    let (ca, cert, key_file) = (ca.display(), cert.display(), key_file.display());
    let other_key = other.key_file();
    let other_key = other_key.display();
    for (query, option) in [
        (String::new(), "ca_file"),
        ("ca_file=/nonexistent/ca.pem".to_owned(), "ca_file"),
        (format!("ca_file={key_file}"), "ca_file"),
        (format!("ca_file={ca}&cert_file={cert}"), "key_file"),
        (
            format!("ca_file={ca}&cert_file={ca}&key_file={other_key}"),
            "key_file",
        ),
        (
            format!("ca_file={ca}&cert_file={cert}&key_file={ca}"),
            "key_file",
        ),
        (
            format!("ca_file={ca}&cert_file={key_file}&key_file={key_file}"),
            "cert_file",
        ),
        (format!("ca_file={ca}&tls_domain=zk.example"), "tls_domain"),
    ] {
        let url = format!("zks://127.0.0.1:{port}/tls?{query}");
        let err = lock_core::connect(&url).await.expect_err(&url);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        assert!(err.to_string().contains(option), "{url}: {err}");
        let text = all_text(&err);
        assert!(!text.contains(&key), "{text}");
    }
    let url = format!("zk://127.0.0.1:{port}/tls?ca_file={ca}");
    let err = lock_core::connect(&url)
        .await
        .expect_err("ca_file needs zks://");
    assert!(err.to_string().contains("zks://"), "{err}");
}

/// A server that asks for no client certificate: `zks://` with `ca_file` alone locks and
/// releases, also with the server named by a DNS name of its certificate (`localhost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zks_server_authentication_only() {
    lock_core::raw::driver::register::<lock_zookeeper::ZkBackend>();
    let tls = ZkTls::make().await.expect("certificates");
    let Some(server) = or_skip(ZkServer::start_with(ZkOptions::default().tls(tls.clone())).await)
    else {
        return;
    };
    let secure = server.secure_port().expect("a secure port");
    for host in ["127.0.0.1", "localhost"] {
        let url = format!(
            "zks://{host}:{secure}/tls?ca_file={}",
            tls.ca_file().display()
        );
        let client = lock_core::connect(&url).await.expect(&url);
        let guard = client.lock("reports").await.expect("acquire over TLS");
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}
