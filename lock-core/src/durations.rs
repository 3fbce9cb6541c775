//! Durations as text: URL values, serde fields and messages read and write `250ms`, `30s`,
//! `1.5s`, `1m30s`, `100us`, and the range every duration option is checked against.

use std::time::Duration;

use crate::error::{Error, Result};

/// Longest accepted TTL or timeout: one year.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

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
pub(crate) fn parse_option_duration(field: &str, text: &str) -> Result<Duration> {
    let value = parse_duration(field, text)?;
    check_duration(field, value)?;
    Ok(value)
}

/// Parses a duration as [`humantime`] reads it: `250ms`, `30s`, `1.5s`, `2m`, `1h`, `1m30s`,
/// `100us`, `2h 15min`, `1day`.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `field` when the text is not such a duration, or is
/// longer than [`MAX_DURATION`].
pub fn parse_duration(field: &str, text: &str) -> Result<Duration> {
    let bad = || {
        Error::config(format!(
            "{field}: {text:?} is not a duration (use e.g. 250ms, 30s, 1.5s, 1m30s, 100us, 1h)"
        ))
    };
    let value = humantime::parse_duration(text.trim()).map_err(|_| bad())?;
    if value > MAX_DURATION {
        return Err(bad());
    }
    Ok(value)
}

/// Formats a duration the way [`parse_duration`] reads it back, exactly.
pub fn format_duration(value: Duration) -> String {
    if value.subsec_nanos() == 0 {
        format!("{}s", value.as_secs())
    } else if value.subsec_nanos() % 1_000_000 == 0 {
        format!("{}ms", value.as_millis())
    } else if value.subsec_nanos() % 1_000 == 0 {
        format!("{}us", value.as_micros())
    } else {
        format!("{}ns", value.as_nanos())
    }
}

/// Serde helpers that read and write durations as text (`250ms`, `30s`, `1m30s`), for
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
                Some(v) => s.serialize_some(&crate::durations::format_duration(*v)),
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
                    crate::durations::parse_duration("duration", &text).map_err(D::Error::custom)
                })
                .transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_round_trip() {
        for (text, expect) in [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("1m30s", Duration::from_secs(90)),
            ("100us", Duration::from_micros(100)),
            ("2h 15min", Duration::from_secs(8100)),
            ("1d", Duration::from_secs(86_400)),
            (" 3s ", Duration::from_secs(3)),
            ("1500001ns", Duration::from_nanos(1_500_001)),
            ("1.5m30s", Duration::from_secs(120)),
        ] {
            let parsed = parse_duration("ttl", text).unwrap();
            assert_eq!(parsed, expect);
            assert_eq!(
                parse_duration("ttl", &format_duration(parsed)).unwrap(),
                parsed
            );
        }
        for bad in [
            "", "30", "s", "-1s", "1e9h", "NaNs", "1..2s", "2years", "1.5",
        ] {
            let err = parse_duration("ttl", bad).unwrap_err();
            assert!(err.to_string().contains("ttl"), "{err}");
        }
    }
}
