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
use crate::raw::{lock_unpoisoned, Connect};

/// A future that builds a lock client.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

/// Builds a lock client from a parsed URL.
pub type Connector = fn(LockUrl) -> ConnectFuture;

/// A table of URL schemes and the backends that serve them.
#[derive(Default)]
pub struct Registry {
    schemes: Mutex<Schemes>,
}

#[derive(Default)]
struct Schemes {
    connectors: BTreeMap<String, Connector>,
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
        }
    }

    /// Registers `connector` for `scheme`, replacing any earlier one: for a client that
    /// implements [`DistributedLock`] by itself rather than through a [`Connect`] backend.
    pub fn register(&self, scheme: &str, connector: Connector) {
        lock_unpoisoned(&self.schemes)
            .connectors
            .insert(scheme.to_ascii_lowercase(), connector);
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

    /// Builds a client for `url`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a malformed URL (the message never repeats the URL,
    /// which may hold a password); [`Error::UnknownScheme`] listing the known schemes
    /// and the hint recorded for the missing one, if any; whatever the backend reports.
    pub async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let parsed = LockUrl::parse(url)?;
        let connector = {
            let schemes = lock_unpoisoned(&self.schemes);
            match schemes.connectors.get(&parsed.scheme) {
                Some(connector) => *connector,
                None => {
                    return Err(Error::UnknownScheme {
                        hint: schemes
                            .hints
                            .get(&parsed.scheme)
                            .map(|hint| format!(" ({hint})"))
                            .unwrap_or_default(),
                        known: schemes.connectors.keys().cloned().collect(),
                        scheme: parsed.scheme,
                    })
                }
            }
        };
        connector(parsed).await
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
