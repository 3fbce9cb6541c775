//! Options: client-wide defaults ([`LockOptions`]) and per-acquire choices ([`AcquireOptions`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kind::HoldKind;
use crate::token::OwnerId;

/// Default server-side lease of a hold: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Default deadline of one network call: 5 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on how long a waiter trusts a push before re-checking: 1 s.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(1);
/// Longest accepted TTL or timeout: one year.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

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

/// Client-wide defaults, usually from the URL query or a config file.
///
/// Every field has a documented default; URL query keys are given in brackets.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockOptions {
    /// Server-side lease of each hold \[`ttl`\]. Default 30 s. On ZooKeeper the
    /// session timeout plays this role; on etcd, the client's lease TTL.
    #[serde(with = "crate::options::duration_text")]
    pub ttl: Duration,
    /// Renewal policy \[`renewal=auto|manual`\]. Default [`RenewalMode::Auto`].
    pub renewal: RenewalMode,
    /// Cap on the total time a hold is renewed \[`max_hold`\]. Default: none.
    #[serde(with = "crate::options::duration_text::option")]
    pub max_hold: Option<Duration>,
    /// Deadline of each network call \[`request_timeout`\]. Default 5 s.
    #[serde(with = "crate::options::duration_text")]
    pub request_timeout: Duration,
    /// Longest a waiter sleeps before re-checking, since pushes can be missed
    /// \[`recheck`\]. Default 1 s.
    #[serde(with = "crate::options::duration_text")]
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
        let renewal = match self.renewal {
            RenewalMode::Auto => "auto",
            RenewalMode::Manual => "manual",
        };
        let mut query = format!(
            "ttl={}&renewal={renewal}&request_timeout={}&recheck={}",
            format_duration(self.ttl),
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

    /// Checks that every duration is positive and at most [`MAX_DURATION`].
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

pub(crate) fn check_duration(field: &str, value: Duration) -> Result<()> {
    if value.is_zero() {
        return Err(Error::config(format!("{field} must be greater than zero")));
    }
    if value > MAX_DURATION {
        return Err(Error::config(format!(
            "{field} must be at most one year, got {value:?}"
        )));
    }
    Ok(())
}

/// A duration option's value: parsed, and in range for any duration option.
fn parse_option_duration(field: &str, text: &str) -> Result<Duration> {
    let value = parse_duration(field, text)?;
    check_duration(field, value)?;
    Ok(value)
}

/// Parses `250ms`, `30s`, `1.5s`, `2m` or `1h`.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `field` when the text is not such a duration.
pub fn parse_duration(field: &str, text: &str) -> Result<Duration> {
    let bad = || {
        Error::config(format!(
            "{field}: {text:?} is not a duration (use e.g. 250ms, 30s, 1.5s, 2m, 1h)"
        ))
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(bad()),
    };
    if !seconds.is_finite() || seconds < 0.0 || seconds > MAX_DURATION.as_secs_f64() {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(value: Duration) -> String {
    if value.subsec_nanos() == 0 {
        format!("{}s", value.as_secs())
    } else if value.subsec_nanos() % 1_000_000 == 0 {
        format!("{}ms", value.as_millis())
    } else {
        format!("{}s", value.as_secs_f64())
    }
}

/// Serde helpers that read and write durations as text (`250ms`, `30s`, `2m`), for
/// `#[serde(with = "lock_core::raw::durations::duration_text")]` (and `…::option` for
/// `Option<Duration>`).
pub mod duration_text {
    use std::time::Duration;

    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    /// Writes `value` as text.
    ///
    /// # Errors
    /// Whatever the serializer reports.
    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*value))
    }

    /// Reads a duration from text.
    ///
    /// # Errors
    /// When the text is not a duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration("duration", &text).map_err(D::Error::custom)
    }

    /// The same for `Option<Duration>`.
    pub mod option {
        use super::*;

        /// Writes `value` as text, or none.
        ///
        /// # Errors
        /// Whatever the serializer reports.
        pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match value {
                Some(v) => s.serialize_some(&crate::options::format_duration(*v)),
                None => s.serialize_none(),
            }
        }

        /// Reads an optional duration from text.
        ///
        /// # Errors
        /// When the text is not a duration.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| {
                    crate::options::parse_duration("duration", &text).map_err(D::Error::custom)
                })
                .transpose()
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
    /// The kind of hold: a mutex unless a front end ([`Election`](crate::Election)) asks
    /// for another.
    pub kind: HoldKind,
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
    fn durations_parse_and_round_trip() {
        for (text, expect) in [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
        ] {
            let parsed = parse_duration("ttl", text).unwrap();
            assert_eq!(parsed, expect);
            assert_eq!(
                parse_duration("ttl", &format_duration(parsed)).unwrap(),
                parsed
            );
        }
        for bad in ["", "30", "s", "-1s", "1d", "1e9h", "NaNs", "1..2s"] {
            let err = parse_duration("ttl", bad).unwrap_err();
            assert!(err.to_string().contains("ttl"), "{err}");
        }
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
