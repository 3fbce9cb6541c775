//! Where locks live on the server: how lock names map onto Redis keys and channels.

use lock_core::raw::escape;
use lock_core::LockName;

/// Suffix of the fencing counter beside a lock key.
pub(crate) const FENCE: &str = "fence";
/// Suffix of the waiter queue.
pub(crate) const QUEUE: &str = "q";
/// Suffix of the waiters' liveness deadlines.
pub(crate) const QUEUE_LIVE: &str = "qlive";
/// Suffix of the wake-up channel of a name (without the queue).
pub(crate) const RELEASED: &str = "released";

/// How lock names map onto Redis keys.
///
/// - lock key: `<prefix><name>`, a plain string holding the owner token, with `%`, `{`
///   and `}` of the name percent-escaped (so a lock key never holds a hash tag and two
///   names never share a key);
/// - fencing counter: `<prefix>{<lock key>}:fence`, never deleted (tokens must keep
///   increasing);
/// - waiter queue: `<prefix>{<lock key>}:q`, a sorted set of waiter ids by arrival
///   ticket, and `<prefix>{<lock key>}:qlive`, the same ids by the server time (ms) at
///   which each is dropped unless it shows up again;
/// - wake-up channel of a client (queue mode): `<prefix>client:<client id>`, on which a
///   release names the queued waiter it wakes;
/// - wake-up channel of a name (without the queue): `<prefix>{<lock key>}:released`.
///
/// The keys beside the lock key carry the whole lock key as their hash tag, so they share
/// its hash slot.
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
        format!("{}{}", self.prefix, escape(name.as_str(), &['{', '}']))
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

    /// The waiter queue of `name` (ids by arrival ticket).
    pub fn queue_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), QUEUE)
    }

    /// The liveness deadlines of the waiters of `name` (ids by server time in ms).
    pub fn queue_live_key(&self, name: &LockName) -> String {
        self.side_key(&self.lock_key(name), QUEUE_LIVE)
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let plain = KeyLayout::new("");
        assert_eq!(plain.lock_key(&LockName::new("jobs").unwrap()), "jobs");
        assert_ne!(
            keys.lock_key(&LockName::new("a{b").unwrap()),
            keys.lock_key(&LockName::new("a%7Bb").unwrap())
        );
    }
}
