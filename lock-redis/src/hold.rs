//! The hold ([`RedisHold`]) and its server side: renewal and release, each decided by a
//! majority of answers. Renewal is batched (one script call per server, on Redis Cluster
//! per primary, renews every hold of the client there, compare-and-PEXPIRE per key);
//! release is compare-and-DEL plus a wake-up of the head of the queue, or a publish to
//! the name's channel without the queue. Both read the break mark of a key that is no
//! longer theirs, to tell a force release (`Broken`) from a key taken or gone. Renewal
//! is in `hold/renewal.rs` (on Redis Cluster in `hold/cluster.rs`), release and the other
//! owner-checked writes in `hold/release.rs`.

mod cluster;
mod release;
mod renewal;

pub(crate) use release::{proclaim, rekind, release_all, release_each};
pub(crate) use renewal::{renew, renewal_group};

use std::sync::Arc;

use lock_core::raw::backend::{AcquireRequest, RenewItem};
use lock_core::{FencingToken, LockName, LostReason, OwnerToken};

use crate::layout::HoldKeys;
use crate::scripts::Renewal;
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

impl RedisHold {
    /// The hold `request` would take, with its keys under `servers`' layout and, with the
    /// queue, its waiter id `<client id>/<owner token>`.
    pub(crate) fn new(servers: &Servers, request: &AcquireRequest<'_>) -> RedisHold {
        let waiter = servers
            .config
            .queue
            .then(|| format!("{}/{}", servers.client_id, request.token));
        RedisHold {
            name: request.name.clone(),
            keys: Arc::new(HoldKeys::new(
                &servers.keys,
                request.name,
                request.kind,
                waiter,
            )),
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
    /// Ours, amended as far as it can be now (an upgrade whose readers still hold).
    pub(crate) const PENDING: i64 = 2;
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

/// What the renewal script needs of `item`.
fn renewal_of<'a>(item: &'a RenewItem<'_, RedisHold>) -> Renewal<'a> {
    Renewal {
        keys: &item.hold.keys,
        token: item.hold.token.as_str(),
        ttl: item.ttl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::WakeKeys;

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
