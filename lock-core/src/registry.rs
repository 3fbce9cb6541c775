//! Selecting a backend from a URL: backends register their schemes; [`connect`] builds
//! the client for a URL. A scheme known to be served by code that is not compiled in can
//! carry a hint saying how to add it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::lock::DistributedLock;
use crate::lock_url::LockUrl;
use crate::migration::DualConfig;
use crate::raw::erased::Opened;
use crate::raw::{lock_unpoisoned, Connect};

/// A future that builds a lock client.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

/// Builds a lock client from a parsed URL.
pub type Connector = fn(LockUrl) -> ConnectFuture;

/// A future that opens a backend without a lease client (a side of a dual lock).
pub(crate) type OpenFuture = Pin<Box<dyn Future<Output = Result<Opened>> + Send>>;

/// Opens a backend from a parsed URL.
type Opener = fn(LockUrl) -> OpenFuture;

/// A table of URL schemes and the backends that serve them.
#[derive(Default)]
pub struct Registry {
    schemes: Mutex<Schemes>,
}

#[derive(Default)]
struct Schemes {
    connectors: BTreeMap<String, Connector>,
    /// The schemes whose backend can be a side of a dual lock.
    openers: BTreeMap<String, Opener>,
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

    /// Registers every scheme of backend `B`, replacing any earlier connector.
    pub fn register_backend<B: Connect>(&self) {
        for scheme in B::SCHEMES {
            self.register(scheme, crate::raw::connect_url::<B>);
            lock_unpoisoned(&self.schemes)
                .openers
                .insert(scheme.to_ascii_lowercase(), crate::raw::open_url::<B>);
        }
    }

    /// Registers `connector` for `scheme`, replacing any earlier one: for a client that
    /// implements [`DistributedLock`] by itself rather than through a [`Connect`] backend.
    pub fn register(&self, scheme: &str, connector: Connector) {
        let scheme = scheme.to_ascii_lowercase();
        let mut schemes = lock_unpoisoned(&self.schemes);
        schemes.openers.remove(&scheme);
        schemes.connectors.insert(scheme, connector);
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
            .connectors
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
        if let Some(dual) = DualConfig::from_url(url)? {
            return self.connect_dual(&dual).await;
        }
        let parsed = LockUrl::parse(url)?;
        let connector = {
            let schemes = lock_unpoisoned(&self.schemes);
            match schemes.connectors.get(&parsed.scheme) {
                Some(connector) => *connector,
                None => return Err(schemes.unknown(parsed.scheme)),
            }
        };
        connector(parsed).await
    }

    /// Builds a dual (migration) lock client from `config`, as [`Registry::connect`] does
    /// for its `dual:` URL.
    ///
    /// # Errors
    /// As [`Registry::connect`] for either side, [`Error::InvalidConfig`] when the two
    /// URLs give different lock options, [`Error::Unsupported`] for a new side whose
    /// fencing tokens cannot be raised.
    pub async fn connect_dual(&self, config: &DualConfig) -> Result<Arc<dyn DistributedLock>> {
        crate::migration::connect_dual(self, config).await
    }

    /// Opens the backend of `url` without a lease client, for a side of a dual lock.
    pub(crate) async fn open(&self, url: &str) -> Result<Opened> {
        if DualConfig::from_url(url)?.is_some() {
            return Err(Error::config("a side of a dual lock cannot be a dual lock"));
        }
        let parsed = LockUrl::parse(url)?;
        let opener = {
            let schemes = lock_unpoisoned(&self.schemes);
            match schemes.openers.get(&parsed.scheme) {
                Some(opener) => *opener,
                None if schemes.connectors.contains_key(&parsed.scheme) => {
                    return Err(Error::Unsupported {
                        backend: "dual",
                        operation: format!(
                            "{}:// as a side (a client registered without its backend)",
                            parsed.scheme
                        ),
                    })
                }
                None => return Err(schemes.unknown(parsed.scheme)),
            }
        };
        opener(parsed).await
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
            known: self.connectors.keys().cloned().collect(),
            scheme,
        }
    }
}

/// The process-wide registry, with `memory://` registered.
pub fn registry() -> &'static Registry {
    static GLOBAL: OnceLock<Registry> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let registry = Registry::new();
        registry.register_backend::<crate::memory::MemoryBackend>();
        registry
    })
}

/// Builds a client for `url` from the process-wide [`registry`]: `memory://` and the
/// backends registered with [`raw::register`](crate::raw::register). Applications use
/// `distlock::connect`, which serves every backend compiled into the `distlock` crate.
///
/// # Errors
/// See [`Registry::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    registry().connect(url).await
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
            registry.register_backend::<crate::memory::MemoryBackend>();
            registry.hint_unregistered("ZZ", "enable zz");
            registry
        }
    }
}
