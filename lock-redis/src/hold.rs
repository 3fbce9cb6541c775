//! The hold ([`RedisHold`]) and its server side: renewal and release, each decided by a
//! majority of answers.
//!
//! Renewal is batched (one script call per server, on Redis Cluster per primary, renews
//! every hold of the client there, compare-and-PEXPIRE per key); release is
//! compare-and-DEL plus a wake-up of the head of the queue, or a publish to the name's
//! channel without the queue.
//! Both read the break mark of a key that is no longer theirs, to tell a force release
//! (`Broken`) from a key taken or gone. Renewal is in `hold/renewal.rs` (on Redis
//! Cluster in `hold/cluster.rs`), release and the other owner-checked writes in
//! `hold/release.rs`.

mod cluster;
mod release;
mod renewal;

pub(crate) use release::{downgrade, proclaim, release_all, release_each};
pub(crate) use renewal::{renew, renewal_group};

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lock_core::raw::backend::{AcquireRequest, HoldKind};
use lock_core::{FencingToken, LockName, LostReason, OwnerToken};
use redis::ScriptInvocation;

use crate::layout;
use crate::topology::Servers;

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
    /// The term (the fencing token of the grant), once granted: a proclaim writes it back
    /// into an entry it has to recreate.
    pub(crate) term: OnceLock<u64>,
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
                term: OnceLock::new(),
            }),
            _ => None,
        };
        let shared = layout::spell_kind(request.kind).map(|kind| SharedKeys {
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

    /// Records the grant of this hold, `fence`: a candidate's term.
    pub(crate) fn granted(&self, fence: FencingToken) {
        if let Some(candidate) = &self.keys.candidate {
            // The first grant's: one acquisition has one term.
            let _ = candidate.term.set(fence.get());
        }
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
