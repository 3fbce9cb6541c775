//! Configuration of a `zk://` or `zks://` client: from a URL or a serde config struct.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::raw::url::LockUrl;
use lock_core::{Error, LockOptions, Result};
use serde::{Deserialize, Serialize};

use crate::layout::forbidden_in_path;

/// The default client port of ZooKeeper.
pub const DEFAULT_PORT: u16 = 2181;
/// The default path prefix under which lock directories live.
pub const DEFAULT_PREFIX: &str = "/locks";
/// The default bound on establishing a session: 10 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The refusal of a `zks://` configuration without `ca_file`.
pub(crate) const NEEDS_CA: &str =
    "zks:// needs ca_file: the PEM file of the CA that signed the servers' certificates";

/// The ACL given to the nodes this client creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZkAcl {
    /// `world:anyone` with every permission (ZooKeeper's `OPEN_ACL_UNSAFE`, Curator's
    /// default). The default.
    #[default]
    Open,
    /// Every permission for the authenticated creator only (`CREATOR_ALL_ACL`); needs
    /// digest credentials.
    Creator,
}

/// Configuration of a ZooKeeper lock client.
///
/// From a URL: `zk://[user:password@]host[:port][,host[:port]…][/prefix/path][?options]`,
/// `zks://…` for TLS. Options (besides the common `ttl`, `renewal`, `max_hold`,
/// `request_timeout`, `recheck`): `chroot=/path`, `acl=open|creator`,
/// `connect_timeout=10s`, `prefix=/path` as another way to give the URL path, and on
/// `zks://` `ca_file`, `cert_file`, `key_file` (PEM files).
///
/// `Debug` never shows the password (nor the contents of the key file: only its path).
#[non_exhaustive]
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// `host:port` of each server. Default: `127.0.0.1:2181`.
    #[serde(alias = "hosts")]
    pub endpoints: Vec<String>,
    /// The path prefix: lock `NAME` lives in the directory `<prefix>/<escaped NAME>`.
    /// Default [`DEFAULT_PREFIX`]. Given by the URL path (or the `prefix` option).
    #[serde(alias = "base")]
    pub prefix: String,
    /// A ZooKeeper chroot: every path of this client (the prefix included) is relative
    /// to it on the server. Default: none.
    pub chroot: Option<String>,
    /// Digest user name. Default: none (no authentication).
    pub username: Option<String>,
    /// Digest password. Default: none.
    pub password: Option<String>,
    /// ACL of created nodes. Default [`ZkAcl::Open`].
    pub acl: ZkAcl,
    /// Talk TLS (`zks://`) to ZooKeeper's `secureClientPort`. Default `false`.
    pub tls: bool,
    /// PEM file with the CA certificate(s) that signed the servers' certificates; needed
    /// by `zks://` (the client has no default trust store). Default: none. Each server's
    /// certificate must name the host as written in the URL (IP address or DNS name).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for mutual TLS (`ssl.clientAuth=need`). Default:
    /// none.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`. Default: none.
    pub key_file: Option<PathBuf>,
    /// Bound on re-establishing a session. Default 10 s. The first session, at connect,
    /// is bounded by the shorter of this and `options.request_timeout`.
    #[serde(with = "lock_core::raw::durations::duration_text")]
    pub connect_timeout: Duration,
    /// Lock options; `ttl` is the requested session timeout.
    pub options: LockOptions,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            endpoints: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            prefix: DEFAULT_PREFIX.to_owned(),
            chroot: None,
            username: None,
            password: None,
            acl: ZkAcl::Open,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            options: LockOptions::default(),
        }
    }
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("chroot", &self.chroot)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("acl", &self.acl)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("options", &self.options)
            .finish()
    }
}

impl ZkAcl {
    /// The ACL list of the nodes this client creates.
    pub(crate) fn acls(self) -> zookeeper_client::Acls<'static> {
        match self {
            ZkAcl::Open => zookeeper_client::Acls::anyone_all(),
            ZkAcl::Creator => zookeeper_client::Acls::creator_all(),
        }
    }
}

const KNOWN_KEYS: &str = "ttl, renewal, max_hold, request_timeout, recheck, chroot, acl, \
     connect_timeout, prefix, ca_file, cert_file, key_file";

impl ZkConfig {
    /// A configuration for servers `endpoints` (`host:port`), other fields at their
    /// defaults.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ZkConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..ZkConfig::default()
        }
    }

    /// Parses a `zk://` or `zks://` URL.
    ///
    /// Only parses: a connect checks the values once before it opens the backend, and
    /// [`ZkBackend::config_from_str`](crate::ZkBackend) gives a checked configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem (never the password).
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let tls = match url.scheme.as_str() {
            "zk" => false,
            "zks" => true,
            other => {
                return Err(Error::config(format!(
                    "the ZooKeeper backend serves zk:// and zks://, not {other}://"
                )))
            }
        };
        if url.hosts.is_empty() {
            return Err(Error::config("zk:// URLs need at least one host"));
        }
        let mut config = ZkConfig {
            endpoints: url.hosts.iter().map(|h| h.address(DEFAULT_PORT)).collect(),
            username: url.username.clone(),
            password: url.password.clone(),
            tls,
            ..ZkConfig::default()
        };
        let has_path = !matches!(url.path.as_str(), "" | "/");
        if has_path {
            config.prefix = url.path.clone();
        }
        for (key, value) in url.apply_common_options(&mut config.options)? {
            match key.as_str() {
                // The name the other backends use for it.
                "prefix" if has_path => {
                    return Err(Error::config(
                        "give the prefix either as the URL path or as `prefix=`, not both",
                    ))
                }
                "prefix" => config.prefix = value,
                "chroot" => config.chroot = Some(value),
                "acl" => {
                    config.acl = match value.as_str() {
                        "open" => ZkAcl::Open,
                        "creator" => ZkAcl::Creator,
                        _ => {
                            return Err(Error::config(format!(
                                "acl must be `open` or `creator`, not {value:?}"
                            )))
                        }
                    }
                }
                "connect_timeout" => {
                    config.connect_timeout =
                        lock_core::raw::durations::parse_duration(&key, &value)?;
                }
                "ca_file" => config.ca_file = Some(PathBuf::from(value)),
                "cert_file" => config.cert_file = Some(PathBuf::from(value)),
                "key_file" => config.key_file = Some(PathBuf::from(value)),
                "tls_domain" => {
                    return Err(Error::config(
                        "zks:// does not take tls_domain: the ZooKeeper client verifies the \
                         host as written in the URL, so name the server as its certificate does",
                    ))
                }
                _ => {
                    return Err(Error::config(format!(
                        "unknown zk:// option `{key}` (known: {KNOWN_KEYS})"
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
        if self.endpoints.is_empty()
            || self
                .endpoints
                .iter()
                .any(|h| h.is_empty() || h.contains(['/', ',']))
        {
            return Err(Error::config(
                "endpoints must be a non-empty list of host:port",
            ));
        }
        check_path("prefix", &self.prefix)?;
        if let Some(chroot) = &self.chroot {
            check_path("chroot", chroot)?;
        }
        if self.password.is_some() != self.username.is_some() {
            return Err(Error::config(
                "digest authentication needs both a user name and a password",
            ));
        }
        if self.username.as_deref().is_some_and(|u| u.contains(':')) {
            return Err(Error::config("a digest user name cannot contain `:`"));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(Error::config(
                "cert_file and key_file go together (mutual TLS needs both)",
            ));
        }
        if (self.ca_file.is_some() || self.cert_file.is_some()) && !self.tls {
            return Err(Error::config(
                "ca_file, cert_file and key_file need TLS: use zks://",
            ));
        }
        if self.tls && self.ca_file.is_none() {
            return Err(Error::config(NEEDS_CA));
        }
        if self.acl == ZkAcl::Creator && self.username.is_none() {
            return Err(Error::config("acl=creator needs digest credentials"));
        }
        if self.connect_timeout.is_zero()
            || self.connect_timeout > lock_core::raw::durations::MAX_DURATION
        {
            return Err(Error::config(
                "connect_timeout must be between 0 and one year",
            ));
        }
        let ms = self.options.ttl.as_millis();
        if ms > u128::from(i32::MAX.unsigned_abs()) {
            return Err(Error::config(
                "ttl (the ZooKeeper session timeout) must fit in 2^31 ms",
            ));
        }
        Ok(())
    }

    /// The connect string the client library takes: `h1:p1,h2:p2[/chroot]`.
    pub(crate) fn connect_string(&self) -> String {
        let mut text = self.endpoints.join(",");
        if let Some(chroot) = &self.chroot {
            text.push_str(chroot);
        }
        text
    }

    /// `zk://endpoints[/chroot]/prefix` (`zks://` with TLS) without credentials, for
    /// `Display`.
    pub(crate) fn endpoint(&self) -> String {
        format!(
            "{}://{}{}{}",
            if self.tls { "zks" } else { "zk" },
            self.endpoints.join(","),
            self.chroot.as_deref().unwrap_or(""),
            self.prefix
        )
    }
}

/// An absolute ZooKeeper path: `/a/b`, no trailing `/`, no empty, `.` or `..` segment.
fn check_path(field: &str, path: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::config(format!("{field} path {path:?} {why}")));
    if !path.starts_with('/') || path.len() < 2 {
        return bad("must be absolute and not the root (e.g. /locks)");
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return bad("has an empty, `.` or `..` segment");
        }
        if segment.chars().any(forbidden_in_path) {
            return bad("has a character ZooKeeper does not allow");
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return bad("is reserved by ZooKeeper");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZkBackend;
    use lock_core::raw::driver::Connect;
    use lock_core::ErrorKind;

    #[test]
    fn parses_endpoints_prefix_credentials_and_options() {
        let config = ZkBackend::config_from_str(
            "zk://app:s%3Acret@10.0.0.1,10.0.0.2:2182/svc/locks?ttl=8s&chroot=/prod&acl=creator&connect_timeout=3s",
        )
        .unwrap();
        assert_eq!(config.endpoints, vec!["10.0.0.1:2181", "10.0.0.2:2182"]);
        assert_eq!(config.prefix, "/svc/locks");
        assert_eq!(config.chroot.as_deref(), Some("/prod"));
        assert_eq!(config.username.as_deref(), Some("app"));
        assert_eq!(config.password.as_deref(), Some("s:cret"));
        assert_eq!(config.acl, ZkAcl::Creator);
        assert_eq!(config.connect_timeout, Duration::from_secs(3));
        assert_eq!(config.options.ttl, Duration::from_secs(8));
        assert_eq!(config.connect_string(), "10.0.0.1:2181,10.0.0.2:2182/prod");
        let shown = format!("{config:?} {}", config.endpoint());
        assert!(!shown.contains("s:cret"), "{shown}");
    }

    #[test]
    fn zks_urls_take_certificate_files() {
        let config = ZkBackend::config_from_str(
            "zks://app:s3cret@zk1:2281,zk2:2281/locks?ca_file=/etc/zk/ca.pem&cert_file=/etc/zk/c.pem&key_file=/etc/zk/c.key",
        )
        .unwrap();
        assert!(config.tls);
        assert_eq!(config.ca_file, Some(PathBuf::from("/etc/zk/ca.pem")));
        assert_eq!(config.cert_file, Some(PathBuf::from("/etc/zk/c.pem")));
        assert_eq!(config.key_file, Some(PathBuf::from("/etc/zk/c.key")));
        assert_eq!(config.endpoint(), "zks://zk1:2281,zk2:2281/locks");
        let shown = format!("{config:?}");
        assert!(
            shown.contains("c.key") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(!ZkBackend::config_from_str("zk://h/locks").unwrap().tls);
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<ZkConfig>(&json).unwrap(), config);
    }

    #[test]
    fn defaults_apply_without_path() {
        let config = ZkBackend::config_from_str("zk://127.0.0.1:2181").unwrap();
        assert_eq!(config.prefix, DEFAULT_PREFIX);
        assert_eq!(config.acl, ZkAcl::Open);
        assert_eq!(config.chroot, None);
    }

    #[test]
    fn prefix_option_and_old_field_names_are_accepted() {
        let config = ZkBackend::config_from_str("zk://h?prefix=/svc/locks").unwrap();
        assert_eq!(config.prefix, "/svc/locks");
        let err = ZkBackend::config_from_str("zk://h/locks?prefix=/other").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        let old: ZkConfig = serde_json::from_str(r#"{"hosts": ["a:1"], "base": "/x"}"#).unwrap();
        assert_eq!(
            (old.endpoints, old.prefix),
            (vec!["a:1".to_owned()], "/x".to_owned())
        );
    }

    #[test]
    fn bad_urls_get_clear_errors() {
        let cases = [
            ("zk:///locks", "host"),
            ("zk://h/locks?bogus=1", "bogus"),
            ("zk://h/locks?acl=everyone", "acl"),
            ("zk://h/locks?acl=creator", "credentials"),
            ("zk://u@h/locks", "password"),
            ("zk://h/locks/", "prefix"),
            ("zk://h/a//b", "prefix"),
            ("zk://h/a/../b", "prefix"),
            ("zk://h/zookeeper/x", "reserved"),
            ("zk://h/locks?chroot=relative", "chroot"),
            ("zk://h/locks?ttl=30000h", "ttl"),
            ("zk://h/locks?connect_timeout=0s", "connect_timeout"),
            ("zks://h/locks", "ca_file"),
            ("zk://h/locks?ca_file=/ca.pem", "zks://"),
            ("zks://h/locks?ca_file=/ca.pem&cert_file=/c.pem", "key_file"),
            ("zks://h/locks?ca_file=/ca.pem&key_file=/c.key", "cert_file"),
            ("zks://h/locks?ca_file=/ca.pem&tls_domain=zk", "tls_domain"),
            ("zkss://h/locks", "zks://"),
        ];
        for (url, needle) in cases {
            let err = ZkBackend::config_from_str(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            assert!(err.to_string().contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn serde_config_round_trips() {
        let config = ZkBackend::config_from_str("zk://a:1,b:2/x?ttl=5s").unwrap();
        let json = serde_json::to_string(&config).unwrap();
        let back: ZkConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
        let err = serde_json::from_str::<ZkConfig>(r#"{"nope": 1}"#).unwrap_err();
        assert!(err.to_string().contains("nope"));
    }
}
