//! Configuration: from a URL (`etcd://…`, `etcds://…`) or a serde config file.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::raw::url::{HostPort, LockUrl};
use lock_core::{Error, LockName, LockOptions, Result};
use serde::{Deserialize, Serialize};

use crate::layout::lock_prefix;

/// The client port etcd listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 2379;

/// The query keys this backend reads besides the common ones of [`LockOptions`].
const OWN_KEYS: &[&str] = &[
    "user",
    "username",
    "password",
    "ca_file",
    "cert_file",
    "key_file",
    "tls_domain",
    "mark_ttl",
];

/// Default of [`EtcdConfig::mark_ttl`].
pub const DEFAULT_MARK_TTL: Duration = Duration::from_secs(60);

/// How to reach etcd and where the locks live.
///
/// From a URL: `etcd://[user[:password]@]host[:port][,host[:port]…][/prefix][?query]`,
/// `etcds://…` for TLS. Query keys: the common [`LockOptions`] keys (`ttl`, `renewal`,
/// `max_hold`, `request_timeout`, `recheck`) and `user` (or `username`), `password`,
/// `ca_file`, `cert_file`, `key_file`, `tls_domain`, `mark_ttl`. Unknown keys are an error.
///
/// `Debug` never shows the password.
#[non_exhaustive]
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Members to talk to, as `host:port`. Default: `["127.0.0.1:2379"]`.
    pub endpoints: Vec<String>,
    /// Key prefix of every lock: a lock `NAME` lives under `<prefix>/<NAME>/`, or under
    /// `<NAME>/` when the prefix is empty. Default: empty, which gives the very keys of
    /// `etcdctl lock NAME`. In a URL the path after the hosts, without its leading `/`
    /// (`etcd://h/locks` gives `locks`; `etcd://h//locks` gives `/locks`).
    pub prefix: String,
    /// User name for etcd authentication. Default: none.
    pub username: Option<String>,
    /// Password for etcd authentication. Default: none. Never printed.
    pub password: Option<String>,
    /// Talk TLS (`etcds://`). Default: `false`.
    pub tls: bool,
    /// PEM file with the CA certificate(s) that signed the server's certificate. Default:
    /// the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS. Default: none.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`. Default: none.
    pub key_file: Option<PathBuf>,
    /// Server name to verify in the server's certificate. Default: the host name.
    pub tls_domain: Option<String>,
    /// Shortest life of the mark a broken hold leaves (`force_release`): its lease lives
    /// three times the holder's lease TTL, at least this, so that a holder that comes
    /// back later than that is told `Vanished` rather than `Broken` \[`mark_ttl`\].
    /// Default 60 s; whole seconds, at least 1 s.
    #[serde(with = "lock_core::raw::durations::duration_text")]
    pub mark_ttl: Duration,
    /// Lease TTL (whole seconds, rounded up; at least 1 s), timeouts, renewal policy.
    /// Default: [`LockOptions::default`].
    pub options: LockOptions,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            prefix: String::new(),
            username: None,
            password: None,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            tls_domain: None,
            mark_ttl: DEFAULT_MARK_TTL,
            options: LockOptions::default(),
        }
    }
}

impl EtcdConfig {
    /// A configuration for these endpoints (`host:port`), everything else default.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..EtcdConfig::default()
        }
    }

    /// Sets [`EtcdConfig::prefix`].
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets user name and password.
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.username = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Sets [`EtcdConfig::options`].
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Reads `etcd://…` or `etcds://…`.
    ///
    /// Only parses: a connect checks the values once before it opens the backend, and
    /// [`EtcdBackend::config_from_str`](crate::EtcdBackend) gives a checked configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, no host, an unknown query key, a bad
    /// option value, or a password without a user; never quoting the password.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let tls = match url.scheme.as_str() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(Error::config(format!(
                    "the etcd backend cannot serve scheme `{other}` (use etcd:// or etcds://)"
                )))
            }
        };
        if url.hosts.is_empty() {
            return Err(Error::config(
                "etcd:// URLs need at least one host: etcd://host:port[,host:port…]/prefix",
            ));
        }
        let mut config = EtcdConfig {
            endpoints: url
                .hosts
                .iter()
                .map(|h: &HostPort| h.address(DEFAULT_PORT))
                .collect(),
            prefix: prefix_from_path(&url.path),
            username: url.username.clone(),
            password: url.password.clone(),
            tls,
            ..EtcdConfig::default()
        };
        for (key, value) in url.apply_common_options(&mut config.options)? {
            match key.as_str() {
                "user" | "username" => config.username = Some(value),
                "password" => config.password = Some(value),
                "ca_file" => config.ca_file = Some(PathBuf::from(value)),
                "cert_file" => config.cert_file = Some(PathBuf::from(value)),
                "key_file" => config.key_file = Some(PathBuf::from(value)),
                "tls_domain" => config.tls_domain = Some(value),
                "mark_ttl" => {
                    config.mark_ttl =
                        lock_core::raw::durations::parse_duration("mark_ttl", &value)?;
                }
                _ => {
                    return Err(Error::config(format!(
                        "unknown etcd:// option `{key}` (known: ttl, renewal, max_hold, \
                         request_timeout, recheck, {})",
                        OWN_KEYS.join(", ")
                    )))
                }
            }
        }
        Ok(config)
    }

    /// Checks what the lock options do not cover (those are [`LockOptions::validate`]'s):
    /// the parts that can be checked without a server.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::config("etcd needs at least one endpoint"));
        }
        if let Some(bad) = self
            .endpoints
            .iter()
            .find(|e| e.is_empty() || e.contains("://") || e.contains('/'))
        {
            return Err(Error::config(format!(
                "etcd endpoint {bad:?} must be host:port (the scheme picks TLS)"
            )));
        }
        if self.mark_ttl < Duration::from_secs(1) {
            return Err(Error::config(format!(
                "mark_ttl must be at least 1s (etcd leases are whole seconds), not {:?}",
                self.mark_ttl
            )));
        }
        if self.password.is_some() && self.username.is_none() {
            return Err(Error::config("an etcd password needs a user name"));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(Error::config(
                "cert_file and key_file go together (mutual TLS needs both)",
            ));
        }
        let tls_files = self.ca_file.is_some() || self.cert_file.is_some();
        if (tls_files || self.tls_domain.is_some()) && !self.tls {
            return Err(Error::config(
                "ca_file, cert_file, key_file and tls_domain need TLS: use etcds://",
            ));
        }
        Ok(())
    }

    /// The key range of lock `name`: `<prefix>/<escaped name>/` (or `<escaped name>/`
    /// with an empty prefix). Every key of the lock's queue starts with it.
    ///
    /// `%` and `/` in a name are percent-encoded, so `jobs` and `jobs/daily` never share
    /// a range; a name without them is used as is.
    pub fn lock_prefix(&self, name: &LockName) -> String {
        lock_prefix(&self.prefix, name)
    }

    /// The endpoints with their scheme (`http://` or `https://`).
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }

    /// `etcd://host:port,…/prefix`, without credentials.
    pub(crate) fn label(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let path = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("/{}", self.prefix)
        };
        format!("{scheme}://{}{path}", self.endpoints.join(","))
    }
}

fn prefix_from_path(path: &str) -> String {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.trim_end_matches('/').to_owned()
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("tls_domain", &self.tls_domain)
            .field("mark_ttl", &self.mark_ttl)
            .field("options", &self.options)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lock_core::ErrorKind;

    use super::*;
    use crate::EtcdBackend;
    use lock_core::raw::driver::Connect;

    #[test]
    fn urls_give_endpoints_prefix_credentials_and_options() {
        let c = EtcdBackend::config_from_str(
            "etcd://u:s3cret@10.0.0.1,10.0.0.2:3379/locks/?ttl=10s&recheck=250ms",
        )
        .expect("valid");
        assert_eq!(c.endpoints, ["10.0.0.1:2379", "10.0.0.2:3379"]);
        assert_eq!(c.prefix, "locks");
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("s3cret"));
        assert!(!c.tls);
        assert_eq!(c.options.ttl, Duration::from_secs(10));
        assert_eq!(c.options.recheck, Duration::from_millis(250));
        assert_eq!(c.mark_ttl, DEFAULT_MARK_TTL);
        assert_eq!(c.endpoint_urls()[0], "http://10.0.0.1:2379");
        assert_eq!(c.label(), "etcd://10.0.0.1:2379,10.0.0.2:3379/locks");
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");

        let c =
            EtcdBackend::config_from_str("etcds://h//abs?ca_file=/ca.pem&tls_domain=etcd.local")
                .expect("valid");
        assert!(c.tls);
        assert_eq!(c.prefix, "/abs");
        assert_eq!(c.endpoint_urls()[0], "https://h:2379");
        assert_eq!(c.tls_domain.as_deref(), Some("etcd.local"));

        let c = EtcdBackend::config_from_str("etcd://h?mark_ttl=3s").expect("valid");
        assert_eq!(c.prefix, "");
        assert_eq!(c.mark_ttl, Duration::from_secs(3));

        // `user` and the common name `username` both set the user name.
        for key in ["user", "username"] {
            let c = EtcdBackend::config_from_str(&format!("etcd://h?{key}=u&password=p"))
                .expect("valid");
            assert_eq!(c.username.as_deref(), Some("u"), "{key}");
        }
    }

    #[test]
    fn bad_urls_get_clear_errors_without_secrets() {
        for (url, needle) in [
            ("etcd://h?bogus=1", "bogus"),
            ("etcd://h?ttl=abc", "ttl"),
            ("etcd://", "at least one host"),
            ("redis://h", "cannot serve"),
            ("etcd://:s3cret@h", "user name"),
            ("etcd://h?ca_file=/x", "etcds://"),
            ("etcds://h?cert_file=/x", "go together"),
            ("etcd://h?mark_ttl=500ms", "mark_ttl must be at least 1s"),
            ("etcd://h?mark_ttl=soon", "mark_ttl"),
        ] {
            let err = EtcdBackend::config_from_str(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            assert!(err.to_string().contains(needle), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"));
        }
    }

    #[test]
    fn serde_config_has_defaults_and_rejects_unknown_fields() {
        let c: EtcdConfig =
            serde_json::from_str(r#"{"prefix":"locks","options":{"ttl":"5s"}}"#).expect("valid");
        assert_eq!(c.endpoints, ["127.0.0.1:2379"]);
        assert_eq!(c.options.ttl, Duration::from_secs(5));
        assert!(serde_json::from_str::<EtcdConfig>(r#"{"prefx":"x"}"#).is_err());
    }
}
