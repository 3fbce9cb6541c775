//! A [`Backend`] with its hold type erased, so that code choosing backends at run time
//! (the dual lock, the migration check) can hold any of them behind one pointer.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{
    AcquireRequest, Acquired, Amended, Backend, BackendRelease, RenewItem, RenewOutcome,
    SessionStatus,
};
use crate::capabilities::Capabilities;
use crate::changes::ChangeFeed;
use crate::error::{Error, Result};
use crate::kind::{Amendment, SemaphoreResize};
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::LockOptions;

/// The hold of an [`AnyBackend`]: the backend's own hold, boxed.
pub(crate) type AnyHold = Box<dyn Any + Send + Sync>;

/// A backend opened from a URL, with the lock options the URL gave.
pub(crate) struct Opened {
    pub(crate) backend: Arc<dyn AnyBackend>,
    pub(crate) options: LockOptions,
}

/// [`Backend`] with [`AnyHold`] for its hold; every backend is one.
#[async_trait]
pub(crate) trait AnyBackend: Send + Sync + fmt::Debug + fmt::Display + 'static {
    fn capabilities(&self) -> Capabilities;
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<AnyHold>>>;
    async fn renew(&self, items: &[RenewItem<'_, AnyHold>]) -> Result<Vec<RenewOutcome>>;
    async fn release(&self, hold: &AnyHold) -> Result<BackendRelease>;
    async fn inspect(&self, name: &LockName) -> Result<Occupancy>;
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>>;
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>>;
    async fn amend(&self, hold: &AnyHold, amendment: Amendment<'_>) -> Result<Amended>;
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()>;
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed>;
    fn session(&self) -> Option<watch::Receiver<SessionStatus>>;
    async fn close(&self) -> Result<()>;
}

#[async_trait]
impl<B: Backend> AnyBackend for B {
    fn capabilities(&self) -> Capabilities {
        Backend::capabilities(self)
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<AnyHold>>> {
        Ok(Backend::acquire(self, request).await?.map(|won| Acquired {
            hold: Box::new(won.hold) as AnyHold,
            fencing_token: won.fencing_token,
            requested_at: won.requested_at,
            lease: won.lease,
            session: won.session,
        }))
    }

    async fn renew(&self, items: &[RenewItem<'_, AnyHold>]) -> Result<Vec<RenewOutcome>> {
        let items = items
            .iter()
            .map(|item| {
                Ok(RenewItem {
                    hold: own_hold::<B>(item.hold)?,
                    ttl: item.ttl,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Backend::renew(self, &items).await
    }

    async fn release(&self, hold: &AnyHold) -> Result<BackendRelease> {
        Backend::release(self, own_hold::<B>(hold)?).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        Backend::inspect(self, name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        Backend::list(self, prefix).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        Backend::force_release(self, name).await
    }

    async fn amend(&self, hold: &AnyHold, amendment: Amendment<'_>) -> Result<Amended> {
        Backend::amend(self, own_hold::<B>(hold)?, amendment).await
    }

    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        Backend::resize_semaphore(self, name, resize).await
    }

    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        Backend::changes(self, name).await
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Backend::session(self)
    }

    async fn close(&self) -> Result<()> {
        Backend::close(self).await
    }
}

fn own_hold<B: Backend>(hold: &AnyHold) -> Result<&B::Hold> {
    hold.downcast_ref::<B::Hold>()
        .ok_or_else(|| Error::Protocol {
            backend: "distlock",
            message: "a hold was handed to a backend that did not grant it".to_owned(),
            source: None,
        })
}
