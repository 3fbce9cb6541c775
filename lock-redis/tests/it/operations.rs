//! Operator calls seen from behind the library: what a listing shows of the key space
//! (side keys never; escaped and glob-special names exactly, under a glob-special key
//! prefix), breaking a foreign `SET NX` hold, the break mark's size and expiry, a waiter
//! with a long recheck woken by a break at once with and without the queue, a broken
//! holder's release next to its successor, renewal that reads no mark while its keys are
//! its own, and typed errors for a break that cannot be done.

use std::sync::Arc;
use std::time::Duration;

use conformance::connect_patiently;
use lock_core::{
    DistributedLock, DistributedLockExt, ErrorKind, LockName, LostReason, ReleaseOutcome,
};
use lock_redis::{KeyLayout, DEFAULT_PREFIX};
use redis::aio::MultiplexedConnection;
use testkit::redis::{command_calls, raw, RedisFactory};
use tokio::time::{sleep, timeout, Instant};

/// A key prefix made of glob metacharacters (`ops*?[1]\:`), percent-encoded for a URL.
const GLOB_PREFIX: &str = "ops*?[1]\\:";
const GLOB_PREFIX_QUERY: &str = "prefix=ops%2A%3F%5B1%5D%5C%3A";

/// Longest a pushed wake-up may take (the waiters' recheck is a minute).
const PUSHED: Duration = Duration::from_secs(1);

/// A client of `factory`'s servers opened from its URL with `query`.
async fn connect(factory: &RedisFactory, query: &str) -> Arc<dyn DistributedLock> {
    let url = format!("{}?{query}", factory.servers.url());
    connect_patiently("connect", || lock_core::connect(&url)).await
}

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

fn names(texts: &[&str]) -> Vec<LockName> {
    texts.iter().map(|t| name(t)).collect()
}

/// Every key of the server.
async fn all_keys(conn: &mut MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// Takes `key` as a plain `SET key value NX PX 30000` client does; whether it got it.
async fn foreign_hold(conn: &mut MultiplexedConnection, key: &str, value: &str) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .expect("SET NX");
    set.is_some()
}

/// The owner tokens in `name`'s break mark and the mark's PTTL.
async fn mark_of(conn: &mut MultiplexedConnection, name: &LockName) -> (Vec<String>, i64) {
    let mark = KeyLayout::new(DEFAULT_PREFIX).broken_key(name);
    let tokens: Vec<String> = redis::cmd("LRANGE")
        .arg(&mark)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("LRANGE");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&mark)
        .query_async(conn)
        .await
        .expect("PTTL");
    (tokens, pttl)
}

/// A listing names exactly the held names under the prefix, on a server full of what
/// else the layout writes: fencing counters, queues, a break mark, a key of another type,
/// another client's keys (whose prefix the glob-special one would match unescaped).
/// Names with `%`, `{`, `}`, `*`, `?`, `[`, `]` and `\` list as themselves, also with
/// those characters in the listed prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_shows_exactly_the_held_names() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let ops = connect(&factory, &format!("{GLOB_PREFIX_QUERY}&recheck=60s")).await;
    // `ops*?[1]\:` as a glob (unescaped) matches this prefix.
    let neighbour = connect(&factory, "prefix=opsXY1%3A").await;
    let held = [
        "jobs/a%b",
        "jobs/{tag}",
        "jobs/x*y",
        "jobs/q?",
        "jobs/br[ack]et",
        "jobs/back\\slash",
        "jobs/plain",
    ];
    let mut guards = Vec::new();
    for text in held {
        guards.push(ops.lock(text).await.expect("acquire"));
    }
    guards.push(neighbour.lock("jobs/plain").await.expect("acquire"));
    // A waiter (queue keys), a released name (a fencing counter alone), a broken one (a
    // fencing counter and a break mark).
    let waiting = {
        let ops = Arc::clone(&ops);
        tokio::spawn(async move {
            ops.lock_timeout("jobs/plain", Duration::from_secs(30))
                .await
        })
    };
    ops.lock("jobs/released")
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let broken = ops.lock("jobs/broken").await.expect("acquire");
    ops.force_release(&name("jobs/broken"))
        .await
        .expect("break")
        .expect("held");
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let _: i64 = redis::cmd("HSET")
        .arg(format!("{GLOB_PREFIX}jobs/hash"))
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let keys = all_keys(&mut conn).await;
        let present = ["}:fence", "}:q", "}:qlive", "}:broken"]
            .iter()
            .all(|suffix| keys.iter().any(|k| k.ends_with(suffix)));
        if present {
            break;
        }
        assert!(Instant::now() < deadline, "side keys missing: {keys:?}");
        sleep(Duration::from_millis(20)).await;
    }

    let mut sorted = held.to_vec();
    sorted.sort_unstable();
    assert_eq!(ops.list("").await.expect("list"), names(&sorted));
    assert_eq!(ops.list("jobs/").await.expect("list"), names(&sorted));
    let exact = [
        ("jobs/b", &["jobs/back\\slash", "jobs/br[ack]et"][..]),
        ("jobs/br[", &["jobs/br[ack]et"]),
        ("jobs/back\\", &["jobs/back\\slash"]),
        ("jobs/x*", &["jobs/x*y"]),
        ("jobs/q?", &["jobs/q?"]),
        ("jobs/{", &["jobs/{tag}"]),
        ("jobs/a%", &["jobs/a%b"]),
        ("jobs/a%6", &[]),
        ("jobs/*", &[]),
        ("jobs/plain", &["jobs/plain"]),
        ("jobs/plainer", &[]),
    ];
    for (prefix, expected) in exact {
        assert_eq!(
            ops.list(prefix).await.expect("list"),
            names(expected),
            "list {prefix:?}"
        );
    }
    assert_eq!(
        neighbour.list("").await.expect("list"),
        names(&["jobs/plain"])
    );

    for guard in guards {
        guard.release().await.expect("release");
    }
    let granted = waiting
        .await
        .expect("waiter task")
        .expect("the waiter gets the lock");
    assert_eq!(ops.list("").await.expect("list"), names(&["jobs/plain"]));
    granted.release().await.expect("release");
    drop(broken);
    assert_eq!(ops.list("").await.expect("list"), Vec::<LockName>::new());
}

/// A foreign plain `SET NX` hold is broken like one of ours: the break returns its value
/// and lease, deletes it, and a waiter gets the lock at once. The mark keeps the removed
/// values (the last 8) for three times the removed lease, or a minute when that is more
/// (a key without expiry); breaking a free name changes nothing. With an empty key
/// prefix, another library's hold lists and breaks under its plain name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaking_a_foreign_hold_and_the_mark_it_leaves() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let lock = name("foreign/held");
    let key = KeyLayout::new(DEFAULT_PREFIX).lock_key(&lock);
    let mut conn = raw(factory.servers.addrs()[0]).await;
    assert!(foreign_hold(&mut conn, &key, "their-token").await);
    let operator = connect(&factory, "ttl=5s").await;
    let waiter = connect(&factory, "ttl=5s&recheck=60s").await;
    let waiting = {
        let waiter = Arc::clone(&waiter);
        tokio::spawn(async move {
            waiter
                .lock_timeout("foreign/held", Duration::from_secs(20))
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while operator
        .inspect(&lock)
        .await
        .expect("inspect")
        .waiters
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the waiter never queued");
        sleep(Duration::from_millis(20)).await;
    }

    let broke_at = Instant::now();
    let removed = operator
        .force_release(&lock)
        .await
        .expect("break")
        .expect("the foreign holder is returned");
    assert_eq!(removed.owner_token.as_deref(), Some("their-token"));
    let left = removed.lease_left.expect("the foreign key had a TTL");
    assert!(
        left > Duration::from_secs(25) && left <= Duration::from_secs(30),
        "{left:?}"
    );
    let granted = timeout(PUSHED, waiting)
        .await
        .expect("the break wakes the waiter at once")
        .expect("waiter task")
        .expect("the waiter gets the lock");
    println!("waiter granted {:?} after the break", broke_at.elapsed());
    let (tokens, pttl) = mark_of(&mut conn, &lock).await;
    assert_eq!(tokens, ["their-token"]);
    let thrice = i64::try_from(3 * left.as_millis()).expect("ms");
    assert!(
        (thrice - 5_000..=thrice + 3).contains(&pttl),
        "mark PTTL {pttl} ms, not 3 x the removed {left:?}"
    );
    granted.release().await.expect("release");

    // Without expiry: the mark stays a minute (the operator's TTL is 5 s).
    for i in 0..10 {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(format!("forever-{i}"))
            .query_async(&mut conn)
            .await
            .expect("SET");
        let removed = operator
            .force_release(&lock)
            .await
            .expect("break")
            .expect("held");
        assert_eq!(removed.lease_left, None, "a key without expiry");
    }
    let (tokens, pttl) = mark_of(&mut conn, &lock).await;
    let last: Vec<String> = (2..10).map(|i| format!("forever-{i}")).collect();
    assert_eq!(tokens, last, "the mark keeps the last 8");
    assert!(
        (55_000..=60_000).contains(&pttl),
        "mark PTTL {pttl} ms, not a minute"
    );

    assert!(operator
        .force_release(&lock)
        .await
        .expect("break a free name")
        .is_none());
    assert_eq!(
        mark_of(&mut conn, &lock).await.0,
        last,
        "a free name is left alone"
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0);

    // With an empty key prefix the lock key is the plain name, as other libraries write
    // it: their holds list and break by name.
    assert!(foreign_hold(&mut conn, "nightly/backup", "redis-py-token").await);
    let plain = connect(&factory, "prefix=").await;
    assert_eq!(
        plain.list("nightly/").await.expect("list"),
        names(&["nightly/backup"])
    );
    let removed = plain
        .force_release(&name("nightly/backup"))
        .await
        .expect("break")
        .expect("held");
    assert_eq!(removed.owner_token.as_deref(), Some("redis-py-token"));
    assert_eq!(plain.list("").await.expect("list"), Vec::<LockName>::new());
}

/// With and without the queue, on one server and on RedLock: a waiter whose recheck is a
/// minute, behind a holder whose TTL is 30 s, gets the lock at once when the holder is
/// broken; the broken holder's release then says `Broken` and leaves its successor alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_wakes_the_waiter_at_once_with_and_without_the_queue() {
    for redlock in [false, true] {
        let Some(factory) = RedisFactory::single_or_redlock(redlock).await else {
            return;
        };
        for queue in ["on", "off"] {
            let holder = connect(&factory, &format!("queue={queue}&ttl=30s")).await;
            let waiter = connect(&factory, &format!("queue={queue}&ttl=30s&recheck=60s")).await;
            let operator = connect(&factory, &format!("queue={queue}")).await;
            let text = format!("wake/{queue}");
            let lock = name(&text);
            let guard = holder.lock(&text).await.expect("acquire");
            let waiting = {
                let (waiter, text) = (Arc::clone(&waiter), text.clone());
                tokio::spawn(
                    async move { waiter.lock_timeout(&text, Duration::from_secs(30)).await },
                )
            };
            // Let the waiter queue or subscribe and settle into its long nap.
            sleep(Duration::from_millis(500)).await;
            assert!(!waiting.is_finished());

            let broke_at = Instant::now();
            let removed = operator
                .force_release(&lock)
                .await
                .expect("break")
                .expect("held");
            let of = |token: Option<String>, guard: &lock_core::LockGuard| {
                token.as_deref() == Some(guard.owner_token().as_str())
            };
            assert!(of(removed.owner_token, &guard), "holder removed");
            let successor = timeout(PUSHED, waiting)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "redlock {redlock}, queue {queue}: the waiter was not woken by the break"
                    )
                })
                .expect("waiter task")
                .expect("the waiter gets the lock");
            println!(
                "redlock {redlock}, queue {queue}: waiter granted {:?} after the break",
                broke_at.elapsed()
            );
            assert!(successor.fencing_token() > guard.fencing_token());
            // The renewal (10 s away) has not run: the release finds the mark itself.
            assert!(guard.is_held());
            assert_eq!(
                guard.release().await.expect("release"),
                ReleaseOutcome::AlreadyLost(LostReason::Broken),
                "redlock {redlock}, queue {queue}"
            );
            assert!(successor.is_held());
            let seen = operator.inspect(&lock).await.expect("inspect");
            assert!(
                of(seen.holder.and_then(|h| h.owner_token), &successor),
                "the broken holder's release left the successor's key"
            );
            assert_eq!(
                successor.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
    }
}

/// Renewal reads no break mark while the keys are its own (the normal path costs
/// nothing more), and turns a broken hold Lost with `Broken` at the next renewal, in
/// manual mode at the next extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_reads_the_mark_only_for_a_key_it_lost() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let holder = connect(&factory, "ttl=3s").await;
    let manual = connect(&factory, "ttl=30s&renewal=manual").await;
    let operator = connect(&factory, "").await;
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(holder.lock(&format!("renew/{i}")).await.expect("acquire"));
    }
    let pinned = manual.lock("renew/manual").await.expect("acquire");
    // Three holds renewed at a third of 3 s: at least two rounds in 2.5 s.
    let renewals = command_calls(&mut conn, "pexpire").await;
    sleep(Duration::from_millis(2500)).await;
    assert!(
        command_calls(&mut conn, "pexpire").await >= renewals + 6,
        "the holds were renewed"
    );
    pinned.extend().await.expect("extend");
    assert_eq!(
        command_calls(&mut conn, "lrange").await,
        0,
        "a mark was read"
    );

    operator
        .force_release(&name("renew/1"))
        .await
        .expect("break")
        .expect("held");
    let reason = timeout(
        Duration::from_secs(3) + Duration::from_secs(2),
        guards[1].lost(),
    )
    .await
    .expect("Lost by the next renewal");
    assert_eq!(reason, LostReason::Broken);
    assert!(guards[0].is_held() && guards[2].is_held());
    operator
        .force_release(&name("renew/manual"))
        .await
        .expect("break")
        .expect("held");
    let err = pinned.extend().await.expect_err("extending a broken hold");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(
        pinned.state(),
        lock_core::LockState::Lost(LostReason::Broken)
    );
    assert!(command_calls(&mut conn, "lrange").await > 0);
}

/// A break that cannot be done gets a typed error and changes nothing: a lock key of
/// another type (not a lock), the server down, fewer than a majority of RedLock servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaks_that_cannot_be_done_get_typed_errors() {
    let Some(factory) = RedisFactory::single().await else {
        return;
    };
    let operator = connect(&factory, "request_timeout=500ms").await;
    let lock = name("typed/hash");
    let keys = KeyLayout::new(DEFAULT_PREFIX);
    let mut conn = raw(factory.servers.addrs()[0]).await;
    let _: i64 = redis::cmd("HSET")
        .arg(keys.lock_key(&lock))
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    let err = operator
        .force_release(&lock)
        .await
        .expect_err("a hash is no lock");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(keys.lock_key(&lock))
        .arg(keys.broken_key(&lock))
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 1, "the hash is left and no mark written");
    assert_eq!(
        operator.list("").await.expect("list"),
        Vec::<LockName>::new()
    );

    factory.servers.member(0).stop().await.expect("stop");
    let err = operator
        .force_release(&name("typed/down"))
        .await
        .expect_err("the server is down");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_retryable());
    let err = operator.list("").await.expect_err("the server is down");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");

    let Some(nodes) = RedisFactory::redlock(3).await else {
        return;
    };
    let operator = connect(&nodes, "request_timeout=500ms").await;
    let guard = operator.lock("typed/redlock").await.expect("acquire");
    for i in [1, 2] {
        nodes.servers.member(i).stop().await.expect("stop");
    }
    let err = operator
        .force_release(&name("typed/redlock"))
        .await
        .expect_err("one server of three");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let err = operator.list("").await.expect_err("one server of three");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    drop(guard);
}
