//! Shared set-up of the distlock examples: the lock URL taken from the environment, the
//! same URL with options of an example's own, and a toy storage that fences its writes.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use distlock::migration::DualConfig;
use distlock::raw::url::LockUrl;
use distlock::FencingToken;

/// The lock URL from `LOCK_URL`, or `memory://examples`.
pub fn lock_url() -> String {
    std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://examples".to_owned())
}

/// `url` with the lock options `options` set in its query, replacing the values it gives
/// for the same keys and keeping the rest: `memory://x?ttl=5s` with `ttl=1s` is
/// `memory://x?ttl=1s`. A `dual:OLD|NEW` URL gets them on both sides, which must agree.
///
/// # Errors
/// [`distlock::Error::InvalidConfig`] for a malformed URL (the message never repeats it).
pub fn with_options(url: &str, options: &[(&str, &str)]) -> distlock::Result<String> {
    if let Some(dual) = DualConfig::from_url(url)? {
        let old = with_options(&dual.old, options)?;
        let new = with_options(&dual.new, options)?;
        return Ok(DualConfig::new(old, new).url());
    }
    // Parsed for its query; the part before the query is kept as written, since the parsed
    // URL prints its password as `***`. It ends where the parser ends it, at the first `?`.
    let parsed = LockUrl::parse(url.trim())?;
    let before_query = url.trim().split('?').next().unwrap_or_default();
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (key, value) in &parsed.query {
        if !options.iter().any(|(option, _)| option == key) {
            query.append_pair(key, value);
        }
    }
    query.extend_pairs(options);
    Ok(format!("{before_query}?{}", query.finish()))
}

/// A toy storage service that fences its writes: each key keeps the highest fencing token
/// that wrote it and refuses a write with an older one, so a holder that stalled past its
/// lease cannot overwrite what the next holder wrote. Real storage does the same with a
/// conditional write (a version column, a compare-and-set, an etcd transaction).
#[derive(Debug)]
pub struct FencedStore<V> {
    keys: Mutex<HashMap<String, (FencingToken, V)>>,
}

impl<V: Clone> FencedStore<V> {
    /// A store holding `initial`, written by no lock holder yet.
    pub fn new<'a>(initial: impl IntoIterator<Item = (&'a str, V)>) -> Self {
        let keys = initial
            .into_iter()
            .map(|(key, value)| (key.to_owned(), (FencingToken(0), value)))
            .collect();
        FencedStore {
            keys: Mutex::new(keys),
        }
    }

    /// Writes `value` at `key` for the holder of fencing token `token`.
    ///
    /// # Errors
    /// The refusal, when `key` was written with a newer token.
    pub fn write(&self, key: &str, token: FencingToken, value: V) -> Result<(), String> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match keys.get(key) {
            Some((newest, _)) if token < *newest => {
                Err(format!("{key}: refused token {token}, older than {newest}"))
            }
            _ => {
                keys.insert(key.to_owned(), (token, value));
                Ok(())
            }
        }
    }

    /// The value at `key`, if any.
    pub fn read(&self, key: &str) -> Option<V> {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(key).map(|(_, value)| value.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::with_options;

    const SLOW: &[(&str, &str)] = &[("ttl", "1s"), ("renewal", "manual")];

    fn with_slow(url: &str) -> String {
        with_options(url, SLOW).expect("a valid URL")
    }

    #[test]
    fn options_join_the_query_replacing_their_own_keys() {
        assert_eq!(with_slow("memory://x"), "memory://x?ttl=1s&renewal=manual");
        assert_eq!(
            with_slow(" redis://:p%40ss@h:1/0?ttl=5s&note=a%2Fb+c "),
            "redis://:p%40ss@h:1/0?note=a%2Fb+c&ttl=1s&renewal=manual"
        );
    }

    #[test]
    fn a_dual_url_gets_them_on_both_sides() {
        assert_eq!(
            with_slow("dual:zk://h:2181/locks|redis://h:1?ttl=5s"),
            "dual:zk://h:2181/locks?ttl=1s&renewal=manual|redis://h:1?ttl=1s&renewal=manual"
        );
    }

    #[test]
    fn a_malformed_url_is_an_error() {
        for bad in ["not a url", "dual:a|b|c"] {
            assert!(with_options(bad, SLOW).is_err(), "{bad}");
        }
    }
}
