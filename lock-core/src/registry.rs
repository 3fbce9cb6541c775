//! Selecting a backend from a URL: a [`Registry`] keeps the [`Driver`] of each backend by
//! scheme and builds the client for a URL. URLs made of other URLs (the dual lock's
//! `dual:<old>|<new>`) are served by a composer, which opens its parts through the same
//! registry. A scheme known to be served by code that is not compiled in can carry a hint
//! saying how to add it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::driver::Driver;
use crate::erased::Opened;
use crate::error::{Error, Result};
use crate::lock::DistributedLock;
use crate::lock_url::LockUrl;
use crate::options::LockOptionsBuilder;
use crate::plumbing::lock_unpoisoned;

/// A future that builds a client for a composed URL, borrowing the registry it opens
/// the parts with.
pub(crate) type ComposeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send + 'a>>;

/// Builds a client for a whole composed URL (`prefix:…`) through a registry, with the
/// lock options set in code winning over each part's.
pub(crate) type Composer =
    for<'a> fn(&'a Registry, &'a str, &'a LockOptionsBuilder) -> ComposeFuture<'a>;

/// A table of URL schemes and the backends that serve them.
#[derive(Default)]
pub struct Registry {
    schemes: Mutex<Schemes>,
}

#[derive(Default)]
struct Schemes {
    drivers: BTreeMap<String, Driver>,
    /// URL prefixes (before the first `:`) whose URLs are made of other URLs.
    composers: BTreeMap<String, Composer>,
    /// Schemes not served here, with how to add them.
    hints: BTreeMap<String, String>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("schemes", &self.schemes())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every scheme of `driver`, replacing any earlier driver of them.
    pub fn register(&self, driver: Driver) {
        let mut schemes = lock_unpoisoned(&self.schemes);
        for scheme in driver.schemes() {
            schemes.drivers.insert(scheme.to_ascii_lowercase(), driver);
        }
    }

    /// Registers the schemes of `driver` that no driver serves yet.
    pub fn register_missing(&self, driver: Driver) {
        let mut schemes = lock_unpoisoned(&self.schemes);
        for scheme in driver.schemes() {
            schemes
                .drivers
                .entry(scheme.to_ascii_lowercase())
                .or_insert(driver);
        }
    }

    /// Serves URLs that start with `prefix:` with `composer`.
    pub(crate) fn register_composer(&self, prefix: &str, composer: Composer) {
        lock_unpoisoned(&self.schemes)
            .composers
            .insert(prefix.to_ascii_lowercase(), composer);
    }

    /// Records how to add `scheme` when it is not registered (say, which feature or crate
    /// serves it), for the error [`Registry::connect`] returns.
    pub fn hint_unregistered(&self, scheme: &str, hint: impl Into<String>) {
        lock_unpoisoned(&self.schemes)
            .hints
            .insert(scheme.to_ascii_lowercase(), hint.into());
    }

    /// The registered schemes, sorted.
    pub fn schemes(&self) -> Vec<String> {
        lock_unpoisoned(&self.schemes)
            .drivers
            .keys()
            .cloned()
            .collect()
    }

    /// Builds a client for `url`: a backend's URL, or a dual (migration) lock's
    /// `dual:<old url>|<new url>` (see [`crate::migration`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a malformed URL (the message never repeats the URL,
    /// which may hold a password); [`Error::UnknownScheme`] listing the known schemes
    /// and the hint recorded for the missing one, if any; whatever the backend reports.
    pub async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        self.connect_with(url, &LockOptionsBuilder::default()).await
    }

    /// As [`Registry::connect`], with the lock options set in `options` winning over the
    /// URL's (on both sides of a dual lock).
    ///
    /// # Errors
    /// As [`Registry::connect`].
    pub async fn connect_with(
        &self,
        url: &str,
        options: &LockOptionsBuilder,
    ) -> Result<Arc<dyn DistributedLock>> {
        if let Some(composer) = self.composer(url) {
            return composer(self, url, options).await;
        }
        let driver_url = self.parse(url, options)?;
        let driver = self.driver(&driver_url.scheme)?;
        driver.connect(driver_url).await
    }

    /// Opens the backend of `url` without a lease client, for a part of a composed URL.
    ///
    /// # Errors
    /// As [`Registry::connect`].
    pub(crate) async fn open(&self, url: &str, options: &LockOptionsBuilder) -> Result<Opened> {
        let parsed = self.parse(url, options)?;
        let driver = self.driver(&parsed.scheme)?;
        driver.open(parsed).await
    }

    /// `url` parsed, with the options set in code in place of its own.
    fn parse(&self, url: &str, options: &LockOptionsBuilder) -> Result<LockUrl> {
        let mut parsed = LockUrl::parse(url)?;
        parsed.override_options(options);
        Ok(parsed)
    }

    /// The composer of `url`'s prefix, if it is a composed URL.
    fn composer(&self, url: &str) -> Option<Composer> {
        let (prefix, _) = url.trim().split_once(':')?;
        lock_unpoisoned(&self.schemes)
            .composers
            .get(&prefix.to_ascii_lowercase())
            .copied()
    }

    fn driver(&self, scheme: &str) -> Result<Driver> {
        let schemes = lock_unpoisoned(&self.schemes);
        match schemes.drivers.get(scheme) {
            Some(driver) => Ok(*driver),
            None => Err(schemes.unknown(scheme.to_owned())),
        }
    }
}

impl Schemes {
    fn unknown(&self, scheme: String) -> Error {
        Error::UnknownScheme {
            hint: self
                .hints
                .get(&scheme)
                .map(|hint| format!(" ({hint})"))
                .unwrap_or_default(),
            known: self.drivers.keys().cloned().collect(),
            scheme,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[tokio::test]
    async fn url_errors_are_typed_and_clear() {
        let cases: &[(&str, ErrorKind, &str)] = &[
            ("", ErrorKind::InvalidConfig, "malformed"),
            ("not a url", ErrorKind::InvalidConfig, "malformed"),
            ("foo://x", ErrorKind::UnknownScheme, "known schemes: memory"),
            ("zz://127.0.0.1:1", ErrorKind::UnknownScheme, "enable zz"),
            ("memory://x?ttl=abc", ErrorKind::InvalidConfig, "ttl"),
            ("memory://x?ttl=0s", ErrorKind::InvalidConfig, "ttl"),
            ("memory://x?bogus=1", ErrorKind::InvalidConfig, "bogus"),
            ("memory://x/some/path", ErrorKind::InvalidConfig, "path"),
            ("redis://u:sekret@h:99999", ErrorKind::InvalidConfig, "port"),
        ];
        for (url, kind, needle) in cases {
            let err = Registry::new_with_memory().connect(url).await.unwrap_err();
            assert_eq!(err.kind(), *kind, "{url}: {err}");
            assert!(err.to_string().contains(needle), "{url}: {err}");
        }
    }

    impl Registry {
        fn new_with_memory() -> Self {
            let registry = Registry::new();
            registry.register(Driver::of::<crate::memory::MemoryBackend>());
            registry.hint_unregistered("ZZ", "enable zz");
            registry
        }
    }
}
