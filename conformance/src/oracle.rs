//! The lease oracle: a guard never promises more than its server keeps.
//!
//! After every grant a rule sees, and periodically while the hold lasts, the oracle reads
//! the server's own remaining lease for the hold behind the library
//! ([`Factory::server_lease`]: the key's PTTL and the holder's entry on Redis, the lease's
//! TTL on etcd, the session timeout on ZooKeeper) and records a violation when it is
//! shorter than what the guard promises (its `valid_until`, less the reading's
//! resolution). [`Oracle::finish`] fails the rule with every violation seen.
//!
//! The guard's deadline is read before the server is asked, and the server's answer is
//! taken as of its arrival: a renewal in flight or the time on the wire can only make the
//! server look longer-lived than it is, never shorter, so a violation is never a race of
//! the check. A hold the server no longer has is not a violation here (a release, a steal
//! or an operator's break removes it; exclusion is the other rules' business), except at
//! the grant itself.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    AcquireOptions, DistributedLock, LockGuard, LockName, LockState, LockWatch, OwnerToken, Result,
};
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};

use crate::factory::{Factory, ServerLease};
use crate::wrap::{AcquireWrap, WrappedLock};

/// How many holds of one rule are audited periodically at once; the others are checked
/// at their grant only (a rule with a thousand holds would flood the server).
const WATCHED_AT_ONCE: usize = 32;

/// The audit of one rule's holds.
pub struct Oracle {
    factory: Arc<dyn Factory>,
    violations: Mutex<Vec<String>>,
    watchers: Mutex<JoinSet<()>>,
}

impl Oracle {
    /// An oracle that reads the server through `factory`.
    pub fn new(factory: Arc<dyn Factory>) -> Arc<Self> {
        Arc::new(Oracle {
            factory,
            violations: Mutex::new(Vec::new()),
            watchers: Mutex::new(JoinSet::new()),
        })
    }

    /// `client`, whose grants this oracle audits.
    pub fn audit(self: &Arc<Self>, client: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        WrappedLock::around(client, Audit(Arc::clone(self)))
    }

    /// Checks `guard` against its server once; `at` says when, for the report. Returns
    /// whether the server still has the hold.
    pub async fn check(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        watch: &LockWatch,
        at: &str,
    ) -> bool {
        let promised_until = watch.valid_until();
        let lease = self.factory.server_lease(name, owner).await;
        let answered = Instant::now();
        if watch.state() != LockState::Held {
            // Released or lost meanwhile: the guard promises nothing any more.
            return false;
        }
        let promised = promised_until.saturating_duration_since(answered);
        let resolution = self.factory.lease_resolution();
        match lease {
            ServerLease::Unknown => false,
            ServerLease::Absent => {
                if at == "grant" && !promised.is_zero() {
                    self.violation(format!(
                        "{name} ({owner}) at the grant: the server has no such hold, the \
                         guard promises {promised:?}"
                    ));
                }
                false
            }
            ServerLease::Left(left) => {
                if left + resolution < promised {
                    self.violation(format!(
                        "{name} ({owner}) {at}: the server keeps it {left:?}, the guard \
                         promises {promised:?} (resolution {resolution:?})"
                    ));
                }
                true
            }
        }
    }

    fn violation(&self, what: String) {
        eprintln!("[oracle] {}: {what}", self.factory.label());
        self.violations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(what);
    }

    /// Checks a new grant at once, then watches it while it is held.
    async fn granted(self: &Arc<Self>, guard: &LockGuard) {
        let (name, owner, watch) = (
            guard.name().clone(),
            guard.owner_token().clone(),
            guard.watch(),
        );
        if !self.check(&name, &owner, &watch, "grant").await {
            return;
        }
        let mut watchers = self
            .watchers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if watchers.len() >= WATCHED_AT_ONCE {
            return;
        }
        let oracle = Arc::clone(self);
        watchers.spawn(async move {
            // A third of the promise at the grant, at least 100 ms, 200 looks at most.
            let first = watch
                .valid_until()
                .saturating_duration_since(Instant::now());
            let every = (first / 3).clamp(Duration::from_millis(100), Duration::from_secs(2));
            for _ in 0..200 {
                sleep(every).await;
                if !oracle.check(&name, &owner, &watch, "while held").await {
                    return;
                }
            }
        });
    }

    /// Stops watching and fails with every violation seen.
    ///
    /// # Panics
    /// If a guard promised more than its server kept.
    pub async fn finish(&self) {
        let mut watchers = std::mem::take(
            &mut *self
                .watchers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        watchers.shutdown().await;
        let violations = std::mem::take(
            &mut *self
                .violations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        assert!(
            violations.is_empty(),
            "[oracle] {}: guards promised more than the server kept:\n{}",
            self.factory.label(),
            violations.join("\n")
        );
    }
}

impl fmt::Debug for Oracle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Oracle")
            .field("factory", &self.factory.label())
            .finish_non_exhaustive()
    }
}

/// What a client whose grants an [`Oracle`] audits does on an acquire.
#[derive(Debug)]
struct Audit(Arc<Oracle>);

#[async_trait]
impl AcquireWrap for Audit {
    async fn acquire(
        &self,
        lock: &dyn DistributedLock,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        let acquired = lock.acquire(name, options).await;
        if let Ok(Some(guard)) = &acquired {
            self.0.granted(guard).await;
        }
        acquired
    }
}
