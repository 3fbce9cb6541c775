//! The hold ([`RedisHold`]) and its server side: renewal and release, each decided by a
//! majority of answers.
//!
//! Renewal is batched (one script call per server, on Redis Cluster per primary, renews
//! every hold of the client there, compare-and-PEXPIRE per key); release is
//! compare-and-DEL plus a wake-up of the head of the queue, or a publish to the name's
//! channel without the queue.
//! Both read the break mark of a key that is no longer theirs, to tell a force release
//! (`Broken`) from a key taken or gone. Renewal on Redis Cluster is in `hold/cluster.rs`.

mod cluster;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lock_core::raw::{AcquireRequest, Amended, BackendRelease, HoldKind, RenewItem, RenewOutcome};
use lock_core::{FencingToken, LockName, LostReason, OwnerToken, Result};
use redis::ScriptInvocation;
use tokio::time::Instant;

use crate::connection::{slot_of, Route};
use crate::error;
use crate::layout;
use crate::topology::{Servers, Topology};

/// Keys per renewal script call; bigger batches are split into several calls sent
/// together on the same connection.
const RENEW_CHUNK: usize = 1000;

/// One hold on Redis: the lock key and the owner token stored in it.
#[derive(Debug, Clone)]
pub struct RedisHold {
    pub(crate) name: LockName,
    /// Shared by the copies of a hold (and by the rounds of a RedLock acquisition).
    pub(crate) keys: Arc<HoldKeys>,
    pub(crate) token: OwnerToken,
}

/// The keys of a hold.
#[derive(Debug)]
pub(crate) struct HoldKeys {
    pub(crate) key: String,
    pub(crate) fence_key: String,
    /// The break mark (see [`KeyLayout`](crate::KeyLayout)).
    pub(crate) broken: String,
    pub(crate) wake: WakeKeys,
    /// A candidate of an election: its entry's keys and value.
    pub(crate) candidate: Option<CandidateKeys>,
    /// A permit, a reader or a writer: the keys of the shared kinds (see `shared.lua`).
    pub(crate) shared: Option<SharedKeys>,
}

/// What a hold of a shared kind (a permit, a reader, a writer) keeps beside its lock
/// key, a sorted set of holders (see `shared.lua`).
#[derive(Debug)]
pub(crate) struct SharedKeys {
    /// The holders' table.
    pub(crate) table: String,
    /// The name's change channel.
    pub(crate) changed: String,
    /// The hold's kind as the scripts spell it: `R`, `W` or `P<permits>`.
    pub(crate) kind: String,
}

/// `kind` as the scripts of the shared kinds spell it (`R`, `W`, `P<permits>`); `None`
/// for the exclusive kinds, which hold the plain lock key.
pub(crate) fn shared_kind(kind: &HoldKind) -> Option<String> {
    match kind {
        HoldKind::Read => Some("R".into()),
        HoldKind::Write => Some("W".into()),
        HoldKind::Permit { permits } => Some(format!("P{permits}")),
        _ => None,
    }
}

/// The kind a conflict reply of `acquire_s.lua` names: its permits, 0 for a read-write
/// lock, -1 for a mutex or an election.
pub(crate) fn kind_named(code: i64) -> HoldKind {
    match u32::try_from(code) {
        Ok(0) => HoldKind::Read,
        Ok(permits) => HoldKind::Permit { permits },
        Err(_) => HoldKind::Mutex,
    }
}

/// What a candidate's hold keeps beside the lock key (see `leader.lua`).
#[derive(Debug)]
pub(crate) struct CandidateKeys {
    /// The leader hash.
    pub(crate) leader: String,
    /// The election's change channel.
    pub(crate) changed: String,
    /// The value stored with the grant.
    pub(crate) value: Vec<u8>,
    /// The version of the last proclaim sent (0: the value of the grant).
    pub(crate) proclaims: AtomicU64,
}

impl HoldKeys {
    /// The leader hash as the scripts that renew or release take it: "" for a mutex.
    pub(crate) fn leader_arg(&self) -> &str {
        self.candidate.as_ref().map_or("", |c| c.leader.as_str())
    }

    /// The third argument of a hold's renewal: the leader hash of a candidate, the
    /// holders' table of a shared kind, "" for a mutex (see `renew.lua`).
    pub(crate) fn renew_arg(&self) -> &str {
        match &self.shared {
            Some(shared) => &shared.table,
            None => self.leader_arg(),
        }
    }

    /// The change channel as the release scripts take it: "" for a mutex.
    pub(crate) fn changed_arg(&self) -> &str {
        self.candidate.as_ref().map_or("", |c| c.changed.as_str())
    }
}

/// How the waiters of a name learn of its release.
#[derive(Debug, Clone)]
pub(crate) enum WakeKeys {
    /// They queue in these sorted sets (see [`KeyLayout`](crate::KeyLayout)), this
    /// acquisition as `waiter` (`<client id>/<owner token of its first round>`); a release
    /// wakes the head.
    Queue {
        queue: String,
        live: String,
        waiter: String,
    },
    /// They listen to this channel of the name; a release is published to all.
    Channel(String),
}

impl RedisHold {
    /// The hold `request` would take, with its keys under `servers`' layout and, with the
    /// queue, its waiter id `<client id>/<owner token>`.
    pub(crate) fn new(servers: &Servers, request: &AcquireRequest<'_>) -> RedisHold {
        let keys = &servers.keys;
        let key = keys.lock_key(request.name);
        let wake = if servers.config.queue {
            WakeKeys::Queue {
                queue: keys.side_key(&key, layout::QUEUE),
                live: keys.side_key(&key, layout::QUEUE_LIVE),
                waiter: format!("{}/{}", servers.client_id, request.token),
            }
        } else {
            WakeKeys::Channel(keys.side_key(&key, layout::RELEASED))
        };
        let candidate = match request.kind {
            HoldKind::Candidate { value } => Some(CandidateKeys {
                leader: keys.side_key(&key, layout::LEADER),
                changed: keys.side_key(&key, layout::CHANGED),
                value: value.clone(),
                proclaims: AtomicU64::new(0),
            }),
            _ => None,
        };
        let shared = shared_kind(request.kind).map(|kind| SharedKeys {
            table: keys.side_key(&key, layout::HOLDERS),
            changed: keys.side_key(&key, layout::CHANGED),
            kind,
        });
        RedisHold {
            name: request.name.clone(),
            keys: Arc::new(HoldKeys {
                fence_key: keys.side_key(&key, layout::FENCE),
                broken: keys.side_key(&key, layout::BROKEN),
                key,
                wake,
                candidate,
                shared,
            }),
            token: request.token.clone(),
        }
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.keys.key
    }

    /// The owner token stored in the lock key. On RedLock, an acquisition that needed
    /// several rounds stores its token with a `~<round>` suffix.
    pub fn token(&self) -> &OwnerToken {
        &self.token
    }

    /// The id of the acquisition in the waiter queue ("" without the queue).
    pub(crate) fn waiter(&self) -> &str {
        match &self.keys.wake {
            WakeKeys::Queue { waiter, .. } => waiter,
            WakeKeys::Channel(_) => "",
        }
    }

    /// The hold a RedLock round would take: round 0 uses the acquisition's token.
    pub(crate) fn for_round(&self, round: u64) -> RedisHold {
        if round == 0 {
            return self.clone();
        }
        RedisHold {
            token: OwnerToken::from_string(format!("{}~{round}", self.token)),
            ..self.clone()
        }
    }
}

/// The acquisition's owner token in `value`, a lock key's value on RedLock: without the
/// `~<round>` suffix of a later round (see [`RedisHold::for_round`]).
pub(crate) fn acquisition_token(value: &str) -> &str {
    match value.rsplit_once('~') {
        Some((token, round)) if !round.is_empty() && round.bytes().all(|b| b.is_ascii_digit()) => {
            token
        }
        _ => value,
    }
}

/// What the renewal and release scripts say of one hold on one server.
pub(crate) mod status {
    /// Renewed or released.
    pub(crate) const DONE: i64 = 1;
    /// Held by another owner.
    pub(crate) const TAKEN: i64 = -1;
    /// Removed by a force release (the break mark lists the owner token).
    pub(crate) const BROKEN: i64 = -2;
    /// Not served by the Redis Cluster node asked (renewal only).
    pub(crate) const ELSEWHERE: i64 = -3;
}

/// Why a hold is lost, from the statuses of the servers that answered: broken where any
/// says so (an operator removed it there, the rest follows from that), else taken where
/// any says so, else gone.
fn lost_reason(statuses: impl Iterator<Item = i64>) -> LostReason {
    let mut reason = LostReason::Vanished;
    for status in statuses {
        match status {
            status::BROKEN => return LostReason::Broken,
            status::TAKEN => reason = LostReason::Taken,
            _ => {}
        }
    }
    reason
}

/// TTL in whole milliseconds (at least 1), as Redis takes it.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A fencing token floor as the acquire scripts take it: the decimal token, "" for none.
pub(crate) fn floor_arg(floor: Option<FencingToken>) -> String {
    floor
        .map(|floor| floor.get().to_string())
        .unwrap_or_default()
}

/// How long to wait before retrying a lock whose holder's key expires in `pttl` ms.
pub(crate) fn pttl_wait(pttl: i64) -> Duration {
    match u64::try_from(pttl) {
        // Wait until just past the expiry.
        Ok(ms) => Duration::from_millis(ms.saturating_add(1)),
        // -1: a key without expiry (written by someone else); -2: gone already.
        Err(_) if pttl == -1 => Duration::MAX,
        Err(_) => Duration::ZERO,
    }
}

/// `script` for `hold`, with the keys of `queue.lua` and the owner token as first argument.
pub(crate) fn queue_invocation<'a>(
    script: &'a redis::Script,
    hold: &RedisHold,
) -> ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    invocation.key(&hold.keys.key).key(&hold.keys.fence_key);
    if let WakeKeys::Queue { queue, live, .. } = &hold.keys.wake {
        invocation.key(queue).key(live);
    }
    invocation.arg(hold.token.as_str());
    invocation
}

/// The queue's release of `hold` (see `release_q.lua`); with `leave`, its waiter also
/// leaves the queue. On Redis Cluster, a release refused while the slot migrates
/// (`TRYAGAIN`: the queue's keys are not all on one node) falls back to the plain release
/// of the lock key alone (see [`release_each`]).
fn release_q_invocation<'s>(
    servers: &'s Servers,
    hold: &RedisHold,
    leave: bool,
) -> ScriptInvocation<'s> {
    let mut invocation = queue_invocation(&servers.scripts.release_q, hold);
    invocation
        .arg(if leave { hold.waiter() } else { "" })
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(ttl_millis(servers.queue_times.window))
        .arg(hold.keys.leader_arg())
        .arg(hold.keys.changed_arg());
    servers.pass_break_mark(&mut invocation, &hold.keys.broken);
    invocation
}

/// Renews `items` on every server: one script call per server (per [`RENEW_CHUNK`] keys).
/// Each hold gets its own outcome: renewed when a majority of servers (the one server, on
/// `redis://`) renewed it, lost when a majority can no longer confirm it, and undecided
/// when the servers that did not answer could still tip it either way.
///
/// # Errors
/// When fewer than a majority of servers answered: then no hold can be decided.
pub(crate) async fn renew(
    servers: &Servers,
    items: &[RenewItem<'_, RedisHold>],
) -> Result<Vec<RenewOutcome>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let nodes = match &servers.topology {
        Topology::Cluster(shards) => return cluster::renew(servers, shards, items).await,
        topology => topology.nodes(),
    };
    let n = nodes.len();
    let quorum = servers.quorum();
    let config = &servers.config;
    let shortest = items.iter().map(|i| i.ttl).min().unwrap_or_default();
    let limit = if servers.topology.is_redlock() {
        // A slow server must not hold up the others' verdict past a third of the lease,
        // nor past the caller's bound on the whole renewal (`request_timeout`, counted from
        // a little earlier): the replies that did come must still be counted.
        let request_timeout = config.options.request_timeout;
        config
            .node_timeout_for(shortest)
            .min(shortest / 3)
            .min(request_timeout - request_timeout / 5)
    } else {
        config.options.request_timeout
    };
    let deadline = Instant::now() + limit;
    let per_node = join_all(nodes.iter().map(|node| async move {
        let calls = items.chunks(RENEW_CHUNK).map(|chunk| {
            let mut invocation = servers.scripts.renew.prepare_invoke();
            for item in chunk {
                invocation
                    .key(&item.hold.keys.key)
                    .key(&item.hold.keys.broken)
                    .arg(item.hold.token.as_str())
                    .arg(ttl_millis(item.ttl))
                    .arg(item.hold.keys.renew_arg());
            }
            async move {
                Route::Node(node)
                    .script::<Vec<i64>>("renew", deadline, &invocation)
                    .await
            }
        });
        let mut statuses = Vec::with_capacity(items.len());
        for chunk in join_all(calls).await {
            statuses.extend(chunk?);
        }
        if statuses.len() != items.len() {
            return Err(error::protocol(
                servers.backend,
                format!(
                    "renewal of {} locks on {} returned {} statuses",
                    items.len(),
                    node.label,
                    statuses.len()
                ),
            ));
        }
        Ok(statuses)
    }))
    .await;
    let answers = error::majority(servers.backend, quorum, per_node, "the renewal")?;
    let silent = n - answers.len();
    let mut outcomes = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let renewed = answers.iter().filter(|(_, a)| a[i] == status::DONE).count();
        if renewed >= quorum {
            outcomes.push(RenewOutcome::Renewed {
                lease: Duration::from_millis(ttl_millis(item.ttl)),
            });
        } else if renewed + silent >= quorum {
            // The servers that did not answer may still hold it: this hold alone is
            // undecided (Suspect, retried soon).
            outcomes.push(RenewOutcome::Undecided);
        } else {
            let reason = lost_reason(answers.iter().map(|(_, a)| a[i]));
            outcomes.push(RenewOutcome::Lost(reason));
        }
    }
    Ok(outcomes)
}

/// See [`Backend::renewal_group`](lock_core::raw::Backend::renewal_group): on Redis
/// Cluster the index of the primary that serves `hold`'s slot, `u64::MAX` for a slot
/// without one (the renewal finds its primary); 0 elsewhere.
pub(crate) fn renewal_group(topology: &Topology, hold: &RedisHold) -> u64 {
    let Some(shards) = topology.shards() else {
        return 0;
    };
    shards
        .owner_index(slot_of(hold.keys.key.as_bytes()))
        .and_then(|i| u64::try_from(i).ok())
        .unwrap_or(u64::MAX)
}

/// Runs the release script for `hold` on every server: 1 released, 0 gone, -1 held
/// by another owner, -2 broken (see [`status`]). With `leave`, a queued waiter of the
/// acquisition is also taken out of the queue. With `only`, just the servers it marks
/// (the others are left out of the result).
pub(crate) async fn release_each(
    servers: &Servers,
    hold: &RedisHold,
    leave: bool,
    only: Option<&[bool]>,
    deadline: Instant,
) -> Vec<Result<i64>> {
    // With the queue, the server that orders the waiters (the only one on `redis://`)
    // runs the queue's release, which wakes the head; the others a plain release.
    if let Some(shared) = &hold.keys.shared {
        return release_shared(servers, hold, shared, leave, deadline).await;
    }
    let (queued, channel) = match &hold.keys.wake {
        WakeKeys::Queue { .. } => (Some(release_q_invocation(servers, hold, leave)), ""),
        WakeKeys::Channel(channel) => (None, channel.as_str()),
    };
    let routes = servers.routes(&hold.keys.key);
    let cluster = servers.topology.shards().is_some();
    // On Redis Cluster the plain release is also the queue's release's fallback.
    let plain = (queued.is_none() || routes.len() > 1 || cluster).then(|| {
        let mut invocation = servers.scripts.release.prepare_invoke();
        invocation.key(&hold.keys.key);
        invocation
            .arg(hold.token.as_str())
            .arg(channel)
            .arg(hold.keys.leader_arg())
            .arg(hold.keys.changed_arg());
        servers.pass_break_mark(&mut invocation, &hold.keys.broken);
        invocation
    });
    let arbiter = servers.topology.arbiter();
    let selected = |i: &usize| only.is_none_or(|only| only[*i]);
    join_all((0..routes.len()).filter(selected).map(|i| {
        let route = routes[i];
        let (invocation, fallback) = match (&queued, &plain) {
            (Some(queued), plain) if i == arbiter => (queued, plain.as_ref()),
            (_, Some(plain)) => (plain, None),
            (Some(queued), None) => (queued, None),
            (None, None) => unreachable!("a release without a script"),
        };
        async move {
            match (route, fallback) {
                // Exclusion rests on the lock key alone: while the slot migrates, its
                // compare-and-DEL; the queued head is woken when its subscription
                // moves with the slot, or at its recheck.
                (Route::Slot(shards, slot), Some(fallback)) => {
                    match shards
                        .script_unless_busy::<i64>(slot, "release", deadline, invocation)
                        .await?
                    {
                        Some(status) => Ok(status),
                        None => route.script("release", deadline, fallback).await,
                    }
                }
                _ => route.script::<i64>("release", deadline, invocation).await,
            }
        }
    }))
    .await
}

/// The keys of the scripts of the shared kinds for `hold` (see `shared.lua`): lock,
/// fencing counter, queue, liveness, holders' table, break mark; with its owner token
/// as first argument.
fn shared_invocation<'a>(
    script: &'a redis::Script,
    hold: &RedisHold,
    shared: &SharedKeys,
) -> ScriptInvocation<'a> {
    let mut invocation = queue_invocation(script, hold);
    invocation.key(&shared.table).key(&hold.keys.broken);
    invocation
}

/// Runs a script of the shared kinds (`release_s.lua`, `downgrade.lua`) on the one
/// server that serves `hold` (shared kinds are not granted on RedLock).
async fn shared_call(
    servers: &Servers,
    hold: &RedisHold,
    what: &str,
    invocation: &ScriptInvocation<'_>,
    deadline: Instant,
) -> Vec<Result<i64>> {
    join_all(
        servers
            .routes(&hold.keys.key)
            .into_iter()
            .map(|route| async move { route.script::<i64>(what, deadline, invocation).await }),
    )
    .await
}

/// The release of a hold of a shared kind (`release_s.lua`): removes it from the holders,
/// with `leave` takes its waiter out of the queue, and grants the waiters the holders
/// then admit.
async fn release_shared(
    servers: &Servers,
    hold: &RedisHold,
    shared: &SharedKeys,
    leave: bool,
    deadline: Instant,
) -> Vec<Result<i64>> {
    let mut invocation = shared_invocation(&servers.scripts.release_s, hold, shared);
    invocation
        .arg(if leave { hold.waiter() } else { "" })
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(&shared.changed);
    shared_call(servers, hold, "release", &invocation, deadline).await
}

/// Downgrades `hold`, a writer's, to a reader's in its place (`downgrade.lua`), granting
/// the readers queued behind it in the same step.
///
/// # Errors
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) for a hold that is no
/// writer's; connection errors, after which the downgrade may or may not be done.
pub(crate) async fn downgrade(servers: &Servers, hold: &RedisHold) -> Result<Amended> {
    let shared = match &hold.keys.shared {
        Some(shared) if shared.kind == "W" => shared,
        _ => {
            return Err(lock_core::Error::config(format!(
                "cannot downgrade `{}`: only a read-write lock's write hold downgrades",
                hold.name
            )))
        }
    };
    let mut invocation = shared_invocation(&servers.scripts.downgrade, hold, shared);
    invocation
        .arg(servers.channel_prefix_for(&hold.keys.key))
        .arg(&shared.changed);
    let deadline = servers.request_deadline();
    let replies = shared_call(servers, hold, "downgrade", &invocation, deadline).await;
    Ok(
        match owner_checked(servers, replies, "downgrade", &hold.name)? {
            None => Amended::Done,
            Some(reason) => Amended::NotOwner(reason),
        },
    )
}

/// Releases `hold` on every server (compare-and-delete, then a wake-up); with `leave`,
/// also takes the acquisition's waiter out of the queue.
pub(crate) async fn release_all(
    servers: &Servers,
    hold: &RedisHold,
    leave: bool,
    deadline: Instant,
) -> Result<BackendRelease> {
    let replies = release_each(servers, hold, leave, None, deadline).await;
    Ok(
        match owner_checked(servers, replies, "release", &hold.name)? {
            None => BackendRelease::Released,
            Some(reason) => BackendRelease::NotOwner(reason),
        },
    )
}

/// What the servers' `replies` to an owner-checked write (`what`: the release or the
/// proclaim of `name`) decide: `None` when it was done on a majority (the one server, on
/// `redis://`), why the hold is not ours when a majority answered otherwise.
///
/// # Errors
/// When fewer than a majority answered: the write may then be done on some.
fn owner_checked(
    servers: &Servers,
    replies: Vec<Result<i64>>,
    what: &str,
    name: &LockName,
) -> Result<Option<LostReason>> {
    let (quorum, backend, servers_n) = (servers.quorum(), servers.backend, replies.len());
    let mut statuses = Vec::with_capacity(servers_n);
    let mut first_error = None;
    for reply in replies {
        match reply {
            Ok(status) => statuses.push(status),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    let done = statuses.iter().filter(|s| **s == status::DONE).count();
    let answered = statuses.len();
    if done >= quorum {
        Ok(None)
    } else if answered >= quorum {
        Ok(Some(lost_reason(statuses.into_iter())))
    } else if servers_n == 1 {
        Err(first_error.unwrap_or_else(|| error::protocol(backend, "no reply".into())))
    } else {
        Err(error::no_majority(
            backend,
            format!("only {answered} of {servers_n} servers answered the {what} of `{name}`"),
            first_error,
        ))
    }
}

/// Proclaims `value` as the value of `hold`, a candidate's, on every server: an
/// owner-checked write of its leader hash (see `proclaim.lua`), with a version above
/// every earlier proclaim of the hold, so that readers of several servers take the
/// newest value they see and a late retry never replaces a newer one. Done when a
/// majority of servers (the one server, on `redis://`) found the hold theirs.
///
/// # Errors
/// When fewer than a majority of servers answered: the value may then be stored on some.
pub(crate) async fn proclaim(servers: &Servers, hold: &RedisHold, value: &[u8]) -> Result<Amended> {
    let backend = servers.backend;
    let Some(candidate) = &hold.keys.candidate else {
        return Err(lock_core::Error::unsupported(
            backend,
            format!(
                "proclaiming on `{}`, a hold that no campaign took",
                hold.name
            ),
        ));
    };
    let version = candidate.proclaims.fetch_add(1, Ordering::AcqRel) + 1;
    let mut invocation = servers.scripts.proclaim.prepare_invoke();
    invocation
        .key(&hold.keys.key)
        .arg(hold.token.as_str())
        .arg(&candidate.leader)
        .arg(value)
        .arg(version)
        .arg(&candidate.changed);
    servers.pass_break_mark(&mut invocation, &hold.keys.broken);
    let deadline = servers.request_deadline();
    let routes = servers.routes(&hold.keys.key);
    let replies = join_all(routes.into_iter().map(|route| {
        let invocation = &invocation;
        async move { route.script::<i64>("proclaim", deadline, invocation).await }
    }))
    .await;
    Ok(
        match owner_checked(servers, replies, "proclaim", &hold.name)? {
            None => Amended::Done,
            Some(reason) => Amended::NotOwner(reason),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_the_holders_expiry() {
        assert_eq!(pttl_wait(250), Duration::from_millis(251));
        assert_eq!(pttl_wait(-1), Duration::MAX);
        assert_eq!(pttl_wait(-2), Duration::ZERO);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 1);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
    }

    #[test]
    fn round_suffixes_come_off_the_shown_owner_token() {
        let hold = RedisHold {
            name: LockName::new("jobs").unwrap(),
            keys: Arc::new(HoldKeys {
                key: "k".into(),
                fence_key: "f".into(),
                broken: "b".into(),
                wake: WakeKeys::Channel("c".into()),
                candidate: None,
                shared: None,
            }),
            token: OwnerToken::from_string("a~b".into()),
        };
        for round in [0, 1, 12] {
            let value = hold.for_round(round).token.to_string();
            assert_eq!(acquisition_token(&value), "a~b");
        }
        for value in ["plain", "x~", "x~1a", "~"] {
            assert_eq!(acquisition_token(value), value);
        }
    }
}
