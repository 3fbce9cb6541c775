//! The primitives built on the lease machinery: each is a kind of hold
//! ([`crate::raw::backend::HoldKind`]) and a typed front end over
//! [`crate::DistributedLock::acquire`]; the multi-lock is
//! several mutex holds taken in one fixed order.

mod election;
mod multi;
mod observer;
mod rwlock;
mod semaphore;
mod service;

pub use election::{Election, Leader, Leadership};
pub use multi::{MultiGuard, MultiLock};
pub use observer::LeaderObserver;
pub use rwlock::{ReadGuard, RwLock, UpgradeableReadGuard, WriteGuard};
pub use semaphore::{Permit, Semaphore};
pub use service::{LeaderEvent, LeaderEvents, LeaderService, ServiceSummary};

use std::sync::Arc;

use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::kind::HoldKind;
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::options::AcquireOptions;

/// A typed guard over a [`LockGuard`](crate::LockGuard): every method of the guard
/// through `Deref`, a consuming `release`, and the guard itself on request.
macro_rules! hold_guard {
    ($(#[$doc:meta])* $guard:ident) => {
        $(#[$doc])*
        #[must_use = "dropping the guard releases it in the background"]
        #[derive(Debug)]
        pub struct $guard(crate::guard::LockGuard);

        impl $guard {
            /// Releases the hold and reports what happened (see
            /// [`LockGuard::release`](crate::LockGuard::release)).
            ///
            /// # Errors
            /// As [`LockGuard::release`](crate::LockGuard::release).
            pub async fn release(self) -> crate::error::Result<crate::state::ReleaseOutcome> {
                self.0.release().await
            }

            /// The underlying lock guard.
            pub fn into_guard(self) -> crate::guard::LockGuard {
                self.0
            }
        }

        impl std::ops::Deref for $guard {
            type Target = crate::guard::LockGuard;
            fn deref(&self) -> &crate::guard::LockGuard {
                &self.0
            }
        }
    };
}
pub(crate) use hold_guard;

/// Acquires `name` on `lock` as a hold of `kind`, the rest of `options` unchanged: the
/// one acquire path of the typed front ends.
async fn acquire_kind(
    lock: &Arc<dyn DistributedLock>,
    name: &LockName,
    kind: HoldKind,
    options: &AcquireOptions,
) -> Result<Option<crate::guard::LockGuard>> {
    let options = AcquireOptions {
        kind,
        ..options.clone()
    };
    lock.acquire(name, &options).await
}

/// `name`, checked, on a lock service that `offers` the primitive (`what`, in words).
///
/// # Errors
/// [`Error::InvalidName`]; [`Error::Unsupported`] where the service does not offer it.
fn checked_name(
    lock: &dyn DistributedLock,
    name: &str,
    offers: fn(&Capabilities) -> bool,
    what: &str,
) -> Result<LockName> {
    let name = LockName::new(name)?;
    let capabilities = lock.capabilities();
    if !offers(&capabilities) {
        return Err(Error::unsupported(capabilities.backend, what));
    }
    Ok(name)
}
