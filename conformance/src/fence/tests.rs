//! Unit tests of the fenced resource, its checker and its TCP face.

use super::*;
use lock_core::memory::{MemoryBackend, MemorySpace};
use lock_core::{AcquireOptions, DistributedLock, LockName, LockOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A guard on a private memory space, after `before` earlier holds of the same name
/// (so its fencing token is `before + 1`).
async fn guard(before: usize, acquire: AcquireOptions) -> LockGuard {
    let space = MemorySpace::named(&format!("fence-{}", uuid::Uuid::new_v4().simple()));
    let client = MemoryBackend::client(space, LockOptions::default()).unwrap();
    let name = LockName::new("fenced").unwrap();
    for _ in 0..before {
        let earlier = client.acquire(&name, &AcquireOptions::try_once()).await;
        earlier.unwrap().unwrap().release().await.unwrap();
    }
    client.acquire(&name, &acquire).await.unwrap().unwrap()
}

#[tokio::test]
async fn a_holder_turned_away_while_its_guard_vouched_is_an_overlap() {
    let resource = FencedResource::new();
    let older = guard(0, AcquireOptions::try_once()).await;
    let newer = guard(1, AcquireOptions::try_once()).await;
    assert!(newer.fencing_token() > older.fencing_token());
    let section = resource.begin(older.fencing_token()).unwrap();
    let seen = section.read();
    // A newer holder gets in while the older guard still vouches for the lock.
    let sleep = tokio::time::sleep(Duration::from_millis(2));
    assert!(resource.hold_section(&newer, sleep).await.unwrap());
    assert!(!section.finish(seen + 1, &older), "the fence turns it away");
    let report = resource.check();
    assert_eq!(report.rejected_writes, 1);
    assert_eq!(report.counter, 1, "the resource stayed consistent");
    assert_eq!(report.overlaps.len(), 1, "{report:?}");
    assert!(!report.is_safe());
}

#[tokio::test]
async fn a_holder_whose_guard_stopped_vouching_first_does_not_overlap() {
    let resource = FencedResource::new();
    let ttl = Duration::from_millis(20);
    let older = guard(0, AcquireOptions::try_once().with_ttl(ttl).manual()).await;
    let newer = guard(1, AcquireOptions::try_once()).await;
    let section = resource.begin(older.fencing_token()).unwrap();
    let seen = section.read();
    tokio::time::sleep_until(older.valid_until()).await;
    let sleep = tokio::time::sleep(Duration::from_millis(2));
    assert!(resource.hold_section(&newer, sleep).await.unwrap());
    assert!(
        !section.finish(seen + 1, &older),
        "no write past the deadline"
    );
    let report = resource.check();
    assert_eq!(report.rejected_writes, 0, "{report:?}");
    assert!(report.is_safe(), "{report:?}");
}

#[tokio::test]
async fn overlapping_accepted_writes_are_reported() {
    let resource = FencedResource::new();
    let a = resource.begin(FencingToken(1)).unwrap();
    let b = resource.begin(FencingToken(1)).unwrap();
    a.write(a.read() + 1).unwrap();
    b.write(b.read() + 1).unwrap();
    b.end();
    a.end();
    let report = resource.check();
    assert_eq!(report.overlaps.len(), 1);
    assert!(!report.is_safe());
}

#[tokio::test]
async fn a_stale_writer_is_rejected_and_the_history_stays_safe() {
    let resource = FencedResource::new();
    let paused = resource.begin(FencingToken(1)).unwrap();
    let seen = paused.read();
    // The paused holder lost its lock; the next holder runs a whole section.
    assert!(resource.increment(FencingToken(2), async {}).await.unwrap());
    assert_eq!(paused.write(seen + 1).unwrap_err().highest, 2);
    paused.end();
    assert!(resource.begin(FencingToken(1)).is_err());
    let report = resource.check();
    assert!(report.is_safe(), "{report:?}");
    assert_eq!(report.rejected_writes, 1);
    assert_eq!(report.rejected_begins, 1);
    assert_eq!(report.counter, 1);
}

#[tokio::test]
async fn sequential_sections_are_safe() {
    let resource = FencedResource::new();
    for token in [3, 3, 5] {
        assert!(resource
            .increment(FencingToken(token), async {})
            .await
            .unwrap());
    }
    let report = resource.check();
    assert!(report.is_safe(), "{report:?}");
    assert_eq!(report.counter, 3);
    assert_eq!(report.gaps.len(), 2);
}

#[tokio::test]
async fn the_client_speaks_the_line_protocol() {
    let resource = FencedResource::new();
    let server = FenceServer::start(resource.clone()).await.unwrap();
    let mut client = FenceClient::connect(server.addr()).await.unwrap();
    client.begin(4).await.unwrap().unwrap();
    let seen = client.read().await.unwrap();
    client.write(4, seen + 1).await.unwrap().unwrap();
    client.end().await.unwrap();
    let stale = client.begin(3).await.unwrap().unwrap_err();
    assert_eq!((stale.offered, stale.highest), (3, 4));
    assert_eq!(resource.check().counter, 1);
}

#[tokio::test]
async fn the_tcp_front_speaks_the_line_protocol() {
    let resource = FencedResource::new();
    let server = FenceServer::start(resource.clone()).await.unwrap();
    let stream = TcpStream::connect(server.addr()).await.unwrap();
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader).lines();
    for (send, expect) in [
        ("BEGIN 4", "OK"),
        ("READ", "VALUE 0"),
        ("WRITE 1", "OK"),
        ("END", "OK"),
        ("BEGIN 3", "STALE 4"),
    ] {
        writer
            .write_all(format!("{send}\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(lines.next_line().await.unwrap().unwrap(), expect);
    }
    assert_eq!(resource.check().counter, 1);
}
