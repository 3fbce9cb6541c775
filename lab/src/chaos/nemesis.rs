//! The nemesis: a seeded random mix of faults while contenders keep cycling.

use std::sync::{Arc, Mutex};

use super::workload::{contend, crash_members, options, recover, report};
use super::{Link, ScenarioReport, Scene, Topology};
use conformance::fence::FencedResource;
use conformance::rules::unique_name;
use harness::proxy::ProxyMode;
use tokio::time::{sleep, Instant};

/// A seeded random mix of faults for `plan.nemesis` while linked contenders keep
/// cycling: link partitions, delays and resets, server pauses, and crashes with restart
/// (of a minority of members on clusters and RedLock, of the server otherwise).
pub async fn nemesis(scene: Scene<'_>) -> ScenarioReport {
    let (target, plan) = (scene.target, scene.plan);
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let name = unique_name(scene.scenario);
    let resource = FencedResource::new();
    let notes = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut links = Vec::new();
    for _ in 0..3 {
        let (client, link) = target.linked_client(options(&plan)).await;
        clients.push(client);
        links.push(link);
    }
    let started = Instant::now();
    let until = started + plan.nemesis;
    let contention = tokio::spawn(contend(
        clients,
        name.clone(),
        resource.clone(),
        until,
        Arc::clone(&notes),
    ));
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let servers = target.servers();
    let topology = target.topology();
    let mut faults: Vec<String> = Vec::new();
    while Instant::now() + plan.ttl < until {
        let pause = plan.ttl.mul_f64(rng.random_range(0.2..1.0));
        sleep(pause).await;
        let hold = plan.ttl.mul_f64(rng.random_range(0.3..1.6));
        let link = &links[rng.random_range(0..links.len())];
        let pick = rng.random_range(0..if servers.is_empty() { 1 } else { 5 });
        match pick {
            0 => {
                faults.push(format!("partition {hold:?}"));
                link.cut();
                sleep(hold).await;
                link.heal();
            }
            1 => {
                let delayed = link.set_mode(ProxyMode::Delay {
                    base: plan.ttl / 2,
                    jitter: plan.ttl / 10,
                });
                if delayed {
                    faults.push(format!("delay {:?} for {hold:?}", plan.ttl / 2));
                    sleep(hold).await;
                    link.heal();
                } else {
                    faults.push("no delay (the link cannot)".into());
                }
            }
            2 => {
                let reset = link.set_mode(ProxyMode::Reset);
                faults.push(
                    if reset {
                        "reset"
                    } else {
                        "no reset (the link cannot)"
                    }
                    .into(),
                );
                link.heal();
            }
            3 => {
                faults.push(format!("pause servers {hold:?}"));
                servers.iter().for_each(|s| {
                    let _ = s.pause();
                });
                sleep(hold).await;
                servers.iter().for_each(|s| {
                    let _ = s.resume();
                });
            }
            _ => {
                let which: Vec<usize> = match topology {
                    Topology::Quorum { members, .. } | Topology::Independent { nodes: members } => {
                        vec![rng.random_range(0..members)]
                    }
                    _ => (0..servers.len()).collect(),
                };
                faults.push(format!("crash and restart {which:?}"));
                let note = |text: String| notes.lock().expect("notes").push(text);
                let wipe = matches!(topology, Topology::Independent { .. });
                crash_members(&servers, &which, wipe, hold / 4, &note).await;
            }
        }
    }
    if let Err(err) = contention.await {
        notes
            .lock()
            .expect("notes")
            .push(format!("contention panicked: {err}"));
    }
    links.iter().for_each(Link::heal);
    let recovery = recover(target, &name, plan).await;
    let mut notes = notes.lock().expect("notes").clone();
    notes.push(format!(
        "seed {}: {} faults in {:?}: {}",
        plan.seed,
        faults.len(),
        started.elapsed(),
        faults.join(", ")
    ));
    report(scene.scenario, target, &resource, recovery, notes)
}
