//! Lock options set in code ([`LockOptions::builder`], [`connect_with`]) against the
//! URL's: the code's win, on both sides of a dual lock, and are checked like the URL's.

use std::time::Duration;

use tokio::time::Instant;

use lock_core::{
    connect, connect_with, DistributedLockExt, ErrorKind, LockOptions, LockOptionsBuilder,
    RenewalMode,
};

fn space() -> String {
    format!("options-{}", uuid::Uuid::new_v4().simple())
}

/// How long a fresh hold of `url` with `options` is promised for.
async fn promised(url: &str, options: &LockOptionsBuilder) -> Duration {
    let locks = connect_with(url, options).await.expect("connect");
    let asked = Instant::now();
    let guard = locks.lock("promised").await.expect("lock");
    let left = guard.valid_until().saturating_duration_since(asked);
    guard.release().await.expect("release");
    locks.close().await.expect("close");
    left
}

#[tokio::test]
async fn options_set_in_code_win_over_the_url() {
    let url = format!("memory://{}?ttl=30s&renewal=manual", space());
    let left = promised(&url, &LockOptions::builder().ttl(Duration::from_secs(3))).await;
    assert!(left <= Duration::from_secs(3), "the code's ttl: {left:?}");
    assert!(left > Duration::from_secs(2), "the code's ttl: {left:?}");
    let left = promised(&url, &LockOptions::builder()).await;
    assert!(
        left > Duration::from_secs(20),
        "nothing set in code: the URL's ttl: {left:?}"
    );
    // Durations as humantime writes them, in the URL too.
    let url = format!("memory://{}?ttl=1m30s", space());
    let left = promised(&url, &LockOptions::builder()).await;
    assert!(left > Duration::from_secs(80), "1m30s: {left:?}");
}

#[tokio::test]
async fn options_set_in_code_reach_both_sides_of_a_dual_lock() {
    let url = format!(
        "dual:memory://{}?ttl=30s|memory://{}?ttl=20s",
        space(),
        space()
    );
    let err = connect(&url).await.expect_err("two TTLs");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("`ttl`"), "{err}");
    let left = promised(&url, &LockOptions::builder().ttl(Duration::from_secs(4))).await;
    assert!(left <= Duration::from_secs(4), "{left:?}");
    assert!(left > Duration::from_secs(3), "{left:?}");
}

#[tokio::test]
async fn options_set_in_code_are_checked_like_the_urls() {
    let zero = LockOptions::builder().ttl(Duration::ZERO);
    let err = zero.build().expect_err("a zero ttl");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("ttl"), "{err}");
    let url = format!("memory://{}", space());
    let err = connect_with(&url, &zero).await.expect_err("a zero ttl");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("ttl"), "{err}");
    let year_and_a_day = LockOptions::builder().recheck(Duration::from_secs(366 * 86_400));
    let err = connect_with(&url, &year_and_a_day)
        .await
        .expect_err("too long");
    assert!(err.to_string().contains("recheck"), "{err}");
    // An unknown scheme is still named as such.
    let err = connect_with("nope://x", &LockOptions::builder())
        .await
        .expect_err("scheme");
    assert_eq!(err.kind(), ErrorKind::UnknownScheme, "{err}");
}

#[test]
fn a_builder_builds_whole_options_and_round_trips_them() {
    let built = LockOptions::builder()
        .ttl(Duration::from_millis(1500))
        .renewal(RenewalMode::Manual)
        .max_hold(Duration::from_secs(60))
        .request_timeout(Duration::from_secs(2))
        .recheck(Duration::from_micros(250_500))
        .metrics_names(true)
        .build()
        .expect("valid");
    assert_eq!(built.ttl, Duration::from_millis(1500));
    assert_eq!(built.renewal, RenewalMode::Manual);
    assert_eq!(built.max_hold, Some(Duration::from_secs(60)));
    assert_eq!(built.recheck, Duration::from_micros(250_500));
    assert!(built.metrics_names);
    assert_eq!(
        LockOptionsBuilder::from(built.clone())
            .build()
            .expect("valid"),
        built
    );
    assert_eq!(
        LockOptions::builder().build().expect("defaults"),
        LockOptions::default()
    );
}

#[tokio::test]
async fn every_option_set_in_code_reaches_the_client() {
    // Through the URL query and back: a value that does not survive the trip would
    // change the promised lease or be refused.
    let options = LockOptionsBuilder::from(
        LockOptions::builder()
            .ttl(Duration::from_micros(2_000_300))
            .recheck(Duration::from_nanos(300_000_001))
            .build()
            .expect("valid"),
    );
    let left = promised(&format!("memory://{}", space()), &options).await;
    assert!(left <= Duration::from_micros(2_000_300), "{left:?}");
    assert!(left > Duration::from_secs(1), "{left:?}");
}
