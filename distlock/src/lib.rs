//! Distributed locks for async Rust: one [`DistributedLock`] trait and real backends
//! (Redis, RedLock, ZooKeeper, etcd, PostgreSQL, `file://` between the processes of one
//! machine, and `memory://` in process), chosen by a URL.
//!
//! ```
//! use distlock::DistributedLockExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
//! let locks = distlock::connect(&url).await?; // memory://, redis://, zk://, etcd://, postgres://, dual:…
//! let guard = locks.lock("reports/daily").await?; // waits, woken by a push
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lock lost: {reason}"), // stop work at once
//!     () = write_report(guard.fencing_token()) => {}             // fence every write
//! }
//! guard.release().await?; // Released, or AlreadyLost
//! locks.close().await?; // before the process exits
//! # Ok(()) }
//! # async fn write_report(_token: distlock::FencingToken) {}
//! ```
//!
//! Or let the library cancel the work when the lock is lost:
//!
//! ```
//! use std::time::Duration;
//! use distlock::{AcquireOptions, DistributedLockExt, RunOutcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! let locks = distlock::connect("memory://").await?;
//! let timeout = AcquireOptions::timeout(Duration::from_secs(30));
//! let outcome = locks
//!     .with_lock("jobs/rebuild", &timeout, |ctx| async move { rebuild(ctx.fencing_token).await })
//!     .await?;
//! match outcome {
//!     RunOutcome::Completed { value, .. } => println!("rebuilt {value} entries"),
//!     RunOutcome::Lost { reason } => eprintln!("lost the lock mid-way: {reason}"),
//!     RunOutcome::NotAcquired => eprintln!("someone else is rebuilding"),
//! }
//! # Ok(()) }
//! # async fn rebuild(_token: distlock::FencingToken) -> usize { 42 }
//! ```
//!
//! Every guard carries a strictly increasing fencing token ([`fence`]: resources that
//! check it themselves, on Redis, etcd, PostgreSQL or a local file), a validity deadline
//! on the monotonic clock and a Held / Suspect / Lost signal; every acquire is
//! cancellation-safe; guards never block in `Drop`. The URL options (`ttl`, `renewal`, `max_hold`,
//! `request_timeout`, `recheck`, and each backend's own), the guarantees of each backend and
//! topology, `lockctl`, the migration from one backend to another and the measured results
//! are in the repository's `docs/`, indexed by docs/README.md: a guide per primitive,
//! configuration.md, guarantees.md, operations.md, metrics.md, migration.md, benchmarks.md
//! and reliability.md.
//!
//! A backend of your own implements [`raw::backend::Backend`] and [`raw::driver::Connect`];
//! [`raw::driver::register`] makes [`connect`] serve its schemes.
//!
//! # Cargo features
//!
//! Each backend is a feature; [`connect`] serves the schemes of those compiled in and names
//! the feature to enable for the others. `memory://`, the in-process reference backend
//! ([`memory`]), is always there.
//!
//! | feature | schemes | module |
//! |---|---|---|
//! | `redis` | `redis://`, `rediss://`, `redlock://`, `redis+sentinel://`, `rediss+sentinel://`, `redis+cluster://`, `rediss+cluster://` | `redis` |
//! | `zookeeper` | `zk://`, `zks://` | `zookeeper` |
//! | `etcd` | `etcd://`, `etcds://` | `etcd` |
//! | `postgres` | `postgres://`, `postgresql://` | `postgres` |
//! | `file` | `file://` (one machine: `flock(2)` on a local directory) | `file` |
//! | `full` | all of the above | |
//!
//! `dual:<old url>|<new url>` (the old side any backend, the new side one that can raise
//! its fencing tokens: any Redis deployment, one server, Sentinel, Cluster or RedLock, or
//! `memory://`) is the dual lock of a migration between backends; see
//! [`migration`].
//!
//! TLS runs on rustls with one crypto provider, aws-lc-rs; the library installs no
//! process-wide provider (an application that compiles in a second one chooses at the start
//! of `main`: `rustls::crypto::aws_lc_rs::default_provider().install_default()`).

use std::sync::Arc;

pub use lock_core::*;

/// The Redis backend (one server, Sentinel, Cluster and RedLock): its configuration, hold
/// and key layout.
#[cfg(feature = "redis")]
pub use lock_redis as redis;

/// The ZooKeeper backend: its configuration, hold and node layout.
#[cfg(feature = "zookeeper")]
pub use lock_zookeeper as zookeeper;

/// The etcd backend: its configuration, hold and key layout.
#[cfg(feature = "etcd")]
pub use lock_etcd as etcd;

/// The PostgreSQL backend: its configuration, hold and table layout.
#[cfg(feature = "postgres")]
pub use lock_postgres as postgres;

/// The machine-local backend: its configuration, hold and file layout.
#[cfg(feature = "file")]
pub use lock_file as file;

/// Each backend feature and the URL schemes it serves, to name the feature a URL needs
/// when it is not compiled in. (When it is, the schemes come from the backend itself; a
/// test checks that the two agree.)
const FEATURE_SCHEMES: &[(&str, &[&str])] = &[
    (
        "redis",
        &[
            "redis",
            "rediss",
            "redlock",
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ],
    ),
    ("zookeeper", &["zk", "zks"]),
    ("etcd", &["etcd", "etcds"]),
    ("postgres", &["postgres", "postgresql"]),
    ("file", &["file"]),
];

/// The backend-author kit of [`lock_core::raw`], in the same rooms, with the process-wide
/// registry of this crate's backends in [`raw::driver`].
pub mod raw {
    pub use lock_core::raw::{backend, durations, names, plumbing, url};

    /// How a backend is declared, registered and opened by URL: [`lock_core::raw::driver`],
    /// with the registry that serves this crate's backends.
    pub mod driver {
        use std::sync::Once;

        pub use lock_core::raw::driver::{register, Connect, ConnectFuture, Driver, Registry};

        use crate::{DRIVERS, FEATURE_SCHEMES};

        /// The process-wide registry, the one [`connect`](crate::connect) reads: every
        /// backend compiled in, a hint naming the feature for the others, and whatever the
        /// application registered itself ([`register`]; a backend registered before the
        /// first call keeps its schemes).
        pub fn registry() -> &'static Registry {
            static FEATURES: Once = Once::new();
            let registry = lock_core::raw::driver::registry();
            FEATURES.call_once(|| {
                for (feature, schemes) in FEATURE_SCHEMES {
                    for scheme in *schemes {
                        registry.hint_unregistered(
                            scheme,
                            format!("enable the `{feature}` feature of the `distlock` crate"),
                        );
                    }
                }
                for driver in DRIVERS {
                    registry.register_missing(*driver);
                }
            });
            registry
        }
    }
}

/// The drivers of the backends compiled in (memory is always there).
const DRIVERS: &[raw::driver::Driver] = &[
    #[cfg(feature = "redis")]
    raw::driver::Driver::of::<lock_redis::RedisBackend>(),
    #[cfg(feature = "zookeeper")]
    raw::driver::Driver::of::<lock_zookeeper::ZkBackend>(),
    #[cfg(feature = "etcd")]
    raw::driver::Driver::of::<lock_etcd::EtcdBackend>(),
    #[cfg(feature = "postgres")]
    raw::driver::Driver::of::<lock_postgres::PostgresBackend>(),
    #[cfg(feature = "file")]
    raw::driver::Driver::of::<lock_file::FileBackend>(),
];

/// Connects a lock client for `url`, on whichever compiled-in backend serves its scheme.
///
/// ```
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::DistributedLockExt;
/// let locks = distlock::connect("memory://docs?ttl=10s").await?;
/// let guard = locks.lock("reports/daily").await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidConfig`] for a malformed URL or options (the message never repeats the
/// URL, which may hold a password); [`Error::UnknownScheme`] listing the schemes served and,
/// for a backend not compiled in, the feature to enable; whatever the backend reports
/// when it cannot connect ([`Error::Connection`] within the request timeout).
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    raw::driver::registry().connect(url).await
}

/// As [`connect`], with the lock options set in code winning over the URL's (on both sides
/// of a `dual:` URL): the URL says where, the code says how long.
///
/// ```
/// # async fn demo() -> distlock::Result<()> {
/// use std::time::Duration;
/// use distlock::LockOptions;
/// let options = LockOptions::builder()
///     .ttl(Duration::from_secs(10))
///     .request_timeout(Duration::from_secs(2));
/// let locks = distlock::connect_with("memory://docs?ttl=1m", &options).await?; // ttl 10 s
/// locks.close().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    url: &str,
    options: &LockOptionsBuilder,
) -> Result<Arc<dyn DistributedLock>> {
    raw::driver::registry().connect_with(url, options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_backend_not_compiled_in_names_its_feature() {
        for (feature, schemes) in FEATURE_SCHEMES {
            let compiled_in = match *feature {
                "redis" => cfg!(feature = "redis"),
                "zookeeper" => cfg!(feature = "zookeeper"),
                "etcd" => cfg!(feature = "etcd"),
                "postgres" => cfg!(feature = "postgres"),
                "file" => cfg!(feature = "file"),
                other => panic!("feature {other} missing from this test"),
            };
            let registered = raw::driver::registry().schemes();
            for scheme in *schemes {
                assert_eq!(
                    registered.contains(&scheme.to_string()),
                    compiled_in,
                    "{scheme}"
                );
                if !compiled_in {
                    let err = connect(&format!("{scheme}://127.0.0.1:1"))
                        .await
                        .expect_err("not compiled in");
                    assert_eq!(err.kind(), ErrorKind::UnknownScheme, "{err}");
                    assert!(
                        err.to_string().contains(&format!("`{feature}` feature")),
                        "{err}"
                    );
                }
            }
        }
    }

    #[test]
    #[cfg(any(
        feature = "redis",
        feature = "zookeeper",
        feature = "etcd",
        feature = "postgres",
        feature = "file"
    ))]
    fn feature_table_matches_the_backends() {
        use raw::driver::Connect;
        let table = |feature: &str| {
            FEATURE_SCHEMES
                .iter()
                .find(|(name, _)| *name == feature)
                .map(|(_, schemes)| schemes.to_vec())
        };
        #[cfg(feature = "redis")]
        assert_eq!(
            table("redis"),
            Some(lock_redis::RedisBackend::SCHEMES.to_vec())
        );
        #[cfg(feature = "zookeeper")]
        assert_eq!(
            table("zookeeper"),
            Some(lock_zookeeper::ZkBackend::SCHEMES.to_vec())
        );
        #[cfg(feature = "etcd")]
        assert_eq!(
            table("etcd"),
            Some(lock_etcd::EtcdBackend::SCHEMES.to_vec())
        );
        #[cfg(feature = "postgres")]
        assert_eq!(
            table("postgres"),
            Some(lock_postgres::PostgresBackend::SCHEMES.to_vec())
        );
        #[cfg(feature = "file")]
        assert_eq!(
            table("file"),
            Some(lock_file::FileBackend::SCHEMES.to_vec())
        );
    }
}
