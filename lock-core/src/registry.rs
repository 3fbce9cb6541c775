//! Selecting a backend from a URL: backends register their schemes; [`connect`] builds
//! the client for a URL.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};

use crate::error::{Error, Result};
use crate::lock::DistributedLock;
use crate::lock_url::LockUrl;

/// A future that builds a lock client.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

/// Builds a lock client from a parsed URL.
pub type Connector = fn(LockUrl) -> ConnectFuture;

/// Schemes served by crates of this workspace, to name the crate when one is missing.
const KNOWN_CRATES: &[(&str, &str)] = &[
    ("redis", "lock-redis"),
    ("rediss", "lock-redis"),
    ("redlock", "lock-redis"),
    ("zk", "lock-zookeeper"),
    ("etcd", "lock-etcd"),
    ("etcds", "lock-etcd"),
];

/// A table of URL schemes and the backends that serve them.
#[derive(Default)]
pub struct Registry {
    connectors: RwLock<BTreeMap<String, Connector>>,
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

    /// Registers `connector` for `scheme`, replacing any earlier one.
    pub fn register(&self, scheme: &str, connector: Connector) {
        self.connectors
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(scheme.to_ascii_lowercase(), connector);
    }

    /// The registered schemes, sorted.
    pub fn schemes(&self) -> Vec<String> {
        self.connectors
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Builds a client for `url`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a malformed URL (the message never repeats the URL,
    /// which may hold a password); [`Error::UnknownScheme`] listing the known schemes
    /// and, where known, the crate that provides the missing one; whatever the backend
    /// reports.
    pub async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let parsed = LockUrl::parse(url)?;
        let scheme = parsed.scheme.clone();
        let connector = self
            .connectors
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&scheme)
            .copied();
        match connector {
            Some(connect) => connect(parsed).await,
            None => Err(Error::UnknownScheme {
                hint: KNOWN_CRATES
                    .iter()
                    .find(|(known, _)| *known == scheme)
                    .map(|(_, krate)| {
                        format!(" (served by crate `{krate}`: add it and call its `register()`)")
                    })
                    .unwrap_or_default(),
                scheme,
                known: self.schemes(),
            }),
        }
    }
}

/// The process-wide registry, with `memory://` registered.
pub fn registry() -> &'static Registry {
    static GLOBAL: OnceLock<Registry> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let registry = Registry::new();
        crate::memory::register_into(&registry);
        registry
    })
}

/// Builds a client for `url` from the process-wide [`registry`].
///
/// ```
/// # async fn demo() -> lock_core::Result<()> {
/// use lock_core::DistributedLockExt;
/// let locks = lock_core::connect("memory://docs?ttl=10s").await?;
/// let guard = locks.lock("reports/daily").await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
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
            (
                "redis://127.0.0.1:1",
                ErrorKind::UnknownScheme,
                "lock-redis",
            ),
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
            crate::memory::register_into(&registry);
            registry
        }
    }
}
