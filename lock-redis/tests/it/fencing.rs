//! Fencing tokens after partial data loss: a fencing counter restored from an older
//! snapshot (single server and the RedLock node shared by two majorities), or deleted
//! while its lock key survived. Every later token must be above every earlier one, and
//! the fenced resource must turn the stale holder away.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conformance::fence::SectionHandle;
use conformance::FencedResource;
use harness::proxy::{FaultProxy, ProxyMode};
use harness::RedisOptions;
use lock_core::raw::backend::{AcquireRequest, Backend, HoldKind};
use lock_core::raw::driver::Connect;
use lock_core::{DistributedLockExt, LockGuard, LockName, LockOptions, OwnerToken};
use lock_redis::{KeyLayout, RedisBackend, RedisLock, DEFAULT_PREFIX};
use testkit::redis::{config_for, unique_name as name, with_ttl, RedisFactory};

fn options() -> LockOptions {
    let mut options = with_ttl(Duration::from_secs(5));
    options.request_timeout = Duration::from_secs(1);
    options
}

/// `rounds` grants of `name` by `client`, each a full critical section on `resource`;
/// returns their tokens.
async fn grants(
    client: &RedisLock,
    name: &LockName,
    resource: &FencedResource,
    rounds: usize,
) -> Vec<u64> {
    let mut tokens = Vec::new();
    for _ in 0..rounds {
        let guard = client.lock(name.as_str()).await.expect("grant");
        let token = guard.fencing_token();
        assert_eq!(
            resource.increment(token, async {}).await,
            Ok(true),
            "token {token:?} before any fault"
        );
        tokens.push(token.get());
        guard.release().await.expect("release");
    }
    tokens
}

/// After the restore: `next`'s token is above every `earlier` one, its section is
/// accepted, and the victim's open `section` (which read `seen`) can no longer write.
fn next_holder_fences_the_victim(
    next: &LockGuard,
    earlier: &[u64],
    resource: &FencedResource,
    section: SectionHandle,
    seen: u64,
    fault: &str,
) {
    let token = next.fencing_token().get();
    assert!(
        earlier.iter().all(|&t| token > t),
        "token {token} after {fault} is not above the earlier tokens {earlier:?}"
    );
    let after = resource
        .begin(next.fencing_token())
        .expect("the highest token");
    assert!(after.write(after.read() + 1).is_ok());
    after.end();
    assert!(
        section.write(seen + 1).is_err(),
        "the holder {fault} forgot wrote after token {token} was granted"
    );
    section.end();
    let report = resource.check();
    assert!(report.tokens_backwards.is_empty(), "{report:?}");
}

/// A client that reaches every server except those in `cut`, each through its own proxy
/// (kept alive with the client).
async fn reaching_all_but(
    factory: &RedisFactory,
    cut: std::ops::Range<usize>,
) -> (Arc<RedisLock>, Vec<FaultProxy>) {
    let mut proxies = Vec::new();
    for addr in factory.servers.addrs() {
        proxies.push(FaultProxy::start(addr).await.expect("proxy"));
    }
    for proxy in &proxies[cut] {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let addrs: Vec<SocketAddr> = proxies.iter().map(FaultProxy::addr).collect();
    (factory.make_at(&addrs, options()).await, proxies)
}

/// A durable single server (AOF, `appendfsync always`) restored from an older snapshot
/// of its data: the next holder's token is above every token granted before, and the
/// holder the restore forgot cannot write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_restored_from_an_older_snapshot() {
    let Some(factory) = RedisFactory::single_with(RedisOptions::default().persistence(true)).await
    else {
        return;
    };
    let server = factory.servers.member(0);
    let client = factory.make(options()).await;
    let lock = name("single_restore");
    let resource = FencedResource::new();
    let mut earlier = grants(&client, &lock, &resource, 3).await;
    server.save_snapshot().await.expect("snapshot");
    earlier.extend(grants(&client, &lock, &resource, 3).await);
    let victim = client.lock(lock.as_str()).await.expect("victim");
    earlier.push(victim.fencing_token().get());
    let section = resource
        .begin(victim.fencing_token())
        .expect("victim's token is the highest");
    let seen = section.read();

    server.restart_from_snapshot().await.expect("restore");
    let other = factory.make(options()).await;
    let next = other
        .lock_timeout(lock.as_str(), Duration::from_secs(10))
        .await
        .expect("the restored server forgot the victim's key");
    next_holder_fences_the_victim(&next, &earlier, &resource, section, seen, "the restore");
    next.release().await.expect("release");
    let _ = victim.release().await;
    assert!(resource.check().is_safe(), "{:?}", resource.check());
}

/// RedLock over five nodes: the victim's majority is {0, 1, 2}, the next holder's
/// {2, 3, 4}, and node 2, the only one in both, is restored from a snapshot taken before
/// the victim's grants. The next token must still be above the victim's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_node_shared_by_two_majorities_restored_from_an_older_snapshot() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let lock = name("redlock_restore");
    let resource = FencedResource::new();
    let everyone = factory.make(options()).await;
    let mut earlier = grants(&everyone, &lock, &resource, 3).await;
    let shared = factory.servers.member(2);
    shared.save_snapshot().await.expect("snapshot of node 2");

    // The victim's client reaches nodes 0, 1 and 2 only.
    let (victim_client, _victim_links) = reaching_all_but(&factory, 3..5).await;
    earlier.extend(grants(&victim_client, &lock, &resource, 2).await);
    let victim = victim_client.lock(lock.as_str()).await.expect("victim");
    earlier.push(victim.fencing_token().get());
    let section = resource
        .begin(victim.fencing_token())
        .expect("victim's token is the highest");
    let seen = section.read();

    shared
        .restart_from_snapshot()
        .await
        .expect("restore node 2");
    // The next client reaches nodes 2, 3 and 4 only.
    let (other, _other_links) = reaching_all_but(&factory, 0..2).await;
    let next = other
        .lock_timeout(lock.as_str(), Duration::from_secs(10))
        .await
        .expect("nodes 2, 3 and 4 are free");
    next_holder_fences_the_victim(
        &next,
        &earlier,
        &resource,
        section,
        seen,
        "node 2's restore",
    );
    let _ = next.release().await;
    let _ = victim.release().await;
}

/// The fencing counter deleted (evicted) while the lock key survived, then the same
/// attempt reaches the server again (its first reply was lost): the token it gets is
/// above the one issued before, never 0, and the counter is written back so the next
/// holder's token is higher still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_deleted_while_the_lock_key_survived() {
    for redlock in [false, true] {
        let Some(factory) = RedisFactory::single_or_redlock(redlock).await else {
            return;
        };
        let backend = RedisBackend::open(config_for(&factory.servers.addrs(), redlock, options()))
            .await
            .expect("connect");
        let lock = name("counter_deleted");
        let fence_key = KeyLayout::new(DEFAULT_PREFIX).fence_key(&lock);
        let token = OwnerToken::generate();
        let request = AcquireRequest {
            name: &lock,
            token: &token,
            ttl: Duration::from_secs(5),
            wait: false,
            fence_at_least: None,
            kind: &HoldKind::Mutex,
        };
        let first = backend
            .acquire(request)
            .await
            .expect("acquire")
            .expect("a free lock");
        factory.delete_everywhere(&fence_key).await;
        let again = backend
            .acquire(request)
            .await
            .expect("acquire again")
            .expect("the key is this attempt's");
        let (t1, t2) = (first.fencing_token.get(), again.fencing_token.get());
        assert!(
            t2 > t1,
            "redlock {redlock}: the same attempt got token {t2} after {t1} once the counter \
             was deleted"
        );
        backend.release(&again.hold).await.expect("release");
        let next_token = OwnerToken::generate();
        let next = backend
            .acquire(AcquireRequest {
                token: &next_token,
                ..request
            })
            .await
            .expect("acquire")
            .expect("released");
        let t3 = next.fencing_token.get();
        assert!(
            t3 > t2,
            "redlock {redlock}: next holder got {t3} after {t2}"
        );
        backend.release(&next.hold).await.expect("release");
        let mut at_least = 0;
        for mut conn in factory.raw_all().await {
            let stored: Option<u64> = redis::cmd("GET")
                .arg(&fence_key)
                .query_async(&mut conn)
                .await
                .expect("GET counter");
            if stored.is_some_and(|stored| stored >= t3) {
                at_least += 1;
            }
        }
        let servers = factory.servers.addrs().len();
        assert!(
            at_least > servers / 2,
            "redlock {redlock}: only {at_least} of {servers} counters hold token {t3}"
        );
    }
}
