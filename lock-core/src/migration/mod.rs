//! Moving a live fleet from one lock backend to another (say ZooKeeper to Redis) with no
//! moment where two processes both hold a lock.
//!
//! A fleet moves one step at a time through three phases, and a process's phase is just
//! the URL it is configured with:
//!
//! | phase | URL |
//! |---|---|
//! | old only | `zk://zk1:2181/locks` |
//! | dual | `dual:zk://zk1:2181/locks\|redis://redis1:6379` |
//! | new only | `redis://redis1:6379` |
//!
//! A dual client takes the old backend's lock first, then the new one's, so it excludes
//! old-only clients through the old backend and new-only clients through the new one: any
//! two *adjacent* phases may run side by side. Old only and new only never may.
//!
//! Fencing tokens never go back across the move: a dual hold's token is
//! `max(new counter + 1, old token)`, written to the new backend's counter in the same
//! atomic step as the grant (see docs/migration.md for the proof and its limits). The new
//! side therefore needs a counter it can raise ([`Capabilities::fence_at_least`]): every
//! Redis deployment (one server, Sentinel, Cluster, RedLock) and memory can be new sides,
//! ZooKeeper and etcd cannot.
//!
//! In a configuration file, [`DualConfig`] names the two URLs (`{ "old": "zk://…",
//! "new": "redis://…" }`) and [`Registry::connect_dual`] opens it.
//!
//! Dual clients mark their holds on both sides (their owner tokens start with
//! [`DUAL_TOKEN_PREFIX`]), so that [`check`](crate::raw::driver::Registry::migration_check) can
//! watch a set of names and report the old-only (or new-only) processes still running
//! before a step that would no longer exclude them.
//!
//! [`Capabilities::fence_at_least`]: crate::Capabilities::fence_at_least

mod check;
mod dual;
mod merge;
mod sides;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::erased::Opened;
use crate::error::{Error, Result};
use crate::lease::LeaseClient;
use crate::lock::DistributedLock;
use crate::options::{LockOptions, LockOptionsBuilder};
use crate::registry::{ComposeFuture, Registry};

pub use crate::state::Side;
pub use check::{CheckOptions, CheckReport, Role, Sighting, Step, TokenGap};
use dual::DualBackend;

/// The start of the owner token of every dual hold, on both sides.
pub const DUAL_TOKEN_PREFIX: &str = "dual-";

/// The URL scheme prefix of a dual lock: `dual:<old url>|<new url>`.
const DUAL_PREFIX: &str = "dual:";
/// What separates the two URLs of a dual lock (never unescaped in a lock URL).
const SEPARATOR: char = '|';

/// Whether an owner token stored on a server is a dual hold's.
pub fn is_dual_token(owner_token: &str) -> bool {
    owner_token.starts_with(DUAL_TOKEN_PREFIX)
}

/// The two backends of a dual lock, as URLs. Deserializes from `{ "old": "zk://…", "new":
/// "redis://…" }`; [`DualConfig::url`] gives the one-string form for an environment
/// variable.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DualConfig {
    /// The backend the fleet moves from.
    pub old: String,
    /// The backend the fleet moves to.
    pub new: String,
}

impl DualConfig {
    /// A dual lock from `old` to `new`.
    pub fn new(old: impl Into<String>, new: impl Into<String>) -> Self {
        DualConfig {
            old: old.into(),
            new: new.into(),
        }
    }

    /// `dual:<old>|<new>`.
    pub fn url(&self) -> String {
        format!("{DUAL_PREFIX}{}{SEPARATOR}{}", self.old, self.new)
    }

    /// Opens both sides through `registry`, each without a lease client.
    ///
    /// # Errors
    /// As [`Registry::connect`] for either side; [`Error::InvalidConfig`] for a side that
    /// is itself a dual lock.
    pub(crate) async fn open_sides(
        &self,
        registry: &Registry,
        options: &LockOptionsBuilder,
    ) -> Result<(Opened, Opened)> {
        for side in [&self.old, &self.new] {
            if DualConfig::from_url(side)?.is_some() {
                return Err(Error::config("a side of a dual lock cannot be a dual lock"));
            }
        }
        tokio::try_join!(
            registry.open(&self.old, options),
            registry.open(&self.new, options)
        )
    }

    /// Reads a `dual:<old url>|<new url>` URL; `Ok(None)` for any other URL.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a `dual:` URL without exactly two non-empty URLs (the
    /// message never repeats the URL, which may hold a password).
    pub fn from_url(url: &str) -> Result<Option<Self>> {
        let trimmed = url.trim();
        let Some(prefix) = trimmed.get(..DUAL_PREFIX.len()) else {
            return Ok(None);
        };
        if !prefix.eq_ignore_ascii_case(DUAL_PREFIX) {
            return Ok(None);
        }
        let rest = &trimmed[DUAL_PREFIX.len()..];
        let mut parts = rest.split(SEPARATOR);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(old), Some(new), None) if !old.trim().is_empty() && !new.trim().is_empty() => {
                Ok(Some(DualConfig::new(old.trim(), new.trim())))
            }
            _ => Err(Error::config(
                "malformed dual lock URL: expected `dual:<old url>|<new url>` with exactly one `|`",
            )),
        }
    }
}

impl std::fmt::Debug for DualConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URLs may hold passwords.
        f.debug_struct("DualConfig").finish_non_exhaustive()
    }
}

/// Makes `registry` serve `dual:<old url>|<new url>`, opening both sides through itself.
pub(crate) fn register_dual(registry: &Registry) {
    registry.register_composer(DUAL_PREFIX.trim_end_matches(':'), connect_dual_url);
}

fn connect_dual_url<'a>(
    registry: &'a Registry,
    url: &'a str,
    options: &'a LockOptionsBuilder,
) -> ComposeFuture<'a> {
    Box::pin(async move {
        let config = DualConfig::from_url(url)?.ok_or_else(|| {
            Error::config("malformed dual lock URL: expected `dual:<old url>|<new url>`")
        })?;
        registry.open_dual(&config, options).await
    })
}

impl Registry {
    /// Builds a dual (migration) lock client from `config`, as [`Registry::connect`] does
    /// for its `dual:` URL: both sides are opened through this registry.
    ///
    /// # Errors
    /// As [`Registry::connect`] for either side, [`Error::InvalidConfig`] when the two
    /// URLs give different lock options, [`Error::Unsupported`] for a new side whose
    /// fencing tokens cannot be raised.
    pub async fn connect_dual(&self, config: &DualConfig) -> Result<Arc<dyn DistributedLock>> {
        self.open_dual(config, &LockOptionsBuilder::default()).await
    }

    async fn open_dual(
        &self,
        config: &DualConfig,
        options: &LockOptionsBuilder,
    ) -> Result<Arc<dyn DistributedLock>> {
        let (old, new) = config.open_sides(self, options).await?;
        let options = agreed_options(&old.options, &new.options)?;
        let backend = DualBackend::new(old.backend, new.backend, options.request_timeout)?;
        Ok(Arc::new(LeaseClient::new(backend, options)?))
    }
}

/// The lock options of a dual client: both URLs must give the same.
fn agreed_options(old: &LockOptions, new: &LockOptions) -> Result<LockOptions> {
    let differs = [
        ("ttl", old.ttl != new.ttl),
        ("renewal", old.renewal != new.renewal),
        ("max_hold", old.max_hold != new.max_hold),
        (
            "request_timeout",
            old.request_timeout != new.request_timeout,
        ),
        ("recheck", old.recheck != new.recheck),
        ("metrics_names", old.metrics_names != new.metrics_names),
    ];
    match differs.iter().find(|(_, differs)| *differs) {
        Some((option, _)) => Err(Error::config(format!(
            "the old and new URLs of a dual lock give different `{option}`: give the same \
             lock options on both"
        ))),
        None => Ok(old.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dual_config_reads_from_serde_and_rejects_unknown_fields() {
        let config: DualConfig =
            serde_json::from_str(r#"{"old": "zk://h:2181/locks", "new": "redis://h:6379"}"#)
                .unwrap();
        assert_eq!(config.url(), "dual:zk://h:2181/locks|redis://h:6379");
        let unknown = r#"{"old": "zk://h", "new": "redis://h", "phase": "dual"}"#;
        assert!(serde_json::from_str::<DualConfig>(unknown).is_err());
    }

    #[test]
    fn dual_urls_split_in_two_and_others_are_not_dual() {
        let dual = DualConfig::from_url("dual:zk://h:2181/locks|redis://:pw@h:6379?ttl=5s")
            .unwrap()
            .unwrap();
        assert_eq!(dual.old, "zk://h:2181/locks");
        assert_eq!(dual.new, "redis://:pw@h:6379?ttl=5s");
        assert_eq!(
            DualConfig::from_url(&dual.url()).unwrap(),
            Some(dual.clone())
        );
        assert!(!format!("{dual:?}").contains("pw"));
        assert_eq!(DualConfig::from_url("redis://h").unwrap(), None);
        assert_eq!(DualConfig::from_url("du").unwrap(), None);
        for bad in [
            "dual:",
            "dual:zk://h",
            "dual:zk://h|",
            "DUAL:|redis://h",
            "dual:a|b|c",
        ] {
            let err = DualConfig::from_url(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{bad}");
        }
    }
}
