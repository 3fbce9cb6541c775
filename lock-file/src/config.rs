//! `file:///ABSOLUTE/DIR[?options]`: the directory whose files hold the locks.

use std::fmt;
use std::path::PathBuf;

use lock_core::raw::url::LockUrl;
use lock_core::{Error, LockOptions, Result};

/// What a `file://` client connects to.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct FileConfig {
    /// The lock directory, an absolute path. Created (this directory only, not its
    /// parents) when missing.
    pub dir: PathBuf,
    /// Client-wide lock options (`ttl`, `renewal`, `max_hold`, `request_timeout`,
    /// `recheck`, as on every backend). The TTL paces renewals, which check that the
    /// hold was not broken by an operator; holds do not expire (see the crate docs).
    pub options: LockOptions,
}

impl FileConfig {
    /// A configuration for `dir` with default options.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileConfig {
            dir: dir.into(),
            options: LockOptions::default(),
        }
    }

    /// Sets [`FileConfig::options`].
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Parses `file:///DIR` (or `file://localhost/DIR`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a host, credentials, a port, a relative or empty
    /// path, or an unknown option.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if url.username.is_some() || url.password.is_some() {
            return Err(Error::config("file:// URLs take no credentials"));
        }
        match url.hosts.as_slice() {
            [] => {}
            [one] if one.host == "localhost" && one.port.is_none() => {}
            _ => {
                return Err(Error::config(
                    "file:// URLs name a directory of this machine: file:///ABSOLUTE/DIR \
                     (no host, or localhost)",
                ))
            }
        }
        if !url.path.starts_with('/') || url.path.trim_end_matches('/').is_empty() {
            return Err(Error::config(
                "file:// URLs need an absolute directory path other than /: file:///run/lock/app",
            ));
        }
        let mut options = LockOptions::default();
        if let Some((key, _)) = url.apply_common_options(&mut options)?.first() {
            return Err(Error::config(format!(
                "unknown file:// option `{key}` (known: ttl, renewal, max_hold, request_timeout, recheck)"
            )));
        }
        Ok(FileConfig {
            dir: PathBuf::from(&url.path),
            options,
        })
    }

    /// Checks the path's shape (the directory itself is checked when opened).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a relative path or one with `..`.
    pub fn validate(&self) -> Result<()> {
        if !self.dir.is_absolute() {
            return Err(Error::config(
                "a file:// lock directory must be an absolute path",
            ));
        }
        if self
            .dir
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(Error::config(
                "a file:// lock directory must not contain `..`",
            ));
        }
        Ok(())
    }
}

impl fmt::Display for FileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file://{}", self.dir.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<FileConfig> {
        FileConfig::from_url(&LockUrl::parse(url)?)
    }

    #[test]
    fn urls_name_an_absolute_directory() {
        let config = parse("file:///run/lock/app?ttl=5s").expect("valid");
        assert_eq!(config.dir, PathBuf::from("/run/lock/app"));
        assert_eq!(config.options.ttl, std::time::Duration::from_secs(5));
        assert!(parse("file://localhost/tmp/x").is_ok());
        for bad in [
            "file://host/tmp/x",
            "file://user:pw@/tmp/x",
            "file://",
            "file:///",
            "file://localhost:1/tmp",
            "file:///tmp/x?colour=red",
        ] {
            let err = parse(bad).expect_err(bad);
            assert_eq!(
                err.kind(),
                lock_core::ErrorKind::InvalidConfig,
                "{bad}: {err}"
            );
            assert!(!err.to_string().contains("pw"), "{err}");
        }
    }
}
