//! Where locks live on the server: how lock names map onto Redis keys and channels, and
//! the keys of one hold ([`HoldKeys`]).

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;
use std::time::Duration;

use lock_core::raw::{
    backend::HoldKind,
    names::{escape, unescape},
};
use lock_core::LockName;

/// What a lock key escapes in the name (besides `%`): the hash tag braces.
const RESERVED: &[char] = &['{', '}'];

/// Suffix of the fencing counter beside a lock key.
pub(crate) const FENCE: &str = "fence";
/// Suffix of the waiter queue.
pub(crate) const QUEUE: &str = "q";
/// Suffix of the waiters' liveness deadlines.
pub(crate) const QUEUE_LIVE: &str = "qlive";
/// Suffix of the grants the queue's waiters asked for (`queue.lua` appends `grant` to the
/// queue key).
pub(crate) const QUEUE_GRANT: &str = "qgrant";
/// Suffix of the wake-up channel of a name (without the queue).
pub(crate) const RELEASED: &str = "released";
/// Suffix of the wake-up channels of a name's queued waiters on Redis Cluster (the
/// client id follows).
pub(crate) const CLIENT: &str = "client:";
/// Suffix of the leader entry of an election: a hash with the leader's owner token, term,
/// value, value version and grant time.
pub(crate) const LEADER: &str = "leader";
/// Suffix of the change channel of an election: grants, releases, breaks and proclaims of
/// candidates are published on it.
pub(crate) const CHANGED: &str = "changed";
/// Suffix of the holders' table of a shared kind (a semaphore, a read-write lock): a hash
/// of each holder's kind and fencing token, each queued waiter's kind, and the name's kind.
pub(crate) const HOLDERS: &str = "holders";
/// Suffix of the break mark: the owner tokens an operator's force release removed.
pub(crate) const BROKEN: &str = "broken";
/// How many removed owner tokens a break mark keeps.
pub(crate) const BROKEN_KEPT: u32 = 8;
/// How long a break mark stays at least (see [`KeyLayout`]).
pub(crate) const BROKEN_STAY: Duration = Duration::from_secs(60);

/// How lock names map onto Redis keys.
///
/// - lock key: `<prefix><name>`, a plain string holding the owner token, with `%`, `{`
///   and `}` of the name percent-escaped (so a lock key never holds a hash tag and two
///   names never share a key);
/// - fencing counter: `<prefix>{<lock key>}:fence`, never deleted (tokens must keep
///   increasing);
/// - waiter queue: `<prefix>{<lock key>}:q`, a sorted set of waiter ids by arrival
///   ticket, and `<prefix>{<lock key>}:qlive`, the same ids by the server time (ms) at
///   which each is dropped unless it shows up again; `<prefix>{<lock key>}:qgrant`, a
///   hash of the waiters a release may hand the lock to: waiter id -> `<round>:<lease
///   ms>:<floor>`;
/// - break mark: `<prefix>{<lock key>}:broken`, a list of the owner tokens that operators'
///   force releases removed from the lock key, the last 8, written in the same script
///   that deletes the key. It expires after a minute, three times the breaking client's
///   TTL or three times the remaining lease of the hold it removed, whichever is longest,
///   counted from the last break (a removed holder learns of it at its next renewal, a
///   third of its TTL later; a release comes before its lease ends). Renewal and
///   release look at it only when the lock key is not theirs, to report the hold broken
///   rather than taken or gone;
/// - leader entry (elections): `<prefix>{<lock key>}:leader`, a hash written with a
///   candidate's grant in the same script and with the lock key's TTL (renewed, released
///   and broken with it): `owner` (the owner token in the lock key), `term` (the fencing
///   token of the grant), `value` (the candidate's value), `version` (0 at the grant,
///   raised by each proclaim) and `since` (the server time of the grant, in ms). Readers trust it only while `owner` is the lock key's value;
/// - change channel (elections): `<prefix>{<lock key>}:changed`, on which a candidate's
///   grant (`elected`), release or break (`resigned`) and proclaim (`proclaimed`) are
///   published;
/// - shared kinds (a semaphore's permits, a read-write lock's readers and writers): the
///   lock key is a **sorted set** of the holders' owner tokens by the server time (ms) at
///   which each hold expires (the key itself expires with the last), and
///   `<prefix>{<lock key>}:holders` a hash: `<owner token>` -> `<kind>:<fencing token>`
///   of each holder (`R`, `W` or `P<permits>`), `q:<waiter id>` -> `<kind>:<ttl ms>:<fence
///   floor>` of each queued waiter, and `kind` -> the name's kind (`P<permits>` or `RW`),
///   which every acquire compares with its own; grants, releases, breaks and downgrades are
///   published on the change channel;
/// - wake-up channel of a client (queue mode): `<prefix>client:<client id>`, on which a
///   release names the queued waiter it wakes; on Redis Cluster, where a (sharded)
///   channel lives on the shard of its hash slot, one per name the client waits for:
///   `<prefix>{<lock key>}:client:<client id>`;
/// - wake-up channel of a name (without the queue): `<prefix>{<lock key>}:released`.
///
/// The keys beside the lock key carry the whole lock key as their hash tag, so they share
/// its hash slot. A key under the prefix is a lock key exactly when the rest holds no `{`
/// and is the escape of a name ([`KeyLayout::name_of`]); listing relies on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// The layout for key prefix `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        KeyLayout {
            prefix: prefix.into(),
        }
    }

    /// The key that holds the owner token of `name`.
    pub fn lock_key(&self, name: &LockName) -> String {
        format!("{}{}", self.prefix, escape(name.as_str(), RESERVED))
    }

    /// The name whose lock key is `key`; `None` for any other key (a side key, a key
    /// outside the prefix, or one no name escapes to).
    pub fn name_of(&self, key: &str) -> Option<LockName> {
        let escaped = key.strip_prefix(self.prefix.as_str())?;
        LockName::new(unescape(escaped, |name| escape(name, RESERVED))?).ok()
    }

    /// The `SCAN MATCH` pattern of the lock keys of names that start with `name_prefix`
    /// (side keys match too, [`KeyLayout::name_of`] sorts them out): the glob
    /// metacharacters of the prefix and of the escaped name prefix are escaped.
    pub(crate) fn match_pattern(&self, name_prefix: &str) -> String {
        let literal = format!("{}{}", self.prefix, escape(name_prefix, RESERVED));
        let mut pattern = String::with_capacity(literal.len() + 1);
        for c in literal.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        pattern
    }

    /// The fencing counter of `name`.
    pub fn fence_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), FENCE)
    }

    /// The key or channel `<prefix>{<lock key>}:<suffix>` beside lock key `lock_key`.
    pub(crate) fn side_key(&self, lock_key: &str, suffix: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + lock_key.len() + suffix.len() + 3);
        key.push_str(&self.prefix);
        key.push('{');
        key.push_str(lock_key);
        key.push_str("}:");
        key.push_str(suffix);
        key
    }

    /// The break mark of `name` (owner tokens removed by force releases).
    pub fn broken_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), BROKEN)
    }

    /// The leader entry of election `name` (owner token, term, value, version, since).
    pub fn leader_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), LEADER)
    }

    /// The channel on which changes of election `name`'s leader are published.
    pub fn changes_channel(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), CHANGED)
    }

    /// The holders' table of `name` as a semaphore or read-write lock (kinds and fencing
    /// tokens of the holders, kinds of the waiters, the name's kind).
    pub fn holders_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), HOLDERS)
    }

    /// The waiter queue of `name` (ids by arrival ticket).
    pub fn queue_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), QUEUE)
    }

    /// The liveness deadlines of the waiters of `name` (ids by server time in ms).
    pub fn queue_live_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), QUEUE_LIVE)
    }

    /// The grants the waiters of `name` asked for (waiter id -> `<round>:<lease ms>:<floor>`).
    pub fn queue_grant_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), QUEUE_GRANT)
    }

    /// What precedes a client id in the name of its wake-up channel.
    pub fn client_channel_prefix(&self) -> String {
        format!("{}client:", self.prefix)
    }

    /// The channel on which a release of `name` is published (without the queue).
    pub fn wakeup_channel(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), RELEASED)
    }
}

/// The keys of a hold.
#[derive(Debug)]
pub(crate) struct HoldKeys {
    pub(crate) key: String,
    pub(crate) fence_key: String,
    /// The break mark (see [`KeyLayout`]).
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
        Ok(permits) => HoldKind::permit(permits),
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
    /// The keys of a hold of `name` as `kind` under `layout`; with the queue, the
    /// acquisition's `waiter` id (`<client id>/<owner token of its first round>`).
    pub(crate) fn new(
        layout: &KeyLayout,
        name: &LockName,
        kind: &HoldKind,
        waiter: Option<String>,
    ) -> Self {
        let key = layout.lock_key(name);
        let side = |suffix: &str| layout.side_key(&key, suffix);
        let wake = match waiter {
            Some(waiter) => WakeKeys::Queue {
                queue: side(QUEUE),
                live: side(QUEUE_LIVE),
                waiter,
            },
            None => WakeKeys::Channel(side(RELEASED)),
        };
        let candidate = match kind {
            HoldKind::Candidate { value } => Some(CandidateKeys {
                leader: side(LEADER),
                changed: side(CHANGED),
                value: value.clone(),
                proclaims: AtomicU64::new(0),
                term: OnceLock::new(),
            }),
            _ => None,
        };
        let shared = spell_kind(kind).map(|kind| SharedKeys {
            table: side(HOLDERS),
            changed: side(CHANGED),
            kind,
        });
        HoldKeys {
            fence_key: side(FENCE),
            broken: side(BROKEN),
            wake,
            candidate,
            shared,
            key,
        }
    }

    /// The acquisition's id in the waiter queue ("" without the queue).
    pub(crate) fn waiter(&self) -> &str {
        match &self.wake {
            WakeKeys::Queue { waiter, .. } => waiter,
            WakeKeys::Channel(_) => "",
        }
    }

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
    /// They queue in these sorted sets (see [`KeyLayout`]), this
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

/// `kind` as the scripts of the shared kinds spell it in the holders' table (`R`, `W`,
/// `U`, `P<permits>`, `P<permits>x<count>` for several permits in one hold); `None` for the
/// exclusive kinds, which hold the plain lock key.
pub(crate) fn spell_kind(kind: &HoldKind) -> Option<String> {
    match kind {
        HoldKind::Read => Some("R".into()),
        HoldKind::Write => Some("W".into()),
        HoldKind::Upgradeable => Some("U".into()),
        HoldKind::Permit { permits, count: 1 } => Some(format!("P{permits}")),
        HoldKind::Permit { permits, count } => Some(format!("P{permits}x{count}")),
        _ => None,
    }
}

/// The kind spelled `spelled` in the holders' table: the inverse of [`spell_kind`].
pub(crate) fn read_kind(spelled: &str) -> Option<HoldKind> {
    match spelled {
        "R" => Some(HoldKind::Read),
        "W" => Some(HoldKind::Write),
        "U" => Some(HoldKind::Upgradeable),
        _ => {
            let spelled = spelled.strip_prefix('P')?;
            let (permits, count) = spelled.split_once('x').unwrap_or((spelled, "1"));
            let (permits, count) = (permits.parse().ok()?, count.parse().ok()?);
            Some(HoldKind::Permit { permits, count })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_kinds_read_back_as_spelled() {
        for kind in [
            HoldKind::Read,
            HoldKind::Write,
            HoldKind::Upgradeable,
            HoldKind::permit(12),
            HoldKind::Permit {
                permits: 12,
                count: 5,
            },
        ] {
            let spelled = spell_kind(&kind).expect("a shared kind");
            assert_eq!(read_kind(&spelled), Some(kind));
        }
        assert_eq!(spell_kind(&HoldKind::Mutex), None);
        assert_eq!(read_kind("P"), None, "a permit without its count");
    }

    #[test]
    fn keys_escape_hash_tags_and_share_a_slot() {
        let keys = KeyLayout::new("distlock:");
        let name = LockName::new("{jobs}/50%").unwrap();
        let lock = keys.lock_key(&name);
        assert_eq!(lock, "distlock:%7Bjobs%7D/50%25");
        assert_eq!(keys.fence_key(&name), format!("distlock:{{{lock}}}:fence"));
        assert_eq!(
            keys.wakeup_channel(&name),
            format!("distlock:{{{lock}}}:released")
        );
        assert_eq!(keys.queue_key(&name), format!("distlock:{{{lock}}}:q"));
        assert_eq!(
            keys.queue_live_key(&name),
            format!("distlock:{{{lock}}}:qlive")
        );
        // queue.lua derives these from the queue key (`grant_head`).
        let queue = keys.queue_key(&name);
        let base = queue
            .strip_suffix(QUEUE)
            .expect("the queue key ends with its suffix");
        assert_eq!(keys.queue_grant_key(&name), format!("{queue}grant"));
        assert_eq!(keys.leader_key(&name), format!("{base}{LEADER}"));
        assert_eq!(keys.changes_channel(&name), format!("{base}{CHANGED}"));
        assert_eq!(
            keys.broken_key(&name),
            format!("distlock:{{{lock}}}:broken")
        );
        assert_eq!(
            keys.leader_key(&name),
            format!("distlock:{{{lock}}}:leader")
        );
        assert_eq!(
            keys.changes_channel(&name),
            format!("distlock:{{{lock}}}:changed")
        );
        assert_eq!(
            keys.holders_key(&name),
            format!("distlock:{{{lock}}}:holders")
        );
        let plain = KeyLayout::new("");
        assert_eq!(plain.lock_key(&LockName::new("jobs").unwrap()), "jobs");
        assert_ne!(
            keys.lock_key(&LockName::new("a{b").unwrap()),
            keys.lock_key(&LockName::new("a%7Bb").unwrap())
        );
    }

    #[test]
    fn lock_keys_map_back_to_names_and_side_keys_do_not() {
        let keys = KeyLayout::new("app:");
        for name in ["jobs", "{jobs}/50%", "a*b?c[d]e\\f", "日本"] {
            let name = LockName::new(name).unwrap();
            assert_eq!(keys.name_of(&keys.lock_key(&name)), Some(name.clone()));
            for side in [
                keys.fence_key(&name),
                keys.queue_key(&name),
                keys.queue_live_key(&name),
                keys.queue_grant_key(&name),
                keys.broken_key(&name),
                keys.leader_key(&name),
                keys.holders_key(&name),
            ] {
                assert_eq!(keys.name_of(&side), None, "{side}");
            }
        }
        for other in ["other:jobs", "app:a%7", "app:a%7b", "app:"] {
            assert_eq!(keys.name_of(other), None, "{other}");
        }
        assert_eq!(keys.match_pattern(""), "app:*");
        assert_eq!(
            keys.match_pattern("a*b?[c]\\{%"),
            "app:a\\*b\\?\\[c\\]\\\\%7B%25*"
        );
        assert_eq!(KeyLayout::new("x[1]:").match_pattern("j"), "x\\[1\\]:j*");
    }
}
