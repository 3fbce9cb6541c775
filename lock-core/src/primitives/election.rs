//! Leader election: a campaign is an acquire of a [`HoldKind::Candidate`] hold, so the
//! leader's guard has every guarantee of a lock guard (renewal, Held / Suspect / Lost,
//! validity deadline, drop-release, cancellation-safe campaign), and its term is the
//! hold's fencing token. Reading and following the leader are reads of the name's
//! occupancy, woken by the backend's change feed.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{acquire_kind, checked_name};
use crate::error::{Error, Result};
use crate::ext::{run_held, waited, LockContext, RunOutcome};
use crate::guard::{LockGuard, LockWatch};
use crate::kind::{Amendment, HoldKind};
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::AcquireOptions;
use crate::state::{LockState, LostReason, ReleaseOutcome};
use crate::token::FencingToken;

/// The leader election `name` on a lock service: campaign, read and follow its leader.
///
/// ZooKeeper keeps Curator `LeaderLatch`'s layout and etcd the Go client's
/// `concurrency.Election`'s, so those clients and distlock take part in one election;
/// Redis keeps its own (lock-redis's README, "Leader election").
#[derive(Clone)]
pub struct Election {
    lock: Arc<dyn DistributedLock>,
    name: LockName,
}

impl Election {
    /// The election `name` on `lock`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name; [`Error::Unsupported`] for a lock service
    /// without elections.
    pub fn new(lock: Arc<dyn DistributedLock>, name: &str) -> Result<Self> {
        let name = checked_name(&*lock, name, |c| c.election, "leader elections")?;
        Ok(Election { lock, name })
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The lock service.
    pub(super) fn lock(&self) -> &Arc<dyn DistributedLock> {
        &self.lock
    }

    /// Campaigns with `value` (the candidate's identity or address, as the leader's
    /// readers will see it) and waits until this candidate leads. Dropping the future
    /// withdraws the candidacy, wherever it was.
    ///
    /// # Errors
    /// As [`Election::campaign_with`].
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        let leadership = self
            .campaign_with(value, &AcquireOptions::forever())
            .await?;
        waited(leadership, &self.name)
    }

    /// One attempt to lead: `Ok(None)` when another candidate leads or campaigned first.
    ///
    /// # Errors
    /// As [`Election::campaign_with`].
    pub async fn try_campaign(&self, value: impl Into<Vec<u8>>) -> Result<Option<Leadership>> {
        self.campaign_with(value, &AcquireOptions::try_once()).await
    }

    /// Campaigns and waits at most `timeout` to lead.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] when this candidate did not lead in time
    /// (its candidacy is withdrawn); as [`Election::campaign_with`].
    pub async fn campaign_timeout(
        &self,
        value: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Leadership> {
        let leadership = self
            .campaign_with(value, &AcquireOptions::timeout(timeout))
            .await?;
        waited(leadership, &self.name)
    }

    /// Campaigns with `value` and returns once this candidate leads, as `options.wait` says
    /// (`Ok(None)`: a [`Wait::Try`](crate::Wait::Try) found another leader).
    ///
    /// Candidates lead in the order they campaigned. Dropping the future withdraws the
    /// candidacy, wherever it was.
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`]; [`Error::InvalidConfig`] for a reentrant
    /// campaign (`options.owner` set).
    pub async fn campaign_with(
        &self,
        value: impl Into<Vec<u8>>,
        options: &AcquireOptions,
    ) -> Result<Option<Leadership>> {
        let value = value.into();
        let kind = HoldKind::Candidate {
            value: value.clone(),
        };
        let guard = acquire_kind(&self.lock, &self.name, kind, options).await?;
        Ok(guard.map(|guard| Leadership { guard, value }))
    }

    /// The current leader, or `None` when nobody leads, as the server shows it now.
    ///
    /// # Errors
    /// Connection errors; [`Error::Protocol`] for a leader entry without a term.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let occupancy = self.lock.inspect(&self.name).await?;
        leader_of(&self.name, occupancy)
    }

    /// Campaigns with `value`, runs `work` while leading, then resigns, in the spirit of
    /// Curator's `LeaderSelector`: when leadership is lost, `work` is dropped (cancelled
    /// at its next await point) before anyone else can lead (as long as it does not block
    /// its thread), and the outcome says why. `work`'s context carries the term as its
    /// fencing token.
    ///
    /// # Errors
    /// As [`Election::campaign_with`].
    pub async fn lead<F, Fut, T>(
        &self,
        value: impl Into<Vec<u8>>,
        options: &AcquireOptions,
        work: F,
    ) -> Result<RunOutcome<T>>
    where
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        match self.campaign_with(value, options).await? {
            Some(leadership) => run_held(leadership.guard, work).await,
            None => Ok(RunOutcome::NotAcquired),
        }
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("lock", &format_args!("{}", self.lock))
            .field("name", &self.name)
            .finish()
    }
}

/// The leader of an election, as a reader sees it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// What the leader proclaimed.
    pub value: Vec<u8>,
    /// Its term: the fencing token of its leadership, strictly greater than every earlier
    /// leader's.
    pub term: FencingToken,
    /// Since when it leads or campaigned, on the server's wall clock, where the server
    /// records it.
    pub since: Option<SystemTime>,
    /// How many times the value was proclaimed in this term, where the server counts it:
    /// of two reads of one term, the higher version is the newer value.
    pub version: Option<u64>,
    /// The leader's entry as the server shows it (owner token, session, lease left).
    pub participant: Participant,
}

impl Leader {
    /// The value as text, with invalid UTF-8 replaced.
    pub fn value_text(&self) -> String {
        String::from_utf8_lossy(&self.value).into_owned()
    }
}

/// The leader in `occupancy`, the occupancy of election `name`.
fn leader_of(name: &LockName, occupancy: Occupancy) -> Result<Option<Leader>> {
    let Some(holder) = occupancy.holder else {
        return Ok(None);
    };
    let term = holder.fencing_token.ok_or_else(|| Error::Protocol {
        backend: "distlock",
        message: format!("the leader of `{name}` shows no term"),
        source: None,
    })?;
    Ok(Some(Leader {
        value: holder.value.clone().unwrap_or_default(),
        term,
        since: holder.since,
        version: holder.value_version,
        participant: holder,
    }))
}

/// This candidate's leadership: a lock guard whose fencing token is the term.
///
/// Dropping it resigns in the background, as dropping a [`LockGuard`] releases.
#[must_use = "dropping a leadership resigns in the background"]
pub struct Leadership {
    guard: LockGuard,
    value: Vec<u8>,
}

impl Leadership {
    /// The term: pass it to the resources the leader writes to, as a fencing token.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The value this leader proclaims.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Whether this candidate still leads: Held, before its validity deadline.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Until when leadership is guaranteed, on the monotonic clock.
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// The state of the leadership's hold.
    pub fn state(&self) -> LockState {
        self.guard.state()
    }

    /// A watch of the leadership's state.
    pub fn watch(&self) -> LockWatch {
        self.guard.watch()
    }

    /// Resolves when leadership is lost, with the reason.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// The underlying lock guard.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Changes the value readers see, keeping the term.
    ///
    /// # Errors
    /// [`Error::Lost`] if this candidate no longer leads (the leadership turns Lost);
    /// connection errors, after which the value may or may not have changed.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
        self.guard.amend(Amendment::Proclaim(&value)).await?;
        self.value = value;
        Ok(())
    }

    /// The guard and the value, to be put together again by [`Leadership::from_parts`].
    pub(super) fn into_parts(self) -> (LockGuard, Vec<u8>) {
        (self.guard, self.value)
    }

    /// The leadership of `guard`, a candidate's hold proclaiming `value`.
    pub(super) fn from_parts(guard: LockGuard, value: Vec<u8>) -> Self {
        Leadership { guard, value }
    }

    /// Steps down: the next candidate leads at once.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<ReleaseOutcome> {
        self.guard.release().await
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", self.guard.name())
            .field("term", &self.term())
            .field("value", &String::from_utf8_lossy(&self.value))
            .field("state", &self.state())
            .finish()
    }
}
