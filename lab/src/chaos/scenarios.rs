//! Scenarios with a choreography of their own: a restore from an old snapshot, a delayed
//! acquire reply, cancellations under faults, and the loss of a majority (the waiters'
//! scenarios are in `waiters`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use lock_core::{DistributedLockExt, LockState};
use tokio::time::{sleep, timeout, Instant};

use super::workload::{contend, first_other_start, options, recover, report, SECTION};
use super::{ScenarioReport, Scene};
use conformance::fence::FencedResource;
use conformance::rules::unique_name;
use harness::proxy::ProxyMode;

/// Every server is restored from a snapshot of its data taken before the victim's grant
/// (a backup restore, a failover to a lagging replica): the lock and the fencing counter
/// go back, yet the next holder's token is above every earlier one and the victim's
/// write is refused.
pub async fn stale_counter_restore(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let name = unique_name(scene.scenario);
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let note = |text: String| notes.lock().expect("notes").push(text);
    let servers = target.servers();
    let client = target.client(options(&plan)).await;
    let cycle = |until| {
        let clients = vec![Arc::clone(&client)];
        contend(
            clients,
            name.clone(),
            resource.clone(),
            until,
            Arc::clone(&notes),
        )
    };
    cycle(Instant::now() + plan.ttl / 2).await;
    for server in &servers {
        if let Err(err) = server.save_snapshot().await {
            note(format!("snapshot {}: {err}", server.label()));
        }
    }
    cycle(Instant::now() + plan.ttl / 2).await;
    let victim = client
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("victim acquires");
    let section = resource
        .begin(victim.fencing_token())
        .expect("the victim's token is the highest");
    let seen = section.read();
    let highest = resource.sections().iter().map(|s| s.token).max();

    let fault_at = Instant::now();
    for (server, restored) in servers
        .iter()
        .zip(join_all(servers.iter().map(|s| s.restart_from_snapshot())).await)
    {
        if let Err(err) = restored {
            note(format!("restore {}: {err}", server.label()));
        }
    }
    let next = target.client(options(&plan)).await;
    let mut backwards = None;
    match next.lock_timeout(name.as_str(), plan.ttl * 3).await {
        Ok(guard) => {
            let token = guard.fencing_token().get();
            if let Some(highest) = highest.filter(|&highest| token <= highest) {
                note(format!(
                    "the first grant after the restore got token {token}, not above {highest}"
                ));
                backwards = Some((highest, token));
            }
            let _ = resource.increment(guard.fencing_token(), async {}).await;
            let _ = guard.release().await;
        }
        Err(err) => note(format!("no grant after the restore: {err}")),
    }
    let contenders = join_all((0..plan.contenders).map(|_| target.client(options(&plan)))).await;
    contend(
        contenders,
        name.clone(),
        resource.clone(),
        Instant::now() + plan.contend,
        Arc::clone(&notes),
    )
    .await;
    let victim_write_accepted = Some(section.write(seen + 1).is_ok());
    section.end();
    let victim_lost = match victim.state() {
        LockState::Lost(reason) => Some(reason),
        _ => None,
    };
    let _ = victim.release().await;
    let recovery = recover(target, &name, plan).await;
    let notes = notes.lock().expect("notes").clone();
    let mut out = report(scene.scenario, target, &resource, recovery, notes);
    out.fence.tokens_backwards.extend(backwards);
    out.victim_write_accepted = victim_write_accepted;
    out.victim_lost = victim_lost;
    out.takeover = first_other_start(&resource, fault_at).map(|at| at - fault_at);
    out
}

/// The victim's acquire travels over a link slower than the TTL: whatever it gets must
/// not overlap a healthy holder.
pub async fn acquire_reply_delayed(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let name = unique_name(scene.scenario);
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let (victim, link) = target.linked_client(options(&plan)).await;
    link.set_mode(ProxyMode::Delay {
        base: plan.ttl + plan.ttl / 2,
        jitter: Duration::ZERO,
    });
    let victim_task = {
        let (name, resource) = (name.clone(), resource.clone());
        tokio::spawn(async move {
            match victim.try_lock(name.as_str()).await {
                Ok(Some(guard)) => {
                    let outcome = if guard.is_held() {
                        let written = resource.hold_section(&guard, sleep(SECTION)).await;
                        format!("victim got the lock; write accepted: {written:?}")
                    } else {
                        "victim got a guard that was already lost".to_owned()
                    };
                    let _ = guard.release().await;
                    outcome
                }
                Ok(None) => "victim found the lock held".to_owned(),
                Err(err) => format!("victim's acquire failed: {err}"),
            }
        })
    };
    let mut contenders = Vec::new();
    for _ in 0..plan.contenders {
        contenders.push(target.client(options(&plan)).await);
    }
    let until = Instant::now() + plan.contend;
    contend(
        contenders,
        name.clone(),
        resource.clone(),
        until,
        Arc::clone(&notes),
    )
    .await;
    link.heal();
    match timeout(plan.ttl * 4 + Duration::from_secs(10), victim_task).await {
        Ok(Ok(outcome)) => notes.lock().expect("notes").push(outcome),
        _ => notes
            .lock()
            .expect("notes")
            .push("victim's acquire never finished".into()),
    }
    let recovery = recover(target, &name, plan).await;
    let notes = notes.lock().expect("notes").clone();
    report(scene.scenario, target, &resource, recovery, notes)
}

/// Acquires with random short timeouts race grants while connections are reset: nothing
/// stays queued or held, and the lock is free right after.
pub async fn cancellation_under_faults(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    use rand::Rng;
    let name = unique_name(scene.scenario);
    let resource = FencedResource::new();
    let mut notes = Vec::new();
    let mut links = Vec::new();
    let mut tasks = Vec::new();
    let until = Instant::now() + plan.contend;
    for _ in 0..3 {
        let (client, link) = target.linked_client(options(&plan)).await;
        links.push(link);
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let cut = Duration::from_millis(rand::rng().random_range(1..80));
                if let Ok(Ok(guard)) = timeout(cut, client.lock(name.as_str())).await {
                    let _ = resource.hold_section(&guard, sleep(SECTION)).await;
                    drop(guard);
                }
            }
        }));
    }
    while Instant::now() < until {
        let pause = Duration::from_millis(rand::rng().random_range(50..250));
        sleep(pause).await;
        let which = rand::rng().random_range(0..links.len());
        links[which].set_mode(ProxyMode::Reset);
        links[which].heal();
    }
    for task in join_all(tasks).await {
        if let Err(err) = task {
            notes.push(format!("contender panicked: {err}"));
        }
    }
    let deadline = Instant::now() + plan.ttl * 2 + Duration::from_secs(10);
    let mut left = target.leftovers(std::slice::from_ref(&name)).await;
    while !left.is_empty() && Instant::now() < deadline {
        sleep(Duration::from_millis(100)).await;
        left = target.leftovers(std::slice::from_ref(&name)).await;
    }
    if !left.is_empty() {
        notes.push(format!("left on the server: {left:?}"));
    }
    let recovery = if left.is_empty() {
        recover(target, &name, plan).await
    } else {
        None
    };
    report(scene.scenario, target, &resource, recovery, notes)
}

/// A majority of servers is killed while the lock is held: no one else may acquire
/// meanwhile (an error, never a second grant); after restart the lock works again.
pub async fn majority_loss(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    let name = unique_name(scene.scenario);
    let resource = FencedResource::new();
    let mut notes = Vec::new();
    let holder = target.client(options(&plan)).await;
    let other = target.client(options(&plan)).await;
    let guard = holder
        .lock_timeout(name.as_str(), Duration::from_secs(10))
        .await
        .expect("holder acquires");
    let servers = target.servers();
    let majority: Vec<usize> = (0..servers.len() / 2 + 1).collect();
    // The holder's section spans the fault and the other client's attempt; it claims
    // the lock while the holder's guard vouches, so a second grant meanwhile overlaps it.
    let attempt = async {
        let mut said = Vec::new();
        for &i in &majority {
            if let Err(err) = servers[i].kill9().await {
                said.push(format!("kill {}: {err}", servers[i].label()));
            }
        }
        match other.lock_timeout(name.as_str(), plan.ttl * 2).await {
            Ok(second) => {
                let _ = resource.hold_section(&second, sleep(SECTION)).await;
                said.push("a second client acquired the lock without a majority".into());
                let _ = second.release().await;
            }
            Err(err) => said.push(format!("acquire without a majority: {err}")),
        }
        said
    };
    tokio::pin!(attempt);
    let mut said = None;
    let _ = resource
        .hold_section(&guard, async { said = Some((&mut attempt).await) })
        .await;
    // The holder's guard stopped vouching first: let the attempt finish outside.
    let said = match said {
        Some(said) => said,
        None => attempt.await,
    };
    notes.extend(said);
    notes.push(format!(
        "holder's state without a majority: {:?}",
        guard.state()
    ));
    let restarts = majority.iter().map(|&i| servers[i].restart());
    for (i, restarted) in join_all(restarts).await.into_iter().enumerate() {
        if let Err(err) = restarted {
            notes.push(format!("restart member {i}: {err}"));
        }
    }
    let _ = guard.release().await;
    let recovery = recover(target, &name, plan).await;
    report(scene.scenario, target, &resource, recovery, notes)
}
