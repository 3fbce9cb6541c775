//! Leader election interoperability with Apache Curator's `LeaderLatch` (Debian package
//! `libcurator-recipes-java`): a Curator latch and a distlock campaign on the same path
//! never lead at once, each waits for the other, and each sees the other as leader (its
//! value is the node's UTF-8 data, Curator's participant id).
//!
//! The Java program is [`harness::curator`]'s. Without java, javac or the Curator jars
//! the tests print a loud notice and pass, unless `LOCK_TEST_STRICT=1`, where they fail.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{AcquireOptions, DistributedLock, Election, FencingToken, ReleaseOutcome};
use testkit::zookeeper::{queue, queue_len_reaches, with_ttl, CuratorSetup};
use tokio::time::{sleep, timeout, Instant};

/// How long a hand-over may take.
const PROMPT: Duration = Duration::from_secs(5);

/// A distlock election on the setup's name.
async fn election(setup: &CuratorSetup) -> Election {
    let client: Arc<dyn DistributedLock> = setup
        .factory
        .zk_client(with_ttl(Duration::from_secs(10)))
        .await;
    Election::new(client, setup.name.as_str()).expect("election")
}

/// Curator's latch leads: our campaign waits and reads Curator's id as the leader; once
/// Curator closes, we lead with a greater term, and Curator's readers see our value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_latch_leads_then_distlock() {
    let Some(setup) = CuratorSetup::start("latch-first").await else {
        return;
    };
    let (factory, name) = (&setup.factory, &setup.name);
    let ours = election(&setup).await;
    let mut curator = setup.curator().await;
    let mut observer = setup.curator().await;

    curator.latch("curator-1").await.expect("latch");
    let curator_term = curator.leads(Duration::from_secs(20)).await.expect("leads");
    let leader = ours.leader().await.expect("read").expect("Curator leads");
    assert_eq!(leader.value_text(), "curator-1", "we read Curator's id");
    assert_eq!(
        leader.term,
        FencingToken(curator_term),
        "the term is its czxid"
    );
    assert!(
        ours.campaign_with("distlock-1", &AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a try campaign led while Curator's latch leads"
    );

    let waiting = tokio::spawn(async move {
        let leadership = ours
            .campaign_with(
                "distlock-1",
                &AcquireOptions::timeout(Duration::from_secs(30)),
            )
            .await;
        (ours, leadership, Instant::now())
    });
    queue_len_reaches(factory, name, 2).await;
    sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "led while Curator's latch leads");
    assert!(
        curator.has_leadership().await.expect("has"),
        "Curator leads"
    );

    curator.close_latch().await.expect("close");
    let closed_at = Instant::now();
    let (ours, leadership, led_at) = timeout(PROMPT + PROMPT, waiting)
        .await
        .expect("our campaign leads after Curator closes")
        .expect("campaign task");
    let leadership = leadership.expect("campaign").expect("leads");
    eprintln!(
        "Curator -> distlock hand-over observed after {:?}",
        led_at.saturating_duration_since(closed_at)
    );
    assert!(
        leadership.term() > FencingToken(curator_term),
        "terms increase"
    );

    // Curator's readers see our value as the leader's id.
    observer.latch("curator-2").await.expect("latch");
    queue_len_reaches(factory, name, 2).await;
    assert_eq!(observer.leader_id().await.expect("leader"), "distlock-1");
    assert!(!observer.has_leadership().await.expect("has"));
    let leader = ours.leader().await.expect("read").expect("we lead");
    assert_eq!(leader.term, leadership.term());
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    observer
        .leads(PROMPT)
        .await
        .expect("Curator leads after our resign");
    observer.close_latch().await.expect("close");
    assert!(queue(factory.admin(), name).await.is_empty());
    curator.exit().await;
    observer.exit().await;
}

/// We lead: Curator's latch does not lead, reads our (proclaimed) value as the leader's
/// id, and leads once we resign (pushed by its predecessor watch); then we read it as the
/// leader and do not lead until it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_leads_then_curator_latch() {
    let Some(setup) = CuratorSetup::start("distlock-first").await else {
        return;
    };
    let (factory, name) = (&setup.factory, &setup.name);
    let ours = election(&setup).await;
    let mut curator = setup.curator().await;

    let mut leadership = ours
        .campaign_with("10.0.0.1:8080", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("an uncontended try leads");
    // Proclaimed before Curator queues: a proclaim (a `setData` of our node) would use up
    // the predecessor watch of a Curator latch queued right behind us, which Curator
    // re-arms on `NodeDeleted` only (README, *Leader election*).
    leadership
        .proclaim("10.0.0.1:9090")
        .await
        .expect("proclaim");
    curator.latch("curator-1").await.expect("latch");
    queue_len_reaches(factory, name, 2).await;
    curator.silent_for(Duration::from_millis(800)).await;
    assert!(!curator.has_leadership().await.expect("has"));
    assert_eq!(
        curator.leader_id().await.expect("leader"),
        "10.0.0.1:9090",
        "Curator reads our proclaimed value as the leader's id"
    );
    let occupancy = ours.leader().await.expect("read").expect("we lead");
    assert_eq!(occupancy.term, leadership.term());
    assert_eq!(occupancy.value_text(), "10.0.0.1:9090");

    let our_term = leadership.term();
    let resigned_at = Instant::now();
    assert_eq!(
        leadership.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    let curator_term = curator.leads(PROMPT).await.expect("Curator leads");
    eprintln!(
        "distlock -> Curator hand-over observed after {:?}",
        resigned_at.elapsed()
    );
    assert!(FencingToken(curator_term) > our_term, "terms increase");
    let leader = ours.leader().await.expect("read").expect("Curator leads");
    assert_eq!(leader.value_text(), "curator-1");
    assert_eq!(leader.term, FencingToken(curator_term));
    assert!(
        ours.campaign_with("again", &AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "we lead while Curator's latch leads"
    );
    curator.close_latch().await.expect("close");
    let next = ours
        .campaign_with("again", &AcquireOptions::try_once())
        .await
        .expect("try")
        .expect("leads once Curator closed");
    next.resign().await.expect("resign");
    assert!(queue(factory.admin(), name).await.is_empty());
    curator.exit().await;
}

/// Mixed candidates (Curator, distlock, Curator, distlock) lead one at a time in the
/// order they queued, each reading the current leader alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_candidates_lead_in_sequence_order() {
    let Some(setup) = CuratorSetup::start("latch-fifo").await else {
        return;
    };
    let (factory, name) = (&setup.factory, &setup.name);
    let first = election(&setup).await;
    let leadership = first
        .campaign_with("distlock-0", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("leads");
    let mut c1 = setup.curator().await;
    let mut c3 = setup.curator().await;
    c1.latch("curator-1").await.expect("latch");
    queue_len_reaches(factory, name, 2).await;
    let mut campaigns = Vec::new();
    for (queued, value) in [(3, "distlock-2"), (5, "distlock-4")] {
        let ours = election(&setup).await;
        campaigns.push(tokio::spawn(async move {
            let leadership = ours
                .campaign_with(value, &AcquireOptions::timeout(Duration::from_secs(60)))
                .await
                .expect("campaign")
                .expect("leads");
            (ours, leadership)
        }));
        queue_len_reaches(factory, name, queued).await;
        if value == "distlock-2" {
            c3.latch("curator-3").await.expect("latch");
            queue_len_reaches(factory, name, 4).await;
        }
    }
    let mut d4 = campaigns.pop().expect("distlock-4");
    let mut d2 = campaigns.pop().expect("distlock-2");
    let mut term = leadership.term();

    // distlock-0 -> curator-1
    leadership.resign().await.expect("resign");
    term = term.max(FencingToken(
        c1.leads(PROMPT).await.expect("curator-1 leads"),
    ));
    assert_eq!(
        first
            .leader()
            .await
            .expect("read")
            .expect("leader")
            .value_text(),
        "curator-1"
    );
    assert!(!d2.is_finished() && !d4.is_finished());
    assert!(!c3.has_leadership().await.expect("has"));

    // curator-1 -> distlock-2
    c1.close_latch().await.expect("close");
    let (on_d2, led) = timeout(PROMPT, &mut d2)
        .await
        .expect("distlock-2 leads after curator-1")
        .expect("campaign task");
    assert!(led.term() > term, "terms increase");
    term = led.term();
    assert_eq!(c3.leader_id().await.expect("leader"), "distlock-2");
    assert!(!c3.has_leadership().await.expect("has") && !d4.is_finished());

    // distlock-2 -> curator-3
    led.resign().await.expect("resign");
    let c3_term = FencingToken(c3.leads(PROMPT).await.expect("curator-3 leads"));
    assert!(c3_term > term, "terms increase");
    assert_eq!(
        on_d2
            .leader()
            .await
            .expect("read")
            .expect("leader")
            .value_text(),
        "curator-3"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(!d4.is_finished(), "distlock-4 led while curator-3 leads");

    // curator-3 -> distlock-4
    c3.close_latch().await.expect("close");
    let (_, led) = timeout(PROMPT, &mut d4)
        .await
        .expect("distlock-4 leads after curator-3")
        .expect("campaign task");
    assert!(led.term() > c3_term, "terms increase");
    led.resign().await.expect("resign");
    assert!(queue(factory.admin(), name).await.is_empty());
    c1.exit().await;
    c3.exit().await;
}
