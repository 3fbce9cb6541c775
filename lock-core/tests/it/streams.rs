//! The feeds are streams: a leader observer and a leader service's events read through
//! `futures::Stream`; an observer's read cancelled midway loses nothing; a service with
//! bad pauses is refused.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lock_core::{DistributedLock, Election, ErrorKind, LeaderEvent, LeaderService};
use tokio::time::timeout;

const BRIEFLY: Duration = Duration::from_millis(200);
const PROMPT: Duration = Duration::from_secs(5);

async fn client() -> Arc<dyn DistributedLock> {
    crate::memory_client("streams").await
}

#[tokio::test]
async fn an_observer_is_a_stream_whose_cancelled_read_goes_on() {
    let locks = client().await;
    let election = Election::new(Arc::clone(&locks), "streamed").expect("election");
    let mut observer = election.observe();
    let first = timeout(PROMPT, observer.next())
        .await
        .expect("the first read returns at once")
        .expect("read");
    assert_eq!(first, None, "nobody leads yet");
    // A read that nothing answers, cancelled: the read in flight is kept.
    assert!(timeout(BRIEFLY, StreamExt::next(&mut observer))
        .await
        .is_err());
    let leadership = election.campaign("a").await.expect("campaign");
    let seen = timeout(PROMPT, StreamExt::next(&mut observer))
        .await
        .expect("the change comes through the stream")
        .expect("the stream goes on")
        .expect("read")
        .expect("a leader");
    assert_eq!(
        (seen.term, seen.value.as_slice()),
        (leadership.term(), &b"a"[..])
    );
    assert_eq!(
        observer.current().map(|leader| leader.term),
        Some(seen.term)
    );
    leadership.resign().await.expect("resign");
    let vacant = timeout(PROMPT, observer.next()).await.expect("vacancy");
    assert_eq!(vacant.expect("read"), None);
    assert!(observer.current().is_none());
}

#[tokio::test]
async fn an_observer_stream_ends_after_an_error_retrying_cannot_cure() {
    let locks = client().await;
    let election = Election::new(Arc::clone(&locks), "ended").expect("election");
    let mut observer = election.observe();
    assert_eq!(observer.next().await.expect("read"), None);
    locks.close().await.expect("close");
    let err = timeout(PROMPT, StreamExt::next(&mut observer))
        .await
        .expect("a closed client answers at once")
        .expect("the error is an item")
        .expect_err("closed");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(
        StreamExt::next(&mut observer).await.is_none(),
        "then the stream ends"
    );
}

#[tokio::test]
async fn a_service_streams_its_events_and_refuses_bad_pauses() {
    let locks = client().await;
    let election = Election::new(Arc::clone(&locks), "served").expect("election");
    let refused = LeaderService::new(election.clone(), "x")
        .with_backoff(Duration::ZERO, Duration::from_secs(1))
        .expect_err("a zero pause");
    assert_eq!(refused.kind(), ErrorKind::InvalidConfig);
    let refused = LeaderService::new(election.clone(), "x")
        .with_backoff(Duration::from_secs(2), Duration::from_secs(1))
        .expect_err("first above longest");
    assert_eq!(refused.kind(), ErrorKind::InvalidConfig);
    let service = LeaderService::new(election.clone(), "served-1");
    let events = service.events();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        service
            .run(
                |context| async move {
                    assert_eq!(context.watch.state(), lock_core::LockState::Held);
                    std::future::pending::<()>().await;
                },
                async {
                    let _ = stopped.await;
                },
            )
            .await
    });
    let mut events = events;
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|event| matches!(event, LeaderEvent::Elected { .. }))
    {
        let event = timeout(PROMPT, events.next()).await.expect("an event");
        seen.push(event.expect("the service runs"));
    }
    assert_eq!(seen.first(), Some(&LeaderEvent::Campaigning), "{seen:?}");
    stop.send(()).expect("stop");
    let summary = run.await.expect("task").expect("run");
    assert_eq!((summary.terms, summary.lost), (1, 0));
    let rest: Vec<LeaderEvent> = events.collect().await;
    assert!(
        rest.iter().any(|event| matches!(
            event,
            LeaderEvent::Resigned {
                release: Some(_),
                ..
            }
        )),
        "{rest:?}"
    );
    assert_eq!(election.leader().await.expect("read"), None, "resigned");
}
