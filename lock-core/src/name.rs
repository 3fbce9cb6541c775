//! Lock names: validation shared by every backend, and the escaping helper backends use
//! to map a name onto a key, path or prefix without collisions.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The longest accepted lock name, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 512;

/// A validated lock name.
///
/// A name is 1 to [`MAX_NAME_BYTES`] bytes of UTF-8 with no control characters.
/// Any other character is allowed, `/` included: each backend escapes what its
/// key space reserves, so two different names never map to the same lock
/// (`jobs` and `jobs/daily` are independent locks everywhere).
///
/// Cloning shares the text (a hold keeps its name in several places).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] if it is empty, longer than [`MAX_NAME_BYTES`],
    /// or contains a control character.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::invalid_name(&name, "a lock name must not be empty"));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid_name(
                &name,
                format!(
                    "a lock name is at most {MAX_NAME_BYTES} bytes, this one has {}",
                    name.len()
                ),
            ));
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(Error::invalid_name(
                &name,
                format!("control character {c:?} is not allowed"),
            ));
        }
        Ok(LockName(Arc::from(name)))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(name: &str) -> Result<Self> {
        LockName::new(name)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(name: String) -> Result<Self> {
        LockName::new(name)
    }
}

/// Percent-encodes `%` and every character in `reserved`, byte by byte, so the result
/// contains none of them and distinct inputs give distinct outputs.
///
/// Names made only of unreserved characters come out unchanged, which keeps the
/// layouts compatible with other libraries for plain names.
pub fn escape(name: &str, reserved: &[char]) -> String {
    escape_where(name, |c| reserved.contains(&c))
}

/// As [`escape`], with the reserved characters given by a predicate (for key spaces that
/// reserve whole ranges).
pub fn escape_where(name: &str, reserved: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '%' || reserved(c) {
            let mut buf = [0u8; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The inverse of an escaping function `escape` (such as [`escape`] with fixed reserved
/// characters): the name whose escape is `escaped`, `None` if there is none (malformed
/// percent-encoding, not UTF-8 once decoded, or a text no name escapes to, e.g. `%41`
/// where the name `A` escapes to `A`).
pub fn unescape(escaped: &str, escape: impl Fn(&str) -> String) -> Option<String> {
    let name = percent_encoding::percent_decode_str(escaped)
        .decode_utf8()
        .ok()?
        .into_owned();
    (escape(&name) == escaped).then_some(name)
}

/// Checks a prefix of lock names (as listings take): no name has a control character or
/// more than [`MAX_NAME_BYTES`] bytes, so such a prefix is a typo, not an empty listing.
///
/// # Errors
/// [`Error::InvalidName`] for such a prefix.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    LockName::new(prefix).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn accepts_ordinary_names() {
        for name in [
            "a",
            "jobs/daily",
            "{tag}",
            "日本語",
            "x".repeat(MAX_NAME_BYTES).as_str(),
        ] {
            assert_eq!(LockName::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn rejects_bad_names_with_a_clear_error() {
        let cases = [
            (String::new(), "empty"),
            ("x".repeat(MAX_NAME_BYTES + 1), "at most"),
            ("a\0b".to_owned(), "control"),
            ("a\nb".to_owned(), "control"),
        ];
        for (name, needle) in cases {
            let err = LockName::new(name).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidName);
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    #[test]
    fn escaping_is_injective_and_identity_on_plain_names() {
        assert_eq!(escape("jobs", &['/']), "jobs");
        assert_eq!(escape("jobs/daily", &['/']), "jobs%2Fdaily");
        assert_eq!(escape("jobs%2Fdaily", &['/']), "jobs%252Fdaily");
        assert_eq!(escape("a}b", &['{', '}']), "a%7Db");
    }

    #[test]
    fn unescaping_inverts_escaping_and_rejects_what_no_name_escapes_to() {
        let slash = |name: &str| escape(name, &['/']);
        for name in ["jobs", "jobs/daily", "jobs%2Fdaily", "a%", "日本/語", "%"] {
            assert_eq!(unescape(&slash(name), slash).as_deref(), Some(name));
        }
        for text in ["a/b", "%41", "%2f", "%", "%zz", "a%2", "%FF", "%C3"] {
            assert_eq!(unescape(text, slash), None, "{text}");
        }
    }

    #[test]
    fn prefixes_are_checked_like_names_except_empty() {
        assert!(check_prefix("").is_ok());
        assert!(check_prefix("jobs/").is_ok());
        for bad in ["a\nb".to_owned(), "x".repeat(MAX_NAME_BYTES + 1)] {
            let err = check_prefix(&bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
        }
    }
}
