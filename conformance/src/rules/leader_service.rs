//! The leader service: one leader's work at a time across re-campaigns, a requeue after a
//! lost term, and a shutdown that resigns and leaves nothing behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use futures::StreamExt;
use lock_core::{
    DistributedLock, Election, FencingToken, LeaderEvent, LeaderService, LockOptions,
    ServiceSummary,
};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use super::{eventually_empty, offered, unique_name, PROMPT};
use crate::factory::Factory;
use crate::fence::FencedResource;
use crate::with_ttl;

/// A service's pauses before campaigning again: short, so that the rules take many terms.
const PAUSE: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(200));

/// The leader service of `client` in election `name` (candidate `value`), or `None` (said
/// loudly) when the backend has no elections.
fn service(
    client: &Arc<dyn DistributedLock>,
    name: &str,
    value: &str,
    rule: &str,
) -> Option<LeaderService> {
    let election = offered(Election::new(Arc::clone(client), name), rule)?;
    let (first, longest) = PAUSE;
    Some(
        LeaderService::new(election, value)
            .with_backoff(first, longest)
            .expect("valid pauses"),
    )
}

/// A shutdown signal for several services: each waits on [`stopped`] of its receiver.
fn shutdown_signal() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

/// Resolves once `stop` says so (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The terms of the `Elected` events in `events`, in order, and whether each term was
/// followed by its `Resigned` or `Lost` before the next `Elected`.
fn terms_in_order(events: &[LeaderEvent]) -> Vec<FencingToken> {
    let mut terms = Vec::new();
    let mut open: Option<FencingToken> = None;
    for event in events {
        match event {
            LeaderEvent::Elected { term } => {
                assert!(
                    open.is_none(),
                    "elected in {term:?} before {open:?} ended: {events:?}"
                );
                open = Some(*term);
                terms.push(*term);
            }
            LeaderEvent::Resigned { term, .. } | LeaderEvent::Lost { term, .. } => {
                assert_eq!(
                    open.take(),
                    Some(*term),
                    "an end of a term not begun: {events:?}"
                );
            }
            _ => {}
        }
    }
    assert!(open.is_none(), "a term never ended: {events:?}");
    terms
}

/// Three services share an election; each term's work is a fenced section, after which
/// the work returns (a resign) and the service campaigns again. The sections never
/// overlap and never go back, each service's events pair every `Elected` with its
/// `Resigned` in increasing terms, and after the shutdown nothing is left. Where the
/// backend is fair, every service leads several terms and sees the others lead (the
/// election's FIFO order turns leadership round); without a queue (RedLock) the fastest
/// campaign wins, so no share is promised.
pub async fn leader_service_one_term_at_a_time(factory: &dyn Factory) {
    const SERVICES: usize = 3;
    const TERMS_EACH: u64 = 3;
    let rule = "leader_service_one_term_at_a_time";
    let name = unique_name(rule);
    let resource = FencedResource::new();
    let (stop, on_stop) = shutdown_signal();
    let mut runs = Vec::new();
    let mut feeds = Vec::new();
    let mut fair = true;
    for index in 0..SERVICES {
        let client = factory.client(LockOptions::default()).await;
        fair &= client.capabilities().fair;
        let Some(service) = service(&client, name.as_str(), &format!("service-{index}"), rule)
        else {
            return;
        };
        feeds.push(service.events());
        let (resource, on_stop) = (resource.clone(), on_stop.clone());
        runs.push(tokio::spawn(async move {
            let summary = service
                .run(
                    |context| {
                        let resource = resource.clone();
                        async move {
                            resource
                                .increment(context.fencing_token, sleep(Duration::from_millis(30)))
                                .await
                                .expect("a leader's term is never stale");
                        }
                    },
                    stopped(on_stop),
                )
                .await
                .expect("the service runs until shut down");
            drop(client);
            summary
        }));
    }
    // Every service leads a few terms (bounded: a stuck rotation fails below).
    let enough = TERMS_EACH * SERVICES as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while resource.check().accepted_writes < enough && Instant::now() < deadline {
        sleep(Duration::from_millis(50)).await;
    }
    stop.send_replace(true);
    let summaries: Vec<ServiceSummary> = join_all(runs)
        .await
        .into_iter()
        .map(|run| run.expect("service task"))
        .collect();
    let report = resource.check();
    assert!(report.is_safe(), "two leaders' work at once: {report:?}");
    assert!(
        report.accepted_writes >= enough,
        "{} terms in 60 s: {summaries:?}",
        report.accepted_writes
    );
    for (index, (summary, mut feed)) in summaries.iter().zip(feeds).enumerate() {
        assert!(
            !fair || summary.terms >= 2,
            "service {index} led {} terms beside the others' {summaries:?}",
            summary.terms
        );
        assert_eq!(
            summary.lost, 0,
            "service {index} lost a term: {summaries:?}"
        );
        let mut events = Vec::new();
        // Read through the stream interface.
        while let Ok(Some(event)) =
            timeout(Duration::from_millis(100), StreamExt::next(&mut feed)).await
        {
            events.push(event);
        }
        let terms = terms_in_order(&events);
        assert_eq!(terms.len() as u64, summary.terms, "{events:?}");
        assert!(terms.windows(2).all(|pair| pair[0] < pair[1]), "{terms:?}");
        assert!(
            !fair
                || events
                    .iter()
                    .any(|event| matches!(event, LeaderEvent::Leader(Some(leader))
                if !terms.contains(&leader.term))),
            "service {index} never saw another leader: {events:?}"
        );
    }
    eventually_empty(factory, &[name], rule).await;
}

/// A service's term is taken from it on the server: the work is cancelled (before the
/// `Lost` event), the service campaigns again and leads a later term, whose work runs;
/// on shutdown it resigns that term, its run reports two terms and one loss, and nothing
/// is left.
pub async fn leader_service_requeues_after_loss(factory: &dyn Factory) {
    let rule = "leader_service_requeues_after_loss";
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let client = factory.client(with_ttl(ttl)).await;
    let Some(service) = service(&client, name.as_str(), "requeued", rule) else {
        return;
    };
    let mut events = service.events();
    let (stop, on_stop) = shutdown_signal();
    let cancelled = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let run = {
        let (cancelled, started) = (Arc::clone(&cancelled), Arc::clone(&started));
        tokio::spawn(async move {
            service
                .run(
                    move |_| {
                        let cancelled = Arc::clone(&cancelled);
                        let started = Arc::clone(&started);
                        async move {
                            let _flag = SetOnDrop(cancelled);
                            started.notify_one();
                            std::future::pending::<()>().await;
                        }
                    },
                    stopped(on_stop),
                )
                .await
        })
    };
    let first = next_elected(&mut events).await;
    timeout(PROMPT, started.notified())
        .await
        .expect("the work starts once elected");
    factory.steal(&name).await;
    // The loss is seen at the next renewal (a third of the TTL) at the latest.
    let lost = timeout(ttl + PROMPT, async {
        loop {
            match events.next().await.expect("the service runs") {
                LeaderEvent::Lost { term, reason } => return (term, reason),
                LeaderEvent::Resigned { term, .. } => panic!("resigned {term:?} instead"),
                _ => {}
            }
        }
    })
    .await
    .expect("the stolen term is lost");
    assert_eq!(lost.0, first, "the term lost is the one elected");
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the work was cancelled before the loss was reported"
    );
    cancelled.store(false, Ordering::SeqCst);
    let second = next_elected(&mut events).await;
    assert!(second > first, "a later term: {second:?} after {first:?}");
    timeout(PROMPT, started.notified())
        .await
        .expect("the work runs again in the new term");
    stop.send_replace(true);
    let summary = timeout(PROMPT, run)
        .await
        .expect("shutdown ends the run")
        .expect("service task")
        .expect("the service runs until shut down");
    assert_eq!((summary.terms, summary.lost), (2, 1), "{summary:?}");
    assert!(
        cancelled.load(Ordering::SeqCst),
        "shutdown cancels the work"
    );
    let mut resigned = None;
    while let Ok(Some(event)) = timeout(Duration::from_millis(100), events.next()).await {
        if let LeaderEvent::Resigned { term, .. } = event {
            resigned = Some(term);
        }
    }
    assert_eq!(resigned, Some(second), "shutdown resigns the term it leads");
    drop(client);
    eventually_empty(factory, &[name], rule).await;
}

/// The term of the next `Elected` event (within a few seconds).
async fn next_elected(events: &mut lock_core::LeaderEvents) -> FencingToken {
    timeout(PROMPT * 2, async {
        loop {
            if let LeaderEvent::Elected { term } = events.next().await.expect("the service runs") {
                return term;
            }
        }
    })
    .await
    .expect("the service leads")
}

/// Sets its flag when dropped: the work's cancellation.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
