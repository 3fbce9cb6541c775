//! The check before each step of a migration: watch a set of names for a while and
//! report what the step would stop excluding (old-only or new-only clients still running)
//! and whether fencing tokens could go back after it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::{sleep, Instant};

use super::{is_dual_token, DualConfig};
use crate::durations::format_duration;
use crate::erased::AnyBackend;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::LockOptionsBuilder;
use crate::registry::Registry;
use crate::state::Side;

/// A step of a migration, named by the phase processes leave and the one they enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// Old-only processes restart as dual. Old-only and dual then coexist, which is safe
    /// for fencing only while the new side's counter is within the old side's tokens.
    OldToDual,
    /// Dual processes restart as new-only. Safe once no old-only process is left: the
    /// check watches the old side for holders and waiters without the dual mark.
    DualToNew,
    /// New-only processes restart as dual (rolling back). Always safe.
    NewToDual,
    /// Dual processes restart as old-only (rolling back). Safe once no new-only process is
    /// left (the check watches the new side) and the new side's counter is within the old
    /// side's tokens.
    DualToOld,
}

impl Step {
    /// Every step, in rollout order.
    pub const ALL: [Step; 4] = [
        Step::OldToDual,
        Step::DualToNew,
        Step::NewToDual,
        Step::DualToOld,
    ];

    /// The step's name on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::OldToDual => "old-to-dual",
            Step::DualToNew => "dual-to-new",
            Step::NewToDual => "new-to-dual",
            Step::DualToOld => "dual-to-old",
        }
    }

    /// The side whose unmarked participants the step would stop excluding.
    pub fn watched_side(self) -> Option<Side> {
        match self {
            Step::DualToNew => Some(Side::Old),
            Step::DualToOld => Some(Side::New),
            Step::OldToDual | Step::NewToDual => None,
        }
    }

    /// Whether old-only and dual processes coexist after the step.
    fn mixes_old_and_dual(self) -> bool {
        matches!(self, Step::OldToDual | Step::DualToOld)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Step {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Step::ALL
            .into_iter()
            .find(|step| step.as_str() == text)
            .ok_or_else(|| {
                Error::config(format!(
                    "unknown migration step `{text}`: expected one of {}",
                    Step::ALL.map(Step::as_str).join(", ")
                ))
            })
    }
}

/// How long and how often the check looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckOptions {
    /// How long to watch. A process that takes the lock less often than this may be
    /// missed: watch for longer than the longest gap between two acquisitions.
    pub watch: Duration,
    /// Pause between two looks at every name. Holds shorter than this may be missed
    /// (waiters queued behind them are seen on backends that queue).
    pub interval: Duration,
}

impl Default for CheckOptions {
    /// Watch for a minute, looking every 100 ms.
    fn default() -> Self {
        CheckOptions {
            watch: Duration::from_secs(60),
            interval: Duration::from_millis(100),
        }
    }
}

/// Whether a participant held the lock or waited for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It held the lock.
    Holder,
    /// It waited for the lock.
    Waiter,
}

/// Participants without the dual mark seen on the watched side: one per client session
/// where the server knows sessions (one process's acquisitions share one), else one per
/// acquisition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sighting {
    /// The lock name.
    pub name: String,
    /// The side it was seen on.
    pub side: Side,
    /// Holder or waiter.
    pub role: Role,
    /// The client session (ZooKeeper session id, etcd lease id, Redis client id of a
    /// waiter), where the server keeps one.
    pub session: Option<String>,
    /// The owner token of the first acquisition seen, if the layout keeps one.
    pub owner_token: Option<String>,
    /// How many distinct acquisitions (owner tokens) were seen.
    pub acquisitions: u32,
    /// How many looks saw it.
    pub times_seen: u32,
    /// When it was first seen, from the start of the check.
    #[serde(with = "crate::durations::duration_text")]
    pub first_seen: Duration,
}

/// A name whose new-side counter is not within the old side's tokens: old-only holders
/// after the step could get fencing tokens below a dual or new-only holder's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenGap {
    /// The lock name.
    pub name: String,
    /// Every later old-side token is above this; `None` if the old side cannot say.
    pub old_floor: Option<u64>,
    /// The new side's counter.
    pub new_floor: Option<u64>,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// The step checked.
    pub step: Step,
    /// The names watched.
    pub names: Vec<String>,
    /// How many times every name was looked at.
    pub looks: u32,
    /// How long it watched.
    #[serde(with = "crate::durations::duration_text")]
    pub watched: Duration,
    /// Participants the step would stop excluding.
    pub unmarked: Vec<Sighting>,
    /// Names whose fencing tokens could go back after the step.
    pub token_gaps: Vec<TokenGap>,
    /// Looks that failed (the check is then incomplete).
    pub failures: Vec<String>,
}

impl CheckReport {
    /// Whether the step is safe as far as the check could see.
    pub fn is_clear(&self) -> bool {
        self.unmarked.is_empty() && self.token_gaps.is_empty() && self.failures.is_empty()
    }
}

/// How many unmarked participants the text form lists.
const SIGHTINGS_SHOWN: usize = 10;

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_clear() {
            "clear"
        } else {
            "NOT clear"
        };
        writeln!(
            f,
            "step {}: {verdict} ({} name(s), {} look(s) over {})",
            self.step,
            self.names.len(),
            self.looks,
            format_duration(self.watched)
        )?;
        for seen in self.unmarked.iter().take(SIGHTINGS_SHOWN) {
            let kind = match seen.side {
                Side::Old => "old-only",
                Side::New => "new-only",
            };
            let from = match &seen.session {
                Some(session) => format!(" from session {session}"),
                None => String::new(),
            };
            writeln!(
                f,
                "  {kind} {:?} on `{}`{from}: {} acquisition(s), seen {} time(s) from {}, \
                 owner token {}",
                seen.role,
                seen.name,
                seen.acquisitions,
                seen.times_seen,
                format_duration(seen.first_seen),
                seen.owner_token.as_deref().unwrap_or("(none)"),
            )?;
        }
        if let Some(more) = self.unmarked.len().checked_sub(SIGHTINGS_SHOWN) {
            if more > 0 {
                writeln!(
                    f,
                    "  … and {more} more (the serialized report lists them all)"
                )?;
            }
        }
        for gap in &self.token_gaps {
            let text = |floor: Option<u64>| floor.map_or("unknown".to_owned(), |t| t.to_string());
            writeln!(
                f,
                "  tokens could go back on `{}`: new-side counter {} is not below the old \
                 side's tokens (every later one above {})",
                gap.name,
                text(gap.new_floor),
                text(gap.old_floor)
            )?;
        }
        for failure in &self.failures {
            writeln!(f, "  look failed: {failure}")?;
        }
        Ok(())
    }
}

impl Registry {
    /// Checks whether `step` is safe for `names` of the dual lock `dual_url`
    /// (`dual:<old>|<new>`): watches the side the step would stop excluding for
    /// `options.watch` and reports its participants without the dual mark, and, when
    /// old-only and dual processes coexist after the step, the names whose new-side
    /// counter has outrun the old side's tokens.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a URL that is not a dual lock's or bad options;
    /// [`Error::Unsupported`] when the watched side cannot be inspected; connection
    /// errors when a side cannot be opened. Failed looks are reported, not raised.
    pub async fn migration_check(
        &self,
        dual_url: &str,
        step: Step,
        names: &[LockName],
        options: &CheckOptions,
    ) -> Result<CheckReport> {
        let config = DualConfig::from_url(dual_url)?
            .ok_or_else(|| Error::config("the migration check needs a `dual:` lock URL"))?;
        if options.interval.is_zero() {
            return Err(Error::config("the check's interval must be above zero"));
        }
        let (old, new) = config
            .open_sides(self, &LockOptionsBuilder::default())
            .await?;
        let mut report = CheckReport {
            step,
            names: names.iter().map(|name| name.to_string()).collect(),
            looks: 0,
            watched: Duration::ZERO,
            unmarked: Vec::new(),
            token_gaps: Vec::new(),
            failures: Vec::new(),
        };
        let started = Instant::now();
        if let Some(side) = step.watched_side() {
            let watched = match side {
                Side::Old => &old.backend,
                Side::New => &new.backend,
            };
            watch(&**watched, side, names, options, started, &mut report).await?;
        }
        if step.mixes_old_and_dual() {
            for name in names {
                match token_gap(&*old.backend, &*new.backend, name).await {
                    Ok(Some(gap)) => report.token_gaps.push(gap),
                    Ok(None) => {}
                    Err(err) => report
                        .failures
                        .push(format!("comparing the token spaces of `{name}`: {err}")),
                }
            }
        }
        report.watched = whole_millis(started.elapsed());
        Ok(report)
    }
}

/// Name, role, and the session (or, without one, the owner token) of a sighting.
type SightingKey = (String, Role, Option<String>);

/// Looks at every name every `options.interval` until `options.watch` has passed.
async fn watch(
    backend: &dyn AnyBackend,
    side: Side,
    names: &[LockName],
    options: &CheckOptions,
    started: Instant,
    report: &mut CheckReport,
) -> Result<()> {
    let deadline = started + options.watch;
    let mut seen: BTreeMap<SightingKey, (Sighting, BTreeSet<String>)> = BTreeMap::new();
    loop {
        let looks = futures::future::join_all(names.iter().map(|name| backend.inspect(name)));
        let at = whole_millis(started.elapsed());
        for (name, look) in names.iter().zip(looks.await) {
            let occupancy = match look {
                Ok(occupancy) => occupancy,
                Err(err @ Error::Unsupported { .. }) => return Err(err),
                Err(err) => {
                    report.failures.push(format!("`{name}` at {at:?}: {err}"));
                    continue;
                }
            };
            for (role, participant) in roles(&occupancy) {
                if participant
                    .owner_token
                    .as_deref()
                    .is_some_and(is_dual_token)
                {
                    continue;
                }
                let who = participant
                    .session
                    .clone()
                    .or_else(|| participant.owner_token.clone());
                let (sighting, tokens) =
                    seen.entry((name.to_string(), role, who))
                        .or_insert_with(|| {
                            let sighting = Sighting {
                                name: name.to_string(),
                                side,
                                role,
                                session: participant.session.clone(),
                                owner_token: participant.owner_token.clone(),
                                acquisitions: 0,
                                times_seen: 0,
                                first_seen: at,
                            };
                            (sighting, BTreeSet::new())
                        });
                sighting.times_seen += 1;
                if let Some(token) = &participant.owner_token {
                    tokens.insert(token.clone());
                }
                sighting.acquisitions = u32::try_from(tokens.len().max(1)).unwrap_or(u32::MAX);
            }
        }
        report.looks += 1;
        if Instant::now() + options.interval >= deadline {
            break;
        }
        sleep(options.interval).await;
    }
    report.unmarked = seen.into_values().map(|(sighting, _)| sighting).collect();
    Ok(())
}

/// `elapsed` cut to whole milliseconds, for reports.
fn whole_millis(elapsed: Duration) -> Duration {
    Duration::from_millis(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

fn roles(occupancy: &Occupancy) -> impl Iterator<Item = (Role, &Participant)> {
    let holders = occupancy.holders().map(|holder| (Role::Holder, holder));
    holders.chain(
        occupancy
            .waiters
            .iter()
            .map(|waiter| (Role::Waiter, waiter)),
    )
}

/// Whether the new side's counter for `name` has outrun the old side's tokens. The new
/// side is read first: floors only grow, so a later old floor can only make the answer
/// safer than the truth, never the other way.
async fn token_gap(
    old: &dyn AnyBackend,
    new: &dyn AnyBackend,
    name: &LockName,
) -> Result<Option<TokenGap>> {
    let new_floor = new.inspect(name).await?.token_floor.map(|t| t.get());
    let old_floor = old.inspect(name).await?.token_floor.map(|t| t.get());
    let safe = match (new_floor, old_floor) {
        (None, _) => true,
        (Some(counter), Some(old_floor)) => counter <= old_floor,
        (Some(_), None) => false,
    };
    Ok((!safe).then(|| TokenGap {
        name: name.to_string(),
        old_floor,
        new_floor,
    }))
}
