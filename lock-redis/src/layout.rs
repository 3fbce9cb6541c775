//! Where locks live on the server: how lock names map onto Redis keys and channels.

use lock_core::raw::escape;
use lock_core::LockName;

/// How lock names map onto Redis keys.
///
/// - lock key: `<prefix><name>`, a plain string holding the owner token, with `%`, `{`
///   and `}` of the name percent-escaped (so a lock key never holds a hash tag and two
///   names never share a key);
/// - fencing counter: `<prefix>{<lock key>}:fence`, never deleted (tokens must keep
///   increasing);
/// - wake-up channel: `<prefix>{<lock key>}:released`.
///
/// The side names carry the whole lock key as their hash tag, so all three share one
/// hash slot.
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
        format!("{}{{{}}}:fence", self.prefix, self.lock_key(name))
    }

    /// The channel on which a release of `name` is published.
    pub fn wakeup_channel(&self, name: &LockName) -> String {
        format!("{}{{{}}}:released", self.prefix, self.lock_key(name))
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
        let plain = KeyLayout::new("");
        assert_eq!(plain.lock_key(&LockName::new("jobs").unwrap()), "jobs");
        assert_ne!(
            keys.lock_key(&LockName::new("a{b").unwrap()),
            keys.lock_key(&LockName::new("a%7Bb").unwrap())
        );
    }
}
