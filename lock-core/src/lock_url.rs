//! Lock service URLs: `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?query]`.
//!
//! General URL parsers reject several hosts in one authority, which ZooKeeper, etcd and
//! RedLock URLs need, so this parser is the one place that reads them.

use std::fmt;

use percent_encoding::percent_decode_str;

use crate::error::{Error, Result};
use crate::options::{LockOptions, LockOptionsBuilder};

/// One `host[:port]` of a lock URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port, if given.
    pub port: Option<u16>,
}

impl HostPort {
    /// `host:port` with `default_port` when none was given (IPv6 in brackets).
    pub fn address(&self, default_port: u16) -> String {
        let port = self.port.unwrap_or(default_port);
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }
}

/// A parsed lock URL. `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct LockUrl {
    /// Lower-case scheme.
    pub scheme: String,
    /// Percent-decoded user name, if any.
    pub username: Option<String>,
    /// Percent-decoded password, if any.
    pub password: Option<String>,
    /// Hosts in the order given (may be empty, e.g. `memory://`).
    pub hosts: Vec<HostPort>,
    /// Percent-decoded path, `""` when absent (starts with `/` otherwise).
    pub path: String,
    /// Percent-decoded query pairs in order.
    pub query: Vec<(String, String)>,
}

impl LockUrl {
    /// Parses `text`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] describing the problem; the message never repeats the
    /// URL (it may hold a password).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |what: &str| Error::config(format!("malformed lock URL: {what}"));
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://…"))?;
        if scheme.is_empty()
            || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return Err(bad("invalid scheme"));
        }
        if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("white space or control characters"));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => before_query.split_at(i),
            None => (before_query, ""),
        };
        let (userinfo, hostlist) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let decode = |part: &str, what: &str| -> Result<String> {
            percent_decode_str(part)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| bad(&format!("{what} is not valid UTF-8 after percent-decoding")))
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = (!user.is_empty())
                    .then(|| decode(user, "user name"))
                    .transpose()?;
                let pass = pass.map(|p| decode(p, "password")).transpose()?;
                (user, pass)
            }
        };
        let mut hosts = Vec::new();
        if !hostlist.is_empty() {
            for item in hostlist.split(',') {
                hosts.push(parse_host(item).map_err(|what| bad(&what))?);
            }
        }
        let query = match query {
            Some(q) => form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
            None => Vec::new(),
        };
        Ok(LockUrl {
            scheme: scheme.to_ascii_lowercase(),
            username,
            password,
            hosts,
            path: decode(path, "path")?,
            query,
        })
    }

    /// Applies the common options of the query to `options` and returns the pairs that
    /// are not common options, for the backend to interpret.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a common option with a bad value.
    pub fn apply_common_options(&self, options: &mut LockOptions) -> Result<Vec<(String, String)>> {
        let mut rest = Vec::new();
        for (key, value) in &self.query {
            if !options.apply_query_pair(key, value)? {
                rest.push((key.clone(), value.clone()));
            }
        }
        Ok(rest)
    }

    /// Puts the options set in `options` in the query, in place of the URL's own.
    pub fn override_options(&mut self, options: &LockOptionsBuilder) {
        let set = options.query_pairs();
        self.query
            .retain(|(key, _)| !set.iter().any(|(overridden, _)| overridden == key));
        self.query.extend(set);
    }

    /// The URL as text with the password, and secret query values, replaced by `***`.
    pub fn redacted(&self) -> String {
        self.to_string()
    }

    /// `text`, a lock URL or several joined by `|` (a `dual:OLD|NEW` pair), fit to print:
    /// each URL [redacted](LockUrl::redacted), and a part that does not parse replaced by
    /// `<malformed URL>` rather than echoed (it may hold a password).
    pub fn redact(text: &str) -> String {
        let text = text.trim();
        let (prefix, urls) = match text.split_once(':') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("dual") => ("dual:", rest),
            _ => ("", text),
        };
        let parts: Vec<String> = urls
            .split('|')
            .map(|part| {
                LockUrl::parse(part.trim())
                    .map_or_else(|_| "<malformed URL>".to_owned(), |url| url.redacted())
            })
            .collect();
        format!("{prefix}{}", parts.join("|"))
    }
}

/// Whether the value of query key `key` is a secret: a password, token or the like,
/// alone or as the last word of a key (`sentinel_password`).
fn is_secret_key(key: &str) -> bool {
    const SECRET_WORDS: &[&str] = &["password", "pass", "token", "auth", "secret"];
    let last_word = key.rsplit(['_', '-', '.']).next().unwrap_or(key);
    SECRET_WORDS
        .iter()
        .any(|word| key.eq_ignore_ascii_case(word) || last_word.eq_ignore_ascii_case(word))
}

fn parse_host(item: &str) -> std::result::Result<HostPort, String> {
    if item.is_empty() {
        return Err("empty host in host list".into());
    }
    let (host, port) = if let Some(v6) = item.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| "unclosed [ in IPv6 host".to_owned())?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| "junk after IPv6 host".to_owned())?,
            ),
        };
        (host, port)
    } else {
        match item.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (item, None),
        }
    };
    if host.is_empty()
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
    {
        return Err("invalid host name".into());
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| "invalid port (1-65535)".to_owned())?,
        ),
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

impl fmt::Display for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if let Some(user) = &self.username {
            f.write_str(user)?;
        }
        if self.password.is_some() {
            f.write_str(":***")?;
        }
        if self.username.is_some() || self.password.is_some() {
            f.write_str("@")?;
        }
        for (i, host) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match host.port {
                Some(port) => f.write_str(&host.address(port))?,
                None if host.host.contains(':') => write!(f, "[{}]", host.host)?,
                None => f.write_str(&host.host)?,
            }
        }
        f.write_str(&self.path)?;
        for (i, (key, value)) in self.query.iter().enumerate() {
            let shown = if is_secret_key(key) { "***" } else { value };
            write!(f, "{}{key}={shown}", if i == 0 { '?' } else { '&' })?;
        }
        Ok(())
    }
}

impl fmt::Debug for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_host_urls_with_credentials() {
        let url = LockUrl::parse(
            "etcd://us%40r:p%3Ass@127.0.0.1:2379,[::1]:2380,node3/locks/a%2Fb?ttl=5s&x=1",
        )
        .unwrap();
        assert_eq!(url.scheme, "etcd");
        assert_eq!(url.username.as_deref(), Some("us@r"));
        assert_eq!(url.password.as_deref(), Some("p:ss"));
        assert_eq!(
            url.hosts,
            vec![
                HostPort {
                    host: "127.0.0.1".into(),
                    port: Some(2379)
                },
                HostPort {
                    host: "::1".into(),
                    port: Some(2380)
                },
                HostPort {
                    host: "node3".into(),
                    port: None
                },
            ]
        );
        assert_eq!(url.hosts[1].address(1), "[::1]:2380");
        assert_eq!(url.path, "/locks/a/b");
        assert_eq!(
            url.query,
            vec![("ttl".into(), "5s".into()), ("x".into(), "1".into())]
        );
        let shown = format!("{url} {url:?}");
        assert!(
            !shown.contains("p:ss") && !shown.contains("p%3Ass"),
            "{shown}"
        );
    }

    #[test]
    fn secret_query_values_and_dual_pairs_are_redacted() {
        let url = LockUrl::parse("redis+sentinel://h/p?sentinel_password=s1&auth=s2&x=1").unwrap();
        assert_eq!(
            url.redacted(),
            "redis+sentinel://h/p?sentinel_password=***&auth=***&x=1"
        );
        assert_eq!(
            LockUrl::redact(" DUAL:zk://u:s3@a:1/l | redis://:s4@b:2?password=s5 "),
            "dual:zk://u:***@a:1/l|redis://:***@b:2?password=***"
        );
        assert_eq!(LockUrl::redact("redis//:s6@h"), "<malformed URL>");
    }

    #[test]
    fn host_less_urls_parse() {
        let url = LockUrl::parse("memory://").unwrap();
        assert!(url.hosts.is_empty());
        assert_eq!(url.path, "");
        let url = LockUrl::parse("redlock://a:1,b:2,c:3?ttl=10s").unwrap();
        assert_eq!(url.hosts.len(), 3);
    }

    #[test]
    fn malformed_urls_get_clear_errors_without_secrets() {
        for bad in [
            "",
            "redis",
            "://x",
            "1redis://x",
            "redis://h:0",
            "redis://h:99999",
            "redis://h:port",
            "redis://a,,b",
            "redis://[::1",
            "redis://bad host",
            "redis://user:sekret@h:1:2:x",
            "redis://ho$t",
        ] {
            let err = LockUrl::parse(bad).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("invalid configuration: malformed lock URL"),
                "{bad}: {err}"
            );
            assert!(!err.to_string().contains("sekret"));
        }
    }
}
