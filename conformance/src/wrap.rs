//! Wrappers that change one thing about a factory or a client and pass the rest on.
//!
//! Written once, so that a method added to [`Factory`] or [`DistributedLock`] is passed
//! on by every wrapper (the option sets of [`explore`](crate::explore), the lease
//! [`oracle`](crate::oracle), the lab's primitives) instead of being left at its default
//! by one of them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::backend::{ChangeFeed, SemaphoreResize};
use lock_core::{
    AcquireOptions, Capabilities, DistributedLock, LockGuard, LockName, LockOptions, Occupancy,
    OwnerToken, Participant, Result,
};

use crate::factory::{Crash, Factory, ServerLease};

/// What a [`WrappedFactory`] changes about the factory it wraps.
pub trait FactoryWrap: Send + Sync + 'static {
    /// The wrapped factory's label, from the inner one's.
    fn label(&self, inner: String) -> String {
        inner
    }

    /// The wrapped factory's shortest TTL, from the inner one's.
    fn short_ttl(&self, inner: Duration) -> Duration {
        inner
    }

    /// The options a client is made with, from those asked for; `short_ttl` is the
    /// wrapped factory's.
    fn options(&self, options: LockOptions, short_ttl: Duration) -> LockOptions {
        let _ = short_ttl;
        options
    }

    /// The waiter queue asked of the inner factory when the queue `on` is asked for: a
    /// wrapper whose clients need the queue keeps it on.
    fn queue(&self, on: bool) -> bool {
        on
    }

    /// The client handed out, from the inner factory's.
    fn client(&self, client: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock>;
}

/// A factory that is `F` but for what `W` changes.
pub struct WrappedFactory<F, W> {
    inner: Arc<F>,
    wrap: W,
}

impl<F, W> WrappedFactory<F, W> {
    /// `inner`, changed by `wrap`.
    pub fn new(inner: Arc<F>, wrap: W) -> Self {
        WrappedFactory { inner, wrap }
    }

    /// The factory under the wrapper.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// What changes it.
    pub fn wrapper(&self) -> &W {
        &self.wrap
    }
}

impl<F: Factory, W: FactoryWrap + fmt::Debug> fmt::Debug for WrappedFactory<F, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrappedFactory")
            .field("factory", &self.inner.label())
            .field("wrap", &self.wrap)
            .finish()
    }
}

#[async_trait]
impl<F: Factory + 'static, W: FactoryWrap> Factory for WrappedFactory<F, W> {
    fn label(&self) -> String {
        self.wrap.label(self.inner.label())
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    fn short_ttl(&self) -> Duration {
        self.wrap.short_ttl(self.inner.short_ttl())
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        let options = self.wrap.options(options, self.short_ttl());
        self.wrap.client(self.inner.client(options).await)
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        let options = self.wrap.options(options, self.short_ttl());
        let (client, crash) = self.inner.crashable_client(options).await;
        (self.wrap.client(client), crash)
    }

    async fn steal(&self, name: &LockName) {
        self.inner.steal(name).await;
    }

    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        self.inner.leftovers(names).await
    }

    /// Whether the choice asked for is offered: not where the wrapper keeps the queue on.
    fn set_queue(&self, on: bool) -> bool {
        let passed = self.wrap.queue(on);
        self.inner.set_queue(passed) && passed == on
    }

    async fn server_lease(&self, name: &LockName, owner: &OwnerToken) -> ServerLease {
        self.inner.server_lease(name, owner).await
    }

    fn lease_resolution(&self) -> Duration {
        self.inner.lease_resolution()
    }
}

/// What a [`WrappedLock`] changes about the client it wraps: its acquires.
#[async_trait]
pub trait AcquireWrap: Send + Sync + fmt::Debug + 'static {
    /// Acquires `name` through `lock` as this wrapper does it.
    async fn acquire(
        &self,
        lock: &dyn DistributedLock,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>>;

    /// How the wrapped client shows itself, from `lock`'s display.
    fn describe(&self, lock: &dyn DistributedLock, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(lock, f)
    }
}

/// A client that is `inner` but for how `W` acquires.
#[derive(Debug)]
pub struct WrappedLock<W> {
    inner: Arc<dyn DistributedLock>,
    wrap: W,
}

impl<W: AcquireWrap> WrappedLock<W> {
    /// `inner`, its acquires changed by `wrap`.
    pub fn around(inner: Arc<dyn DistributedLock>, wrap: W) -> Arc<dyn DistributedLock> {
        Arc::new(WrappedLock { inner, wrap })
    }
}

impl<W: AcquireWrap> fmt::Display for WrappedLock<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.wrap.describe(&*self.inner, f)
    }
}

#[async_trait]
impl<W: AcquireWrap> DistributedLock for WrappedLock<W> {
    async fn acquire(
        &self,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        self.wrap.acquire(&*self.inner, name, options).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        self.inner.list(prefix).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        self.inner.force_release(name).await
    }

    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        self.inner.resize_semaphore(name, resize).await
    }

    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        self.inner.changes(name).await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}
