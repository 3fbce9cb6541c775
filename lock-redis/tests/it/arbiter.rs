//! RedLock's waiters are ordered by one server's queue, the arbiter: every client must
//! pick the same server however it addresses them (a proxy, another host name, a mapped
//! port), or each queues on its own and the queue orders nobody.

use std::time::Duration;

use harness::proxy::FaultProxy;
use lock_core::{DistributedLockExt, ReleaseOutcome};
use testkit::redis::{with_ttl, RedisFactory};
use tokio::time::{sleep, timeout};

/// How often a proxy is started until its address sorts after every server's.
const PROXY_TRIES: usize = 200;

/// Two waiters, one reaching the server whose address sorts first through a proxy whose
/// address sorts last (so that the servers' addresses sort differently for it): the one
/// that queued first is granted first, round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_address_the_servers_differently_share_one_queue() {
    let Some(factory) = RedisFactory::redlock(5).await else {
        return;
    };
    let addrs = factory.servers.addrs();
    let first = (0..addrs.len())
        .min_by_key(|&i| addrs[i].to_string())
        .expect("servers");
    let last = addrs
        .iter()
        .map(ToString::to_string)
        .max()
        .expect("servers");
    let mut proxy = None;
    for _ in 0..PROXY_TRIES {
        let candidate = FaultProxy::start(addrs[first]).await.expect("proxy");
        if candidate.addr().to_string() > last {
            proxy = Some(candidate);
            break;
        }
    }
    let proxy = proxy.expect("a proxy port that sorts after every server's");
    let mut via_proxy = addrs.clone();
    via_proxy[first] = proxy.addr();

    let options = with_ttl(Duration::from_secs(30));
    let holder = factory.make(options.clone()).await;
    let direct = factory.make(options.clone()).await;
    let proxied = factory.make_at(&via_proxy, options).await;
    let name = format!("arbiter/{}", uuid::Uuid::new_v4().simple());
    for round in 0..4 {
        let guard = holder.lock(&name).await.expect("acquire");
        let early = {
            let (proxied, name) = (proxied.clone(), name.clone());
            tokio::spawn(async move { proxied.lock_timeout(&name, Duration::from_secs(20)).await })
        };
        sleep(Duration::from_millis(300)).await;
        let late = {
            let (direct, name) = (direct.clone(), name.clone());
            tokio::spawn(async move { direct.lock_timeout(&name, Duration::from_secs(20)).await })
        };
        sleep(Duration::from_millis(300)).await;
        assert_eq!(
            guard.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let winner = timeout(Duration::from_secs(10), early)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the first waiter was not granted"))
            .expect("waiter task")
            .expect("the first waiter's acquire");
        assert!(
            !late.is_finished(),
            "round {round}: the second waiter was granted beside the first"
        );
        assert_eq!(
            winner.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let next = timeout(Duration::from_secs(10), late)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the second waiter was not granted"))
            .expect("waiter task")
            .expect("the second waiter's acquire");
        assert_eq!(
            next.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}
