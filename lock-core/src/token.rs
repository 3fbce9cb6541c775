//! Identities: the owner token of one acquisition, the fencing token, and owner ids for
//! reentrancy.

use std::fmt;
use std::sync::Arc;

/// The unique token of one acquisition; release and extend compare it on the server.
/// Cloning shares the text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken(Arc<str>);

impl OwnerToken {
    /// A fresh random token (UUID v4), drawn from the thread's cryptographically secure
    /// generator (seeded by the operating system) rather than by a system call each.
    pub fn generate() -> Self {
        let uuid = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        let mut text = uuid::Uuid::encode_buffer();
        OwnerToken(Arc::from(&*uuid.hyphenated().encode_lower(&mut text)))
    }

    /// A token with a given value, for backends that read one back from the server.
    pub fn from_string(value: String) -> Self {
        OwnerToken(Arc::from(value))
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({})", self.0)
    }
}

/// A number that strictly increases across successive holders of one lock name.
///
/// Hand it to the protected resource with every write; the resource rejects a token
/// lower than one it has already seen, which stops a holder that lost its lock
/// without knowing it (a long pause, a partition) from doing damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The explicit owner of a reentrant acquisition (a request id, a job id, …).
///
/// Never a thread id: tasks move between threads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(String);

impl OwnerId {
    /// An owner id with this value.
    pub fn new(id: impl Into<String>) -> Self {
        OwnerId(id.into())
    }

    /// The id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for OwnerId {
    fn from(id: &str) -> Self {
        OwnerId(id.to_owned())
    }
}

impl From<String> for OwnerId {
    fn from(id: String) -> Self {
        OwnerId(id)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_distinct_version_4_uuids() {
        let tokens = [OwnerToken::generate(), OwnerToken::generate()];
        assert_ne!(tokens[0], tokens[1]);
        for token in &tokens {
            let parsed = uuid::Uuid::parse_str(token.as_str()).expect("a UUID");
            assert_eq!(parsed.get_version_num(), 4);
            assert_eq!(parsed.hyphenated().to_string(), token.as_str());
        }
    }
}
