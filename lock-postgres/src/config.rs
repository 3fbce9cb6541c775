//! Configuration: from a URL (`postgres://…`, `postgresql://…`) or a serde config file.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lock_core::raw::url::{HostPort, LockUrl};
use lock_core::{Error, LockOptions, Result};
use serde::{Deserialize, Serialize};

/// The port PostgreSQL listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 5432;

/// Default of [`PostgresConfig::schema`].
pub const DEFAULT_SCHEMA: &str = "distlock";

/// Default of [`PostgresConfig::mark_ttl`].
pub const DEFAULT_MARK_TTL: Duration = Duration::from_secs(60);

/// Default of [`PostgresConfig::pool_size`].
pub const DEFAULT_POOL_SIZE: usize = 16;

/// The query keys this backend reads besides the common ones of [`LockOptions`].
const OWN_KEYS: &[&str] = &[
    "user",
    "password",
    "dbname",
    "sslmode",
    "sslrootcert",
    "ca_file",
    "sslcert",
    "cert_file",
    "sslkey",
    "key_file",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
    "schema",
    "pool_size",
    "mark_ttl",
    "advisory_locks",
];

/// The error of `verify-ca` or `verify-full` without a CA.
pub(crate) const NEEDS_CA: &str = "sslmode=verify-ca and verify-full check the server's \
     certificate against a CA: give its PEM file as sslrootcert (or ca_file)";

/// The error of a client certificate without its key, or a key without its certificate.
pub(crate) const NEEDS_PAIR: &str =
    "a client certificate needs both sslcert (cert_file) and sslkey (key_file)";

/// Whether and how to use TLS (`sslmode=` of the connection string), as libpq does.
///
/// A CA ([`PostgresConfig::ca_file`]) given with `prefer` or `require` has the server's
/// certificate chain checked too (as libpq does with a root certificate file), as
/// `verify-ca` does.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Never.
    #[default]
    Disable,
    /// TLS where the server offers it, else plain; the server's certificate is not
    /// checked unless a CA is given (`allow` in a URL means this too).
    Prefer,
    /// Always TLS; the server's certificate is not checked unless a CA is given.
    Require,
    /// Always TLS; the server's certificate chain is checked against the CA (needed),
    /// not the host name it is for.
    VerifyCa,
    /// Always TLS; the server's certificate chain is checked against the CA (needed),
    /// and that it is for the host connected to.
    VerifyFull,
}

/// How to reach PostgreSQL and where the locks live.
///
/// From a URL: `postgres://[user[:password]@]host[:port][,host[:port]…][/dbname][?query]`
/// (or `postgresql://`). Query keys: the common [`LockOptions`] keys (`ttl`, `renewal`,
/// `max_hold`, `request_timeout`, `recheck`), the connection string's `user`,
/// `password`, `dbname`, `sslmode` (`disable`, `allow`, `prefer`, `require`, `verify-ca`,
/// `verify-full`), `sslrootcert` (or `ca_file`), `sslcert` (or `cert_file`), `sslkey` (or
/// `key_file`), `application_name`,
/// `connect_timeout` (seconds), `target_session_attrs` (`any`, `read-write`), and this
/// backend's `schema`, `pool_size`, `mark_ttl`, `advisory_locks` (`on`, `off`). Unknown
/// keys are an error.
///
/// `Debug` never shows the password.
#[non_exhaustive]
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// Servers to try in order, as `host:port`. Default: `["127.0.0.1:5432"]`.
    pub hosts: Vec<String>,
    /// Database. Default: the user name (as libpq does).
    pub dbname: Option<String>,
    /// User name. Default: `postgres`.
    pub username: Option<String>,
    /// Password. Default: none. Never printed.
    pub password: Option<String>,
    /// TLS. Default: [`SslMode::Disable`].
    pub sslmode: SslMode,
    /// The CA certificates (PEM) the server's certificate must chain to (URL:
    /// `sslrootcert` or `ca_file`). Default: none.
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM) to show the server, with [`key_file`](Self::key_file)
    /// (URL: `sslcert` or `cert_file`). Default: none.
    pub cert_file: Option<PathBuf>,
    /// The key (PEM) of [`cert_file`](Self::cert_file) (URL: `sslkey` or `key_file`).
    /// Default: none.
    pub key_file: Option<PathBuf>,
    /// `application_name` the server shows in `pg_stat_activity`. Default: `distlock`.
    pub application_name: String,
    /// Connection attempt bound. Default: the request timeout.
    #[serde(with = "lock_core::raw::durations::duration_text::option")]
    pub connect_timeout: Option<Duration>,
    /// Only a server that takes writes (`target_session_attrs=read-write`), so that a
    /// list of a primary and its standbys finds the primary. Default: `false` (`any`).
    pub read_write: bool,
    /// Schema of the lock tables, created on first use; also the `LISTEN` channel.
    /// Default: `distlock`.
    pub schema: String,
    /// Most connections a client opens for its statements (one more listens). Default 16.
    pub pool_size: usize,
    /// Shortest life of the mark a broken hold leaves (`force_release`): three times the
    /// holder's TTL, at least this. Default 60 s.
    #[serde(with = "lock_core::raw::durations::duration_text")]
    pub mark_ttl: Duration,
    /// Also take each name's advisory lock, on the key madelson's DistributedLock derives
    /// for it, so that applications locking the name with `pg_advisory_lock` and this
    /// client exclude each other (see the crate docs). Default: `false`.
    pub advisory_locks: bool,
    /// Lease TTL, timeouts, renewal policy. Default: [`LockOptions::default`].
    pub options: LockOptions,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            hosts: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            dbname: None,
            username: None,
            password: None,
            sslmode: SslMode::Disable,
            ca_file: None,
            cert_file: None,
            key_file: None,
            application_name: "distlock".into(),
            connect_timeout: None,
            read_write: false,
            schema: DEFAULT_SCHEMA.into(),
            pool_size: DEFAULT_POOL_SIZE,
            mark_ttl: DEFAULT_MARK_TTL,
            advisory_locks: false,
            options: LockOptions::default(),
        }
    }
}

impl PostgresConfig {
    /// A configuration for these servers (`host:port`), everything else default.
    pub fn new<S: Into<String>>(hosts: impl IntoIterator<Item = S>) -> Self {
        PostgresConfig {
            hosts: hosts.into_iter().map(Into::into).collect(),
            ..PostgresConfig::default()
        }
    }

    /// Sets [`PostgresConfig::schema`].
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets [`PostgresConfig::options`].
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Reads `postgres://…` or `postgresql://…`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another scheme, an unknown query key or a bad value;
    /// never quoting the password.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if !crate::SCHEMES.contains(&url.scheme.as_str()) {
            return Err(Error::config(format!(
                "the postgres backend cannot serve scheme `{}` (use postgres:// or postgresql://)",
                url.scheme
            )));
        }
        let path = url.path.trim_start_matches('/');
        let mut config = PostgresConfig {
            hosts: if url.hosts.is_empty() {
                PostgresConfig::default().hosts
            } else {
                url.hosts
                    .iter()
                    .map(|h: &HostPort| h.address(DEFAULT_PORT))
                    .collect()
            },
            dbname: (!path.is_empty()).then(|| path.to_owned()),
            username: url.username.clone(),
            password: url.password.clone(),
            ..PostgresConfig::default()
        };
        for (key, value) in url.apply_common_options(&mut config.options)? {
            let duration = |value: &str| lock_core::raw::durations::parse_duration(&key, value);
            match key.as_str() {
                "user" => config.username = Some(value),
                "password" => config.password = Some(value),
                "dbname" => config.dbname = Some(value),
                "application_name" => config.application_name = value,
                "schema" => config.schema = value,
                "sslmode" => {
                    config.sslmode = match value.as_str() {
                        "disable" => SslMode::Disable,
                        "allow" | "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        other => {
                            return Err(Error::config(format!(
                                "sslmode `{other}` is not one of disable, allow, prefer, \
                                 require, verify-ca, verify-full"
                            )))
                        }
                    }
                }
                "sslrootcert" | "ca_file" => {
                    if value == "system" {
                        return Err(Error::config(
                            "sslrootcert=system (the platform's CAs) is not supported: \
                             give the CA's PEM file",
                        ));
                    }
                    config.ca_file = Some(value.into());
                }
                "sslcert" | "cert_file" => config.cert_file = Some(value.into()),
                "sslkey" | "key_file" => config.key_file = Some(value.into()),
                "connect_timeout" => {
                    let seconds: u64 = value.parse().map_err(|_| {
                        Error::config(format!("connect_timeout is whole seconds, not {value:?}"))
                    })?;
                    config.connect_timeout = Some(Duration::from_secs(seconds));
                }
                "target_session_attrs" => {
                    config.read_write = match value.as_str() {
                        "any" => false,
                        "read-write" => true,
                        other => {
                            return Err(Error::config(format!(
                                "target_session_attrs `{other}` is not any or read-write"
                            )))
                        }
                    }
                }
                "pool_size" => {
                    config.pool_size = value.parse().map_err(|_| {
                        Error::config(format!("pool_size is a number, not {value:?}"))
                    })?;
                }
                "mark_ttl" => config.mark_ttl = duration(&value)?,
                "advisory_locks" => {
                    config.advisory_locks = match value.as_str() {
                        "on" | "true" | "1" => true,
                        "off" | "false" | "0" => false,
                        other => {
                            return Err(Error::config(format!(
                                "advisory_locks is on or off, not {other:?}"
                            )))
                        }
                    }
                }
                _ => {
                    return Err(Error::config(format!(
                        "unknown postgres:// option `{key}` (known: ttl, renewal, max_hold, \
                         request_timeout, recheck, {})",
                        OWN_KEYS.join(", ")
                    )))
                }
            }
        }
        Ok(config)
    }

    /// Checks what the lock options do not cover (those are [`LockOptions::validate`]'s).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<()> {
        if self.hosts.is_empty() {
            return Err(Error::config("postgres needs at least one host"));
        }
        if let Some(bad) = self
            .hosts
            .iter()
            .find(|h| h.is_empty() || h.contains("://") || h.contains('/'))
        {
            return Err(Error::config(format!(
                "postgres host {bad:?} must be host:port"
            )));
        }
        if self.schema.is_empty() || self.schema.len() > 63 || self.schema.contains('\0') {
            return Err(Error::config(
                "schema must be 1 to 63 bytes (a Postgres identifier)",
            ));
        }
        if self.pool_size == 0 {
            return Err(Error::config("pool_size must be at least 1"));
        }
        if self.mark_ttl < Duration::from_secs(1) {
            return Err(Error::config("mark_ttl must be at least 1s"));
        }
        if self.password.is_some() && self.username.is_none() {
            return Err(Error::config("a postgres password needs a user name"));
        }
        if matches!(self.sslmode, SslMode::VerifyCa | SslMode::VerifyFull) && self.ca_file.is_none()
        {
            return Err(Error::config(NEEDS_CA));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(Error::config(NEEDS_PAIR));
        }
        Ok(())
    }

    /// The user name the client logs in as.
    pub(crate) fn user(&self) -> &str {
        self.username.as_deref().unwrap_or("postgres")
    }

    /// `postgres://host:port,…/dbname?schema=…`, without credentials.
    pub(crate) fn label(&self) -> String {
        let db = self.dbname.as_deref().unwrap_or(self.user());
        let schema = if self.schema == DEFAULT_SCHEMA {
            String::new()
        } else {
            format!("?schema={}", self.schema)
        };
        format!("postgres://{}/{db}{schema}", self.hosts.join(","))
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("hosts", &self.hosts)
            .field("dbname", &self.dbname)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("sslmode", &self.sslmode)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("application_name", &self.application_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_write", &self.read_write)
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("mark_ttl", &self.mark_ttl)
            .field("advisory_locks", &self.advisory_locks)
            .field("options", &self.options)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use lock_core::raw::driver::Connect;
    use std::path::Path;

    use lock_core::ErrorKind;

    use super::*;
    use crate::PostgresBackend;

    #[test]
    fn urls_give_hosts_database_credentials_and_options() {
        let c = PostgresBackend::config_from_str(
            "postgresql://u:s3cret@10.0.0.1,10.0.0.2:6432/app?ttl=10s&schema=locks\
             &target_session_attrs=read-write&pool_size=4&sslmode=prefer",
        )
        .expect("valid");
        assert_eq!(c.hosts, ["10.0.0.1:5432", "10.0.0.2:6432"]);
        assert_eq!(c.dbname.as_deref(), Some("app"));
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.options.ttl, Duration::from_secs(10));
        assert_eq!(c.schema, "locks");
        assert!(c.read_write);
        assert_eq!(c.pool_size, 4);
        assert_eq!(c.sslmode, SslMode::Prefer);
        assert_eq!(
            c.label(),
            "postgres://10.0.0.1:5432,10.0.0.2:6432/app?schema=locks"
        );
        assert!(!format!("{c:?}").contains("s3cret"));
        let c = PostgresBackend::config_from_str("postgres://h").expect("valid");
        assert_eq!(c.label(), "postgres://h:5432/postgres");
    }

    #[test]
    fn sslmodes_and_tls_files_as_libpq_names_them() {
        for (mode, expected) in [
            ("disable", SslMode::Disable),
            ("allow", SslMode::Prefer),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let c = PostgresBackend::config_from_str(&format!(
                "postgres://h?sslmode={mode}&sslrootcert=/etc/ca.pem"
            ))
            .expect(mode);
            assert_eq!(c.sslmode, expected, "{mode}");
            assert_eq!(c.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        }
        let c = PostgresBackend::config_from_str(
            "postgres://u:s3cret@h?sslmode=verify-full&ca_file=/ca.pem&sslcert=/c.pem\
             &sslkey=/k.pem",
        )
        .expect("valid");
        assert_eq!(c.ca_file.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(c.cert_file.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(c.key_file.as_deref(), Some(Path::new("/k.pem")));
        let shown = format!("{c:?}");
        assert!(
            shown.contains("VerifyFull") && !shown.contains("s3cret"),
            "{shown}"
        );
        let c = PostgresBackend::config_from_str(
            "postgres://h?sslmode=require&cert_file=/c.pem&key_file=/k.pem",
        )
        .expect("valid");
        assert_eq!(c.ca_file, None);
        assert_eq!(c.cert_file.as_deref(), Some(Path::new("/c.pem")));
        // require needs no CA (as libpq: then the certificate is not checked).
        assert_eq!(
            PostgresBackend::config_from_str("postgres://h?sslmode=require")
                .expect("valid")
                .sslmode,
            SslMode::Require
        );
        let from_file: PostgresConfig = serde_json::from_str(
            r#"{"hosts": ["db:5432"], "sslmode": "verify-ca", "ca_file": "/ca.pem"}"#,
        )
        .expect("serde");
        assert_eq!(from_file.sslmode, SslMode::VerifyCa);
        assert_eq!(from_file.ca_file.as_deref(), Some(Path::new("/ca.pem")));
    }

    #[test]
    fn bad_urls_get_clear_errors_without_secrets() {
        for (url, needle) in [
            ("postgres://h?bogus=1", "bogus"),
            ("postgres://h?ttl=abc", "ttl"),
            ("redis://h", "cannot serve"),
            ("postgres://:s3cret@h", "user name"),
            ("postgres://h?sslmode=maybe", "sslmode"),
            ("postgres://h?sslmode=verify-full", "sslrootcert"),
            ("postgres://h?sslmode=verify-ca", "sslrootcert"),
            ("postgres://h?sslrootcert=system", "not supported"),
            ("postgres://h?sslmode=require&sslcert=/c.pem", "sslkey"),
            ("postgres://h?sslmode=require&key_file=/k.pem", "sslcert"),
            ("postgres://h?pool_size=0", "pool_size"),
            (
                "postgres://h?target_session_attrs=standby",
                "target_session_attrs",
            ),
            ("postgres://h?connect_timeout=1s", "whole seconds"),
        ] {
            let err = PostgresBackend::config_from_str(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            assert!(err.to_string().contains(needle), "{url}: {err}");
            assert!(!err.to_string().contains("s3cret"));
        }
    }
}
