//! No password ever prints: every scheme's URL carries secrets (in the user info, in
//! `password`/`sentinel_password` query values, a `#` in one of them) to a port where
//! nothing listens, with good and with bad options, and neither the error (its `Display`,
//! its `Debug`, every source in its chain) nor a connected client's `Display`/`Debug`, nor
//! the parsed URL's, shows any of them. No server needed.

use std::error::Error as _;

use distlock::raw::url::LockUrl;
use tokio::net::TcpListener;

/// The secrets the URLs carry; none may appear in any text.
const SECRETS: [&str; 3] = ["hunter2-user-info", "sentinel-pw-0xBEEF", "query#pw-42"];

/// A loopback port with nothing listening on it.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Every scheme with secrets, at `host` (`127.0.0.1:PORT`).
fn urls(host: &str) -> Vec<String> {
    let [info, sentinel, query] = SECRETS;
    let query = query.replace('#', "%23");
    let hosts = format!("{host},{host},{host}");
    let fast = "request_timeout=300ms";
    vec![
        format!("redis://user:{info}@{host}?{fast}"),
        format!("redis://:{info}@{host}?{fast}&sentinel_password={sentinel}"),
        format!("rediss://user:{info}@{host}?{fast}&tls_ca=/nonexistent/ca.pem"),
        format!("redis+sentinel://user:{info}@{host}/primary?{fast}&sentinel_password={sentinel}"),
        format!("rediss+sentinel://:{info}@{host}/primary?{fast}&sentinel_password={sentinel}"),
        format!("redis+cluster://user:{info}@{host}?{fast}"),
        format!("rediss+cluster://user:{info}@{host}?{fast}"),
        format!("redlock://user:{info}@{hosts}?{fast}"),
        format!("zk://user:{info}@{host}/locks?{fast}"),
        format!("zks://user:{info}@{host}/locks?{fast}&tls_ca=/nonexistent/ca.pem"),
        format!("etcd://user:{info}@{host}/locks?{fast}"),
        format!("etcd://{host}/locks?{fast}&user=u&password={query}"),
        format!("etcds://user:{info}@{host}/locks?{fast}"),
        format!("memory://user:{info}@local?password={query}"),
        format!("dual:zk://user:{info}@{host}/locks?{fast}|redis://:{info}@{host}?{fast}"),
    ]
}

/// The URLs again with a bad option, and with an option no backend knows.
fn bad_urls(host: &str) -> Vec<String> {
    urls(host)
        .into_iter()
        .flat_map(|url| {
            let join = if url.contains('?') { '&' } else { '?' };
            [
                format!("{url}{join}ttl=banana"),
                format!("{url}{join}no_such_option=1"),
            ]
        })
        .collect()
}

/// The texts an error shows: `Display`, `Debug` and every source's `Display`.
fn error_texts(err: &distlock::Error) -> Vec<String> {
    let mut texts = vec![err.to_string(), format!("{err:?}")];
    let mut source = err.source();
    while let Some(cause) = source {
        texts.push(cause.to_string());
        source = cause.source();
    }
    texts
}

/// The secrets that `text` shows.
fn shown(text: &str) -> Vec<&'static str> {
    let decoded = text.replace("%23", "#");
    SECRETS
        .into_iter()
        .filter(|secret| decoded.contains(secret))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_any_error_debug_or_display() {
    let host = format!("127.0.0.1:{}", closed_port().await);
    let mut leaks = Vec::new();
    let all: Vec<String> = urls(&host).into_iter().chain(bad_urls(&host)).collect();
    for url in &all {
        let mut texts = match distlock::connect(url).await {
            Ok(client) => vec![client.to_string(), format!("{client:?}")],
            Err(err) => error_texts(&err),
        };
        if let Ok(parsed) = LockUrl::parse(url) {
            texts.extend([parsed.to_string(), format!("{parsed:?}"), parsed.redacted()]);
        }
        for text in texts {
            let secrets = shown(&text);
            if !secrets.is_empty() {
                leaks.push(format!("{secrets:?} shown for {url}: {text}"));
            }
        }
    }
    assert!(leaks.is_empty(), "secrets shown:\n{}", leaks.join("\n"));
}
