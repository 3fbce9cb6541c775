//! Leader election: one leader at a time with strictly increasing terms, the leader's
//! value, resign and takeover, observers, cancellation.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::{
    AcquireOptions, DistributedLock, Election, Leader, Leadership, LockOptions, ReleaseOutcome,
    Wait,
};
use tokio::time::{sleep, timeout, Instant};

use super::{
    cut_off_then_replaced, eventually_empty, offered, push_only_options, unique_name, PROMPT,
};
use crate::factory::Factory;
use crate::fence::FencedResource;
use crate::with_ttl;

/// The election `name` on `client`, or `None` (said loudly) when the backend has none.
fn election(client: &Arc<dyn DistributedLock>, name: &str, rule: &str) -> Option<Election> {
    offered(Election::new(Arc::clone(client), name), rule)
}

/// The election `name` on each of `clients`, or `None` (said loudly) when the backend has
/// none.
fn elections(
    clients: [&Arc<dyn DistributedLock>; 2],
    name: &str,
    rule: &str,
) -> Option<[Election; 2]> {
    let [a, b] = clients;
    Some([election(a, name, rule)?, election(b, name, rule)?])
}

/// The election `name` on each of `clients`, the first of them leading as candidate `a`,
/// or `None` (said loudly) when the backend has none.
async fn a_leads(
    clients: [&Arc<dyn DistributedLock>; 2],
    name: &str,
    rule: &str,
) -> Option<([Election; 2], Leadership)> {
    let [on_a, on_b] = elections(clients, name, rule)?;
    let first = on_a
        .campaign_with("a", &AcquireOptions::forever())
        .await
        .expect("campaign")
        .expect("leads");
    Some(([on_a, on_b], first))
}

/// Waits (up to [`PROMPT`]) until `election`'s leader satisfies `wanted`; returns it.
async fn leader_until(
    election: &Election,
    what: &str,
    wanted: impl Fn(&Option<Leader>) -> bool,
) -> Option<Leader> {
    let deadline = Instant::now() + PROMPT;
    loop {
        let leader = election.leader().await.expect("read the leader");
        if wanted(&leader) {
            return leader;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the leader is still {leader:?} after {PROMPT:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// K candidates campaign M times each: at most one leads at a time (fenced writes with
/// the term as token never overlap and never go back), terms strictly increase, and a
/// leader reads itself as the leader, with its value and term.
pub async fn election_one_leader_at_a_time(factory: &dyn Factory) {
    const CANDIDATES: usize = 3;
    const TERMS: usize = 4;
    let rule = "election_one_leader_at_a_time";
    let name = unique_name(rule);
    let resource = FencedResource::new();
    let mut tasks = Vec::new();
    for candidate in 0..CANDIDATES {
        let client = factory.client(LockOptions::default()).await;
        let Some(election) = election(&client, name.as_str(), rule) else {
            return;
        };
        let resource = resource.clone();
        tasks.push(tokio::spawn(async move {
            let mut terms = Vec::new();
            for term in 0..TERMS {
                let value = format!("candidate-{candidate}-{term}");
                let leadership = election
                    .campaign_with(
                        value.clone(),
                        &AcquireOptions::timeout(Duration::from_secs(60)),
                    )
                    .await
                    .expect("campaign under contention")
                    .expect("a waiting campaign ends leading");
                let written = resource
                    .hold_section(leadership.guard(), async {
                        let leader = election.leader().await.expect("read the leader");
                        let leader = leader.expect("a leader reads a leader");
                        assert_eq!(leader.term, leadership.term(), "the leader reads its term");
                        assert_eq!(leader.value, value.as_bytes(), "the leader reads its value");
                    })
                    .await
                    .expect("a leader's term is never stale");
                assert!(written, "a valid leader's write is never stale");
                terms.push(leadership.term());
                assert_eq!(
                    leadership.resign().await.expect("resign"),
                    ReleaseOutcome::Released
                );
            }
            terms
        }));
    }
    let mut all_terms = Vec::new();
    for result in join_all(tasks).await {
        let terms = result.expect("candidate task");
        assert!(
            terms.windows(2).all(|pair| pair[0] < pair[1]),
            "one candidate's terms must increase: {terms:?}"
        );
        all_terms.extend(terms);
    }
    let report = resource.check();
    assert!(report.is_safe(), "two leaders at once: {report:?}");
    assert_eq!(report.accepted_writes, (CANDIDATES * TERMS) as u64);
    all_terms.sort();
    all_terms.dedup();
    assert_eq!(
        all_terms.len(),
        CANDIDATES * TERMS,
        "every term is a new one"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// A candidate that leads sees itself as the leader; another candidate's try says "not
/// leader"; a proclaim changes the value readers see and keeps the term (the value's
/// version, 0 at the grant, rises by one); after a resign nobody leads.
pub async fn election_value_and_proclaim(factory: &dyn Factory) {
    let rule = "election_value_and_proclaim";
    let name = unique_name(rule);
    let a = factory.client(LockOptions::default()).await;
    let b = factory.client(LockOptions::default()).await;
    let Some([on_a, on_b]) = elections([&a, &b], name.as_str(), rule) else {
        return;
    };
    assert_eq!(on_b.leader().await.expect("read"), None, "nobody leads yet");
    let mut leadership = on_a
        .campaign_with("10.0.0.1:8080", &AcquireOptions::try_once())
        .await
        .expect("campaign")
        .expect("an uncontended try leads");
    let leader = on_b.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.value, b"10.0.0.1:8080");
    assert_eq!(leader.term, leadership.term());
    assert_eq!(
        leader.version,
        Some(0),
        "the value of the grant is version 0"
    );
    assert!(
        on_b.campaign_with("10.0.0.2:8080", &AcquireOptions::try_once())
            .await
            .expect("try")
            .is_none(),
        "a try while another leads does not lead"
    );
    leadership
        .proclaim("10.0.0.1:9090")
        .await
        .expect("proclaim");
    assert_eq!(leadership.value(), b"10.0.0.1:9090");
    let leader = on_b.leader().await.expect("read").expect("a leader");
    assert_eq!(
        leader.value, b"10.0.0.1:9090",
        "readers see the proclaimed value"
    );
    assert_eq!(leader.term, leadership.term(), "a proclaim keeps the term");
    assert_eq!(leader.version, Some(1), "a proclaim raises the version");
    assert!(leadership.is_leader());
    leadership.resign().await.expect("resign");
    assert_eq!(
        on_b.leader().await.expect("read"),
        None,
        "nobody leads after a resign"
    );
    eventually_empty(factory, &[name], rule).await;
}

/// A resign hands leadership to the waiting candidate at once (by a push: the waiter's
/// recheck is long), with a greater term; a stolen leadership turns Lost and its proclaim
/// fails with Lost.
pub async fn election_resign_hands_over(factory: &dyn Factory) {
    let rule = "election_resign_hands_over";
    let name = unique_name(rule);
    let mut options = push_only_options();
    options.ttl = factory.short_ttl();
    let a = factory.client(options.clone()).await;
    let b = factory.client(options).await;
    let Some(([on_a, on_b], first)) = a_leads([&a, &b], name.as_str(), rule).await else {
        return;
    };
    let waiting = tokio::spawn(async move {
        let leadership = on_b
            .campaign_with("b", &AcquireOptions::timeout(Duration::from_secs(30)))
            .await;
        (on_b, leadership, Instant::now())
    });
    leader_until(&on_a, "a leads while b waits", |l| {
        l.as_ref().is_some_and(|l| l.value == b"a")
    })
    .await;
    sleep(Duration::from_millis(200)).await;
    let first_term = first.term();
    let resigned_at = Instant::now();
    first.resign().await.expect("resign");
    let (on_b, second, led_at) = waiting.await.expect("waiting candidate");
    let mut second = second.expect("campaign").expect("leads after the resign");
    let handed_over = led_at.saturating_duration_since(resigned_at);
    assert!(
        handed_over < PROMPT,
        "the hand-over after a resign took {handed_over:?}: it must be pushed, not polled"
    );
    assert!(second.term() > first_term, "terms increase across leaders");
    let leader = on_b.leader().await.expect("read").expect("b leads");
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"b"[..], second.term())
    );

    // Taken behind b's back: Lost, and a proclaim says so.
    factory.steal(&name).await;
    // Found at the next renewal, a third of the TTL later.
    let lost = timeout(factory.short_ttl() + PROMPT, second.lost()).await;
    assert!(lost.is_ok(), "a stolen leadership must turn Lost");
    let proclaimed = second.proclaim("b2").await;
    assert!(
        matches!(proclaimed, Err(lock_core::Error::Lost { .. })),
        "a lost leader's proclaim must fail with Lost, got {proclaimed:?}"
    );
    drop(second);
    eventually_empty(factory, &[name], rule).await;
}

/// A leader cut off from the server (crashed, partitioned) turns Lost before anyone else
/// leads, and another candidate leads within its TTL plus a bound.
pub async fn election_cut_off_leader_is_replaced(factory: &dyn Factory) {
    let rule = "election_cut_off_leader_is_replaced";
    if !super::leased(factory, rule).await {
        return;
    }
    let name = unique_name(rule);
    let ttl = factory.short_ttl();
    let (a, crash) = factory.crashable_client(with_ttl(ttl)).await;
    let b = factory.client(with_ttl(ttl)).await;
    let Some(([_, on_b], first)) = a_leads([&a, &b], name.as_str(), rule).await else {
        return;
    };
    let patience = AcquireOptions::timeout(ttl * 4 + PROMPT);
    let next = on_b.campaign_with("b", &patience);
    let second = cut_off_then_replaced(first.watch(), &*crash, ttl, next)
        .await
        .expect("another candidate leads after the TTL")
        .expect("leads");
    assert!(
        second.term() > first.term(),
        "terms increase across a takeover"
    );
    second.resign().await.expect("resign");
    drop(first);
}

/// Observers see each leader once, in increasing terms, see a proclaimed value with the
/// same term (never an older value after it), see the vacancy, and end at the current
/// leader; each change reaches them by a push (their recheck is 20 s) before the next
/// change is made.
pub async fn election_observers_see_terms_in_order(factory: &dyn Factory) {
    const LEADERS: usize = 4;
    let rule = "election_observers_see_terms_in_order";
    let name = unique_name(rule);
    let watcher = factory.client(push_only_options()).await;
    let Some(watched) = election(&watcher, name.as_str(), rule) else {
        return;
    };
    let mut observer = watched.observe();
    assert_eq!(
        timeout(PROMPT, observer.next())
            .await
            .expect("the first change is the current state")
            .expect("observe"),
        None,
        "nobody leads yet"
    );
    let (tell, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let observing = tokio::spawn(async move {
        loop {
            let change = observer.next().await.expect("observe");
            let change = change.map(|leader| (leader.value_text(), leader.term));
            if tell.send(change).is_err() {
                return;
            }
        }
    });
    for round in 0..LEADERS {
        let client = factory.client(LockOptions::default()).await;
        let on = Election::new(client, name.as_str()).expect("election");
        let mut leadership = on
            .campaign_with(format!("leader-{round}"), &AcquireOptions::forever())
            .await
            .expect("campaign")
            .expect("leads");
        let term = leadership.term();
        next_is(
            &mut seen,
            Some((format!("leader-{round}"), term)),
            format!("leader {round}"),
        )
        .await;
        leadership
            .proclaim(format!("leader-{round}-moved"))
            .await
            .expect("proclaim");
        let moved = format!("leader-{round}-moved");
        next_is(
            &mut seen,
            Some((moved, term)),
            format!("leader {round}'s proclaim"),
        )
        .await;
        leadership.resign().await.expect("resign");
        next_is(&mut seen, None, format!("the vacancy after leader {round}")).await;
    }
    observing.abort();
    eventually_empty(factory, &[name], rule).await;
}

/// The next change an observer reported (on `seen`), which must be `expected`, within
/// [`PROMPT`].
async fn next_is(
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<Option<(String, lock_core::FencingToken)>>,
    expected: Option<(String, lock_core::FencingToken)>,
    what: String,
) {
    let change = timeout(PROMPT, seen.recv())
        .await
        .unwrap_or_else(|_| panic!("observers not told of {what} within {PROMPT:?}"))
        .expect("observer task");
    assert_eq!(change, expected, "observers see {what}, in order");
}

/// A campaign dropped while it waits, or given up by its timeout, leaves no candidate
/// behind: the leader resigns and nobody leads; a try campaign that does not lead leaves
/// nothing either.
pub async fn election_cancellation_leaves_nothing(factory: &dyn Factory) {
    let rule = "election_cancellation_leaves_nothing";
    let name = unique_name(rule);
    let a = factory.client(LockOptions::default()).await;
    let b = factory.client(LockOptions::default()).await;
    let Some(([_, on_b], leadership)) = a_leads([&a, &b], name.as_str(), rule).await else {
        return;
    };
    let forever = AcquireOptions::forever();
    for pause in [0, 1, 5, 20, 100] {
        let campaign = on_b.campaign_with("b", &forever);
        assert!(
            timeout(Duration::from_millis(pause), campaign)
                .await
                .is_err(),
            "a campaign while another leads must wait"
        );
    }
    let timed_out = on_b
        .campaign_with(
            "b",
            &AcquireOptions::default().with_wait(Wait::Timeout(Duration::from_millis(300))),
        )
        .await;
    assert!(
        matches!(timed_out, Err(lock_core::Error::Timeout { .. })),
        "a campaign's timeout is an error, got {timed_out:?}"
    );
    assert!(on_b
        .campaign_with("b", &AcquireOptions::try_once())
        .await
        .expect("try")
        .is_none());
    leadership.resign().await.expect("resign");
    // Every abandoned candidacy is gone: nobody leads after the resign.
    leader_until(&on_b, "nobody leads after the resign", Option::is_none).await;
    eventually_empty(factory, &[name], rule).await;
}
