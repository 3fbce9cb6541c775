//! Options: client-wide defaults ([`LockOptions`]) and per-acquire choices ([`AcquireOptions`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::durations::{check_duration, format_duration, parse_option_duration};
use crate::error::{Error, Result};
use crate::kind::HoldKind;
use crate::token::OwnerId;

/// Default server-side lease of a hold: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Default deadline of one network call: 5 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on how long a waiter trusts a push before re-checking: 1 s.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(1);

/// How a held lock is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RenewalMode {
    /// A background watchdog renews every hold at TTL/3 until it is released
    /// (or [`LockOptions::max_hold`] is reached). The default.
    #[default]
    Auto,
    /// No watchdog: the holder calls [`crate::LockGuard::extend`] itself; the lock is
    /// lost when its TTL runs out.
    Manual,
}

impl RenewalMode {
    /// The value of the `renewal` URL option.
    fn as_query(self) -> &'static str {
        match self {
            RenewalMode::Auto => "auto",
            RenewalMode::Manual => "manual",
        }
    }
}

/// Client-wide defaults, usually from the URL query or a config file.
///
/// Every field has a documented default; URL query keys are given in brackets.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockOptions {
    /// Server-side lease of each hold \[`ttl`\]. Default 30 s. On ZooKeeper the
    /// session timeout plays this role; on etcd, the client's lease TTL.
    #[serde(with = "crate::durations::duration_text")]
    pub ttl: Duration,
    /// Renewal policy \[`renewal=auto|manual`\]. Default [`RenewalMode::Auto`].
    pub renewal: RenewalMode,
    /// Cap on the total time a hold is renewed \[`max_hold`\]. Default: none.
    #[serde(with = "crate::durations::duration_text::option")]
    pub max_hold: Option<Duration>,
    /// Deadline of each network call \[`request_timeout`\]. Default 5 s.
    #[serde(with = "crate::durations::duration_text")]
    pub request_timeout: Duration,
    /// Longest a waiter sleeps before re-checking, since pushes can be missed
    /// \[`recheck`\]. Default 1 s.
    #[serde(with = "crate::durations::duration_text")]
    pub recheck: Duration,
    /// Label the metrics of each hold and acquire with its lock name
    /// \[`metrics_names=true|false`\]. Default `false`: every lock name makes series of its
    /// own, so turn it on only for a small, fixed set of names (see [`crate::metrics`]).
    pub metrics_names: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            renewal: RenewalMode::Auto,
            max_hold: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            recheck: DEFAULT_RECHECK,
            metrics_names: false,
        }
    }
}

impl LockOptions {
    /// Applies one URL query pair if it is a common option; returns `Ok(false)` for a
    /// key that is not, so the backend can look at it (and reject what nobody knows).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the key is known but the value is not valid.
    pub fn apply_query_pair(&mut self, key: &str, value: &str) -> Result<bool> {
        match key {
            "ttl" => self.ttl = parse_option_duration(key, value)?,
            "renewal" => {
                self.renewal = match value {
                    "auto" => RenewalMode::Auto,
                    "manual" => RenewalMode::Manual,
                    _ => {
                        return Err(Error::config(format!(
                            "renewal must be `auto` or `manual`, not {value:?}"
                        )))
                    }
                }
            }
            "max_hold" => self.max_hold = Some(parse_option_duration(key, value)?),
            "request_timeout" => self.request_timeout = parse_option_duration(key, value)?,
            "recheck" => self.recheck = parse_option_duration(key, value)?,
            "metrics_names" => {
                self.metrics_names = match value {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Error::config(format!(
                            "metrics_names must be `true` or `false`, not {value:?}"
                        )))
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// These options as a URL query (`ttl=30s&renewal=auto&…`), which
    /// [`LockOptions::apply_query_pair`] reads back to the same options.
    pub fn to_query(&self) -> String {
        let mut query = format!(
            "ttl={}&renewal={}&request_timeout={}&recheck={}",
            format_duration(self.ttl),
            self.renewal.as_query(),
            format_duration(self.request_timeout),
            format_duration(self.recheck)
        );
        if let Some(cap) = self.max_hold {
            query.push_str(&format!("&max_hold={}", format_duration(cap)));
        }
        if self.metrics_names {
            query.push_str("&metrics_names=true");
        }
        query
    }

    /// Checks that every duration is positive and at most [`MAX_DURATION`](crate::raw::durations::MAX_DURATION).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        check_duration("ttl", self.ttl)?;
        check_duration("request_timeout", self.request_timeout)?;
        check_duration("recheck", self.recheck)?;
        if let Some(cap) = self.max_hold {
            check_duration("max_hold", cap)?;
        }
        Ok(())
    }
}

/// Lock options set in code: each one set wins over the URL's (and over the defaults).
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockOptions, RenewalMode};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// // A whole set of options, checked:
/// let options = LockOptions::builder().ttl(Duration::from_secs(10)).build()?;
/// assert_eq!(options.renewal, RenewalMode::Auto);
/// // Or a client whose URL gives the rest (the builder's `ttl` wins over `?ttl=30s`):
/// let overrides = LockOptions::builder().ttl(Duration::from_secs(10));
/// let locks = lock_core::connect_with("memory://docs?ttl=30s", &overrides).await?;
/// locks.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockOptionsBuilder {
    ttl: Option<Duration>,
    renewal: Option<RenewalMode>,
    max_hold: Option<Duration>,
    request_timeout: Option<Duration>,
    recheck: Option<Duration>,
    metrics_names: Option<bool>,
}

impl LockOptions {
    /// Options set in code, for [`LockOptionsBuilder::build`] or
    /// [`connect_with`](crate::connect_with).
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder::default()
    }
}

impl LockOptionsBuilder {
    /// Server-side lease of each hold ([`LockOptions::ttl`]).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Renewal policy ([`LockOptions::renewal`]).
    #[must_use]
    pub fn renewal(mut self, renewal: RenewalMode) -> Self {
        self.renewal = Some(renewal);
        self
    }

    /// Cap on the total time a hold is renewed ([`LockOptions::max_hold`]).
    #[must_use]
    pub fn max_hold(mut self, cap: Duration) -> Self {
        self.max_hold = Some(cap);
        self
    }

    /// Deadline of each network call ([`LockOptions::request_timeout`]).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Longest a waiter sleeps before re-checking ([`LockOptions::recheck`]).
    #[must_use]
    pub fn recheck(mut self, recheck: Duration) -> Self {
        self.recheck = Some(recheck);
        self
    }

    /// Label metrics with lock names ([`LockOptions::metrics_names`]).
    #[must_use]
    pub fn metrics_names(mut self, on: bool) -> Self {
        self.metrics_names = Some(on);
        self
    }

    /// Writes the options set here over `options`.
    pub fn apply(&self, options: &mut LockOptions) {
        if let Some(ttl) = self.ttl {
            options.ttl = ttl;
        }
        if let Some(renewal) = self.renewal {
            options.renewal = renewal;
        }
        if let Some(cap) = self.max_hold {
            options.max_hold = Some(cap);
        }
        if let Some(timeout) = self.request_timeout {
            options.request_timeout = timeout;
        }
        if let Some(recheck) = self.recheck {
            options.recheck = recheck;
        }
        if let Some(on) = self.metrics_names {
            options.metrics_names = on;
        }
    }

    /// The defaults with the options set here, checked.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming a duration that is zero or longer than
    /// [`MAX_DURATION`](crate::raw::durations::MAX_DURATION).
    pub fn build(&self) -> Result<LockOptions> {
        let mut options = LockOptions::default();
        self.apply(&mut options);
        options.validate()?;
        Ok(options)
    }

    /// The options set here as URL query pairs, read back by
    /// [`LockOptions::apply_query_pair`].
    pub(crate) fn query_pairs(&self) -> Vec<(String, String)> {
        let duration = |key: &str, value: Option<Duration>| {
            value.map(|value| (key.to_owned(), format_duration(value)))
        };
        [
            duration("ttl", self.ttl),
            self.renewal
                .map(|mode| ("renewal".to_owned(), mode.as_query().to_owned())),
            duration("max_hold", self.max_hold),
            duration("request_timeout", self.request_timeout),
            duration("recheck", self.recheck),
            self.metrics_names
                .map(|on| ("metrics_names".to_owned(), on.to_string())),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl From<LockOptions> for LockOptionsBuilder {
    /// Every option set, to the values of `options`.
    fn from(options: LockOptions) -> Self {
        LockOptionsBuilder {
            ttl: Some(options.ttl),
            renewal: Some(options.renewal),
            max_hold: options.max_hold,
            request_timeout: Some(options.request_timeout),
            recheck: Some(options.recheck),
            metrics_names: Some(options.metrics_names),
        }
    }
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// One attempt: `Ok(None)` if the lock is held by someone else.
    Try,
    /// Wait up to this long, then fail with [`Error::Timeout`].
    Timeout(Duration),
    /// Wait until the lock is acquired or the future is dropped. The default.
    #[default]
    Forever,
}

/// Per-acquire choices; anything left `None` takes the client's [`LockOptions`].
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct AcquireOptions {
    /// How long to wait. Default [`Wait::Forever`].
    pub wait: Wait,
    /// TTL of this hold (backends with a session-wide lease reject a different value).
    pub ttl: Option<Duration>,
    /// Renewal policy of this hold.
    pub renewal: Option<RenewalMode>,
    /// Cap on the total time this hold is renewed.
    pub max_hold: Option<Duration>,
    /// Reentrancy: acquisitions with the same owner id on the same client share one hold.
    pub owner: Option<OwnerId>,
    /// The kind of hold: a mutex unless a front end ([`Semaphore`](crate::Semaphore),
    /// [`RwLock`](crate::RwLock), [`Election`](crate::Election)) asks for another
    /// (backend authors: [`raw::backend::AcquireKind`](crate::raw::backend::AcquireKind)).
    pub(crate) kind: HoldKind,
}

/// The kind of hold an acquire asks for, which the typed front ends set: for backends,
/// tools and tests that drive every kind through one
/// [`DistributedLock::acquire`](crate::DistributedLock::acquire).
pub trait AcquireKind {
    /// These options, asking for a hold of `kind`.
    #[must_use]
    fn with_kind(self, kind: HoldKind) -> Self;

    /// The kind of hold asked for.
    fn kind(&self) -> &HoldKind;
}

impl AcquireKind for AcquireOptions {
    fn with_kind(mut self, kind: HoldKind) -> Self {
        self.kind = kind;
        self
    }

    fn kind(&self) -> &HoldKind {
        &self.kind
    }
}

impl AcquireOptions {
    /// One attempt, no waiting.
    pub fn try_once() -> Self {
        Self::default().with_wait(Wait::Try)
    }

    /// Wait at most `timeout`.
    pub fn timeout(timeout: Duration) -> Self {
        Self::default().with_wait(Wait::Timeout(timeout))
    }

    /// Wait until acquired.
    pub fn forever() -> Self {
        Self::default()
    }

    /// Sets how long to wait.
    pub fn with_wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the TTL of this hold.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Manual renewal: no watchdog, call [`crate::LockGuard::extend`].
    pub fn manual(mut self) -> Self {
        self.renewal = Some(RenewalMode::Manual);
        self
    }

    /// Automatic renewal for at most `cap` in total.
    pub fn with_max_hold(mut self, cap: Duration) -> Self {
        self.renewal = Some(RenewalMode::Auto);
        self.max_hold = Some(cap);
        self
    }

    /// Reentrant acquisition keyed by `owner`.
    pub fn reentrant(mut self, owner: impl Into<OwnerId>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_is_in_the_query() {
        let options = LockOptions {
            ttl: Duration::from_millis(1500),
            renewal: RenewalMode::Manual,
            max_hold: Some(Duration::from_secs(4)),
            metrics_names: true,
            ..LockOptions::default()
        };
        let mut parsed = LockOptions::default();
        for pair in options.to_query().split('&') {
            let (key, value) = pair.split_once('=').expect("key=value");
            assert!(parsed.apply_query_pair(key, value).expect("valid"), "{key}");
        }
        assert_eq!(parsed, options);
    }

    #[test]
    fn query_pairs_apply_or_pass_through() {
        let mut o = LockOptions::default();
        assert!(o.apply_query_pair("ttl", "10s").unwrap());
        assert!(o.apply_query_pair("renewal", "manual").unwrap());
        assert!(!o.apply_query_pair("password", "x").unwrap());
        assert_eq!(o.ttl, Duration::from_secs(10));
        assert_eq!(o.renewal, RenewalMode::Manual);
        assert!(o.apply_query_pair("ttl", "0s").is_err());
        assert!(o.apply_query_pair("renewal", "sometimes").is_err());
        let mut o = LockOptions::default();
        assert!(o.apply_query_pair("metrics_names", "true").unwrap());
        assert!(o.metrics_names);
        let err = o.apply_query_pair("metrics_names", "yes").unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{err}");
        assert!(err.to_string().contains("metrics_names"), "{err}");
    }

    #[test]
    fn serde_uses_readable_durations_and_defaults() {
        let o: LockOptions = serde_json::from_str(r#"{"ttl":"10s","max_hold":"1m"}"#).unwrap();
        assert_eq!(o.ttl, Duration::from_secs(10));
        assert_eq!(o.max_hold, Some(Duration::from_secs(60)));
        assert_eq!(o.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        let text = serde_json::to_string(&o).unwrap();
        assert!(text.contains(r#""ttl":"10s""#), "{text}");
        assert!(serde_json::from_str::<LockOptions>(r#"{"tll":"1s"}"#).is_err());
    }
}
