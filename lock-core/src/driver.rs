//! How a backend is opened from a configuration or a URL, written once for every backend:
//! a backend declares its schemes, its configuration and how it opens a connection
//! ([`Connect`]); the client constructors and its [`Driver`], the entry a
//! [`Registry`](crate::raw::driver::Registry) keeps, follow from that.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::Backend;
use crate::erased::{AnyBackend, Opened};
use crate::error::{Error, Result};
use crate::lease::LeaseClient;
use crate::lock::DistributedLock;
use crate::lock_url::LockUrl;
use crate::options::LockOptions;

/// A future that builds a lock client.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>>> + Send>>;

/// A future that opens a backend without a lease client (a side of a dual lock).
pub(crate) type OpenFuture = Pin<Box<dyn Future<Output = Result<Opened>> + Send>>;

/// A backend that can be opened from its configuration or a URL.
#[async_trait]
pub trait Connect: Backend + Sized {
    /// The URL schemes it serves, lowercase.
    const SCHEMES: &'static [&'static str];

    /// Its configuration.
    type Config: Send + 'static;

    /// Parses a URL whose scheme is one of [`Connect::SCHEMES`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong (never repeating a password).
    fn config_from_url(url: &LockUrl) -> Result<Self::Config>;

    /// The client-wide lock options in `config`.
    fn lock_options(config: &Self::Config) -> &LockOptions;

    /// Checks `config` beyond its lock options. The driver calls it once, after checking
    /// the lock options and before [`Connect::open`], which may take the configuration as
    /// valid; it is the one place where a configuration is checked on its way in.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming what is wrong (never repeating a password).
    fn validate(config: &Self::Config) -> Result<()>;

    /// Opens the protocol half. Fails fast, within the configuration's request timeout,
    /// when the service does not answer.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a configuration the service rejects (credentials, TLS);
    /// [`Error::Connection`] or [`Error::Unavailable`] when it does not answer.
    async fn open(config: Self::Config) -> Result<Self>;

    /// The configuration a connect to `url` opens: parsed, and checked as the driver
    /// checks it before opening.
    ///
    /// # Errors
    /// As [`LockUrl::parse`], [`Connect::config_from_url`] and [`Connect::validate`], and
    /// [`Error::InvalidConfig`] for lock options out of range.
    fn config_from_str(url: &str) -> Result<Self::Config> {
        let config = Self::config_from_url(&LockUrl::parse(url)?)?;
        check_config::<Self>(&config)?;
        Ok(config)
    }
}

impl<B: Connect> LeaseClient<B> {
    /// Opens a lock client with `config`.
    ///
    /// # Errors
    /// As [`Connect::open`], and [`Error::InvalidConfig`] for options out of range.
    pub async fn connect(config: B::Config) -> Result<Self> {
        let (backend, options) = open_config::<B>(config).await?;
        LeaseClient::with_valid_options(backend, options)
    }

    /// Opens a lock client for `url` (one of [`Connect::SCHEMES`]).
    ///
    /// # Errors
    /// As [`Connect::config_from_url`] and [`LeaseClient::connect`].
    pub async fn from_url(url: &LockUrl) -> Result<Self> {
        if !B::SCHEMES.contains(&url.scheme.as_str()) {
            return Err(Error::config(format!(
                "this backend serves {}://, not {}://",
                B::SCHEMES.join("://, "),
                url.scheme
            )));
        }
        Self::connect(B::config_from_url(url)?).await
    }
}

/// Opens `B` with `config`, refusing a bad configuration before a connection is opened:
/// the one place where a configuration is checked.
async fn open_config<B: Connect>(config: B::Config) -> Result<(B, LockOptions)> {
    check_config::<B>(&config)?;
    let options = B::lock_options(&config).clone();
    Ok((B::open(config).await?, options))
}

/// Checks `config` once: its lock options, then the backend's own part.
fn check_config<B: Connect>(config: &B::Config) -> Result<()> {
    B::lock_options(config).validate()?;
    B::validate(config)
}

/// Opens backend `B` for `url` without a lease client around it (a side of a dual lock).
fn open_url<B: Connect>(url: LockUrl) -> OpenFuture {
    Box::pin(async move {
        let (backend, options) = open_config::<B>(B::config_from_url(&url)?).await?;
        let backend: Arc<dyn AnyBackend> = Arc::new(backend);
        Ok(Opened { backend, options })
    })
}

/// What a [`Registry`](crate::raw::driver::Registry) keeps of a backend: its schemes, and how to
/// open it from a URL as a lock client or as a side of a dual lock. Made from the backend's
/// [`Connect`] declaration, so it is a constant: `Driver::of::<MyBackend>()`.
#[derive(Clone, Copy)]
pub struct Driver {
    schemes: &'static [&'static str],
    connect: fn(LockUrl) -> ConnectFuture,
    open: fn(LockUrl) -> OpenFuture,
}

impl Driver {
    /// The driver of backend `B`.
    pub const fn of<B: Connect>() -> Driver {
        Driver {
            schemes: B::SCHEMES,
            connect: connect_url::<B>,
            open: open_url::<B>,
        }
    }

    /// The URL schemes it serves, lowercase.
    pub fn schemes(&self) -> &'static [&'static str] {
        self.schemes
    }

    /// Builds a lock client for `url`, one of its schemes.
    pub fn connect(&self, url: LockUrl) -> ConnectFuture {
        (self.connect)(url)
    }

    /// Opens the backend for `url` without a lease client (a side of a dual lock).
    pub(crate) fn open(&self, url: LockUrl) -> OpenFuture {
        (self.open)(url)
    }
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

fn connect_url<B: Connect>(url: LockUrl) -> ConnectFuture {
    Box::pin(async move {
        let client: Arc<dyn DistributedLock> = Arc::new(LeaseClient::<B>::from_url(&url).await?);
        Ok(client)
    })
}
