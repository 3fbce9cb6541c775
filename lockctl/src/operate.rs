//! `status`, `list`, `break`, `leader` and `observe`: who holds a lock (or leads an
//! election), which locks are held, removing a wedged hold, following an election, in
//! words for people and in JSON for scripts. An election's name is a lock name whose
//! holder is the leader and whose waiters are the other candidates, each with its value.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use distlock::{DistributedLock, Election, Leader, LockName, Occupancy, Participant};
use futures::stream::{self, StreamExt, TryStreamExt};
use serde_json::{json, Value};

use crate::{closing, BoxError, EXIT_NO, EXIT_USAGE};

/// `lockctl leader NAME`: exit 0 if someone leads, 3 if nobody does.
pub(crate) async fn leader(url: &str, name: &str, json: bool) -> Result<ExitCode, BoxError> {
    let locks = distlock::connect(url).await?;
    closing(locks.as_ref(), async {
        let election = Election::new(std::sync::Arc::clone(&locks), name)?;
        let leader = election.leader().await?;
        if json {
            println!("{:#}", leader_json(election.name(), leader.as_ref()));
        } else {
            println!(
                "{}",
                leader_text(election.name(), leader.as_ref(), SystemTime::now())
            );
        }
        Ok(if leader.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_NO)
        })
    })
    .await
}

/// `lockctl observe NAME`: a line per change until SIGINT, SIGTERM or SIGHUP (exit 0).
pub(crate) async fn observe(url: &str, name: &str, json: bool) -> Result<ExitCode, BoxError> {
    use tokio::signal::unix::{signal, SignalKind};
    let locks = distlock::connect(url).await?;
    closing(locks.as_ref(), async {
        let election = Election::new(std::sync::Arc::clone(&locks), name)?;
        let mut observer = election.observe();
        let (mut term, mut int, mut hup) = (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
        );
        loop {
            let change = tokio::select! {
                change = observer.next() => change?,
                _ = term.recv() => return Ok(ExitCode::SUCCESS),
                _ = int.recv() => return Ok(ExitCode::SUCCESS),
                _ = hup.recv() => return Ok(ExitCode::SUCCESS),
            };
            let line = if json {
                leader_json(election.name(), change.as_ref()).to_string()
            } else {
                leader_text(election.name(), change.as_ref(), SystemTime::now())
            };
            // A reader of a pipe sees each change as it happens.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}")?;
            out.flush()?;
        }
    })
    .await
}

fn leader_json(name: &LockName, leader: Option<&Leader>) -> Value {
    json!({
        "name": name.as_str(),
        "leader": leader.map(|leader| json!({
            "value": leader.value_text(),
            "term": leader.term.get(),
            "version": leader.version,
            "since": leader.since.map(|at| humantime::format_rfc3339_millis(at).to_string()),
            "since_unix_ms": leader.since.and_then(unix_ms),
            "owner_token": leader.participant.owner_token,
            "session": leader.participant.session,
        })),
    })
}

fn leader_text(name: &LockName, leader: Option<&Leader>, now: SystemTime) -> String {
    let Some(leader) = leader else {
        return format!("{name}: no leader");
    };
    let mut text = format!(
        "{name}: leader {:?}, term {}",
        leader.value_text(),
        leader.term
    );
    if let Some(since) = leader.since {
        let _ = write!(text, ", since {}", humantime::format_rfc3339_millis(since));
        if let Ok(ago) = now.duration_since(since) {
            let _ = write!(text, " ({} ago)", short_duration(ago));
        }
    }
    text
}

/// How many names `list --long` inspects at once.
const LIST_CONCURRENCY: usize = 16;

/// `lockctl status NAME`: exit 0 if held, 3 if free.
pub(crate) async fn status(url: &str, name: &str, json: bool) -> Result<ExitCode, BoxError> {
    let name = LockName::new(name)?;
    let locks = distlock::connect(url).await?;
    closing(locks.as_ref(), async {
        let occupancy = locks.inspect(&name).await?;
        if json {
            println!("{:#}", occupancy_json(&name, &occupancy));
        } else {
            print!("{}", occupancy_text(&name, &occupancy, SystemTime::now()));
        }
        Ok(if occupancy.holder.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_NO)
        })
    })
    .await
}

/// `lockctl list [PREFIX]`.
pub(crate) async fn list(
    url: &str,
    prefix: &str,
    long: bool,
    json: bool,
) -> Result<ExitCode, BoxError> {
    let locks = distlock::connect(url).await?;
    closing(locks.as_ref(), async {
        let names = locks.list(prefix).await?;
        if !long {
            if json {
                let names: Vec<Value> = names
                    .iter()
                    .map(|name| json!({ "name": name.as_str() }))
                    .collect();
                println!("{:#}", Value::Array(names));
            } else {
                for name in &names {
                    println!("{name}");
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        let looks: Vec<(LockName, Occupancy)> = inspect_all(locks.as_ref(), names).await?;
        if json {
            let looks: Vec<Value> = looks
                .iter()
                .map(|(name, occupancy)| occupancy_json(name, occupancy))
                .collect();
            println!("{:#}", Value::Array(looks));
        } else {
            print!("{}", list_text(&looks, SystemTime::now()));
        }
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// Inspects every name of `names`, a few at a time, in their order. A name released since
/// the listing shows with no holder.
async fn inspect_all(
    locks: &dyn DistributedLock,
    names: Vec<LockName>,
) -> Result<Vec<(LockName, Occupancy)>, distlock::Error> {
    stream::iter(names)
        .map(|name| async move {
            let occupancy = locks.inspect(&name).await?;
            Ok::<_, distlock::Error>((name, occupancy))
        })
        .buffered(LIST_CONCURRENCY)
        .try_collect()
        .await
}

/// `lockctl break NAME [--force]`: exit 0 if a hold was removed, 3 if none was there, 2
/// without `--force` (nothing is touched then; what would be broken is shown, with
/// `--json` as `status --json` shows it).
pub(crate) async fn break_lock(
    url: &str,
    name: &str,
    force: bool,
    json: bool,
) -> Result<ExitCode, BoxError> {
    let name = LockName::new(name)?;
    let locks = distlock::connect(url).await?;
    closing(locks.as_ref(), async {
        if !force {
            let occupancy = locks.inspect(&name).await?;
            if json {
                println!("{:#}", occupancy_json(&name, &occupancy));
            } else {
                eprint!("{}", occupancy_text(&name, &occupancy, SystemTime::now()));
            }
            eprintln!(
                "lockctl: not breaking `{name}` without --force: the holder may still be working \
                 until its next renewal notices, and only fenced writes are safe meanwhile"
            );
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        let broken = locks.force_release(&name).await?;
        if json {
            let holder = broken.as_ref().map(participant_json);
            println!("{:#}", json!({ "name": name.as_str(), "broken": holder }));
        } else {
            match &broken {
                Some(holder) => println!(
                    "broke `{name}`: removed {}",
                    participant_text(holder, SystemTime::now())
                ),
                None => println!("`{name}` was not held; nothing to break"),
            }
        }
        Ok(if broken.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_NO)
        })
    })
    .await
}

/// Milliseconds since the Unix epoch.
fn unix_ms(at: SystemTime) -> Option<u64> {
    let ms = at.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis();
    u64::try_from(ms).ok()
}

fn participant_json(participant: &Participant) -> Value {
    json!({
        "owner_token": participant.owner_token,
        "fencing_token": participant.fencing_token.map(|t| t.get()),
        "lease_left_ms": participant.lease_left.map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
        "session": participant.session,
        "kind": participant.kind.as_ref().map(|kind| kind.label()),
        "permits": match participant.kind {
            Some(distlock::raw::backend::HoldKind::Permit { permits, .. }) => Some(permits),
            _ => None,
        },
        "count": participant.kind.as_ref().map(|kind| kind.weight()),
        "value": participant.value.as_deref().map(String::from_utf8_lossy),
        "value_version": participant.value_version,
        "since": participant.since.map(|at| humantime::format_rfc3339_millis(at).to_string()),
        "since_unix_ms": participant.since.and_then(unix_ms),
    })
}

fn occupancy_json(name: &LockName, occupancy: &Occupancy) -> Value {
    json!({
        "name": name.as_str(),
        "held": occupancy.holder.is_some(),
        "holder": occupancy.holder.as_ref().map(participant_json),
        "holders": occupancy.holders().map(participant_json).collect::<Vec<_>>(),
        "waiters": occupancy.waiters.iter().map(participant_json).collect::<Vec<_>>(),
        "token_floor": occupancy.token_floor.map(|t| t.get()),
    })
}

/// A short human duration: `850ms`, `12.3s`, `4m05s`, `2h03m`.
fn short_duration(value: Duration) -> String {
    let secs = value.as_secs();
    if value < Duration::from_secs(1) {
        format!("{}ms", value.as_millis())
    } else if secs < 60 {
        format!("{:.1}s", value.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs / 60 % 60)
    }
}

/// One participant on one line: what the backend shows of it, `now` dating `since`.
fn participant_text(participant: &Participant, now: SystemTime) -> String {
    let mut text = match &participant.kind {
        Some(kind) => format!("{} ", role(kind)),
        None => String::new(),
    };
    match &participant.owner_token {
        Some(owner) => {
            let _ = write!(text, "owner {owner}");
        }
        None => text.push_str("owner not recorded"),
    }
    if let Some(value) = shown_value(participant) {
        let _ = write!(text, ", value {value:?}");
    }
    if let Some(token) = participant.fencing_token {
        let _ = write!(text, ", fencing token {token}");
    }
    if let Some(left) = participant.lease_left {
        let _ = write!(text, ", lease left {}", short_duration(left));
    }
    if let Some(since) = participant.since {
        let _ = write!(text, ", since {}", humantime::format_rfc3339_millis(since));
        if let Ok(ago) = now.duration_since(since) {
            let _ = write!(text, " ({} ago)", short_duration(ago));
        }
    }
    if let Some(session) = &participant.session {
        let _ = write!(text, ", session {session}");
    }
    text
}

/// What a participant of a kind holds or waits for: `permit of 4`, `reader`, `writer`,
/// `upgradeable reader`.
fn role(kind: &distlock::raw::backend::HoldKind) -> String {
    match kind {
        distlock::raw::backend::HoldKind::Permit { permits, count: 1 } => {
            format!("permit of {permits},")
        }
        distlock::raw::backend::HoldKind::Permit { permits, count } => {
            format!("{count} permits of {permits},")
        }
        distlock::raw::backend::HoldKind::Read => "reader,".to_owned(),
        distlock::raw::backend::HoldKind::Write => "writer,".to_owned(),
        distlock::raw::backend::HoldKind::Upgradeable => "upgradeable reader,".to_owned(),
        other => format!("{},", other.label()),
    }
}

/// The value a participant stored (an election candidate's), unless it only repeats its
/// owner token (a layout that stores one value per entry shows it as both).
fn shown_value(participant: &Participant) -> Option<std::borrow::Cow<'_, str>> {
    let value = participant.value.as_deref()?;
    let repeats_owner = participant
        .owner_token
        .as_ref()
        .is_some_and(|owner| owner.as_bytes() == value);
    (!repeats_owner).then(|| String::from_utf8_lossy(value))
}

fn occupancy_text(name: &LockName, occupancy: &Occupancy, now: SystemTime) -> String {
    let mut text = String::new();
    match occupancy.holders().count() {
        0 => {
            let _ = writeln!(text, "{name}: free");
        }
        1 => {
            let _ = writeln!(text, "{name}: held");
            for holder in occupancy.holders() {
                let _ = writeln!(text, "  holder: {}", participant_text(holder, now));
            }
        }
        n => {
            let _ = writeln!(text, "{name}: held by {n}, oldest first:");
            for (i, holder) in occupancy.holders().enumerate() {
                let _ = writeln!(text, "    {}. {}", i + 1, participant_text(holder, now));
            }
        }
    }
    match occupancy.waiters.len() {
        0 => {}
        n => {
            let _ = writeln!(text, "  waiters: {n}, in queue order:");
            for (i, waiter) in occupancy.waiters.iter().enumerate() {
                let _ = writeln!(text, "    {}. {}", i + 1, participant_text(waiter, now));
            }
        }
    }
    if let Some(floor) = occupancy.token_floor {
        let _ = writeln!(text, "  next fencing token above {floor}");
    }
    text
}

fn list_text(looks: &[(LockName, Occupancy)], now: SystemTime) -> String {
    let mut text = String::new();
    for (name, occupancy) in looks {
        let mut holder = occupancy
            .holder
            .as_ref()
            .map_or_else(|| "free now".to_owned(), |h| participant_text(h, now));
        if !occupancy.co_holders.is_empty() {
            let _ = write!(holder, ", and {} more holding", occupancy.co_holders.len());
        }
        let waiting = match occupancy.waiters.len() {
            0 => String::new(),
            n => format!(", {n} waiting"),
        };
        let _ = writeln!(text, "{name}  {holder}{waiting}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(short_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(short_duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(short_duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(short_duration(Duration::from_secs(7380)), "2h03m");
    }

    #[test]
    fn values_show_unless_they_repeat_the_owner() {
        let now = SystemTime::now();
        let candidate = Participant::new(None).value(Some(b"10.0.0.1:8080".to_vec()));
        assert_eq!(
            participant_text(&candidate, now),
            "owner not recorded, value \"10.0.0.1:8080\""
        );
        let mutex = Participant::new(Some("t".into())).value(Some(b"t".to_vec()));
        assert_eq!(participant_text(&mutex, now), "owner t");
        let permit = Participant::new(Some("p".into()))
            .kind(Some(distlock::raw::backend::HoldKind::permit(4)));
        assert_eq!(participant_text(&permit, now), "permit of 4, owner p");
        assert_eq!(participant_json(&permit)["kind"], Value::from("permit"));
        assert_eq!(participant_json(&permit)["permits"], Value::from(4));
        assert_eq!(
            participant_json(&candidate)["value"],
            Value::from("10.0.0.1:8080")
        );
        assert_eq!(
            participant_json(&Participant::new(None))["value"],
            Value::Null
        );
    }
}
