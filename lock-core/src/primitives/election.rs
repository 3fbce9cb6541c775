//! Leader election: a campaign is an acquire of a [`HoldKind::Candidate`] hold, so the
//! leader's guard has every guarantee of a lock guard (renewal, Held / Suspect / Lost,
//! validity deadline, drop-release, cancellation-safe campaign), and its term is the
//! hold's fencing token. Reading and following the leader are reads of the name's
//! occupancy, woken by the backend's change feed.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;

use tokio::time::{timeout, Instant};

use super::{acquire_kind, checked_name};
use crate::changes::ChangeFeed;
use crate::error::{Error, Result};
use crate::ext::{run_held, waited, LockContext, RunOutcome};
use crate::guard::{LockGuard, LockWatch};
use crate::kind::{Amendment, HoldKind};
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::occupancy::{Occupancy, Participant};
use crate::options::AcquireOptions;
use crate::plumbing::Backoff;
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
    /// [`Error::Timeout`](crate::Error::Timeout) when this candidate did not lead in time
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

    /// Follows the leader: see [`LeaderObserver`].
    pub fn observe(&self) -> LeaderObserver {
        LeaderObserver {
            following: Some(Following {
                election: self.clone(),
                feed: None,
                last: None,
                last_term: None,
                last_version: None,
                vacant_reported: false,
                backoff: Backoff::new(OBSERVE_FIRST_PAUSE, OBSERVE_LONGEST_PAUSE),
            }),
            in_flight: None,
            current: None,
            ended: false,
            name: self.name.clone(),
        }
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

/// First pause after a failed read of the leader.
const OBSERVE_FIRST_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause between failed reads.
const OBSERVE_LONGEST_PAUSE: Duration = Duration::from_secs(2);

/// Follows an election's leader: [`LeaderObserver::next`] returns each change, and the
/// observer is a [`Stream`] of them (which ends after an error retrying cannot cure).
///
/// - A new leader is reported once, with a term greater than every term reported
///   before: an older term is never reported after a newer one (a read from a lagging
///   server is skipped).
/// - A proclaimed value is reported with the same term; a value older than one seen
///   before in that term (by its [`Leader::version`], where the server counts it) is
///   skipped: a lagging read, or the two sides of a dual lock read at different moments.
/// - `None` is reported once when the leader is gone and nobody leads yet.
/// - Changes are pushed by the server where it can ([`DistributedLock::changes`]) and
///   re-read every `recheck` anyway, through reconnects and errors: once the election
///   settles, the last change reported is its current leader. Changes between two reads
///   may be folded into one (a leader that came and went unseen is not reported).
/// - Cancelling a `next` (or dropping a stream's pending poll) loses nothing: the read in
///   flight goes on at the next call.
pub struct LeaderObserver {
    /// The state, while no read is in flight.
    following: Option<Following>,
    /// The read in flight, which owns the state until it ends.
    in_flight: Option<InFlight>,
    /// The last change reported.
    current: Option<Leader>,
    /// The stream ended with an error retrying cannot cure.
    ended: bool,
    name: LockName,
}

/// A read of the next change, owning the observer's state.
type InFlight = Pin<Box<dyn Future<Output = (Following, Result<Option<Leader>>)> + Send>>;

impl LeaderObserver {
    /// The next change: the new leader, or `None` when nobody leads any more. The first
    /// call returns the current state at once.
    ///
    /// Transient errors (a lost connection, no quorum) are retried with backoff, for as
    /// long as the observer is polled; cancelling `next` loses nothing.
    ///
    /// # Errors
    /// Errors that retrying cannot cure (a closed client, a protocol error).
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        std::future::poll_fn(|cx| self.poll_change(cx)).await
    }

    /// Polls the read in flight, starting one if none is.
    fn poll_change(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Leader>>> {
        if self.in_flight.is_none() {
            let Some(mut following) = self.following.take() else {
                unreachable!("the state is either at rest or in flight");
            };
            self.in_flight = Some(Box::pin(async move {
                let change = following.next().await;
                (following, change)
            }));
        }
        let Some(in_flight) = self.in_flight.as_mut() else {
            unreachable!("a read is in flight");
        };
        let (following, change) = std::task::ready!(in_flight.as_mut().poll(cx));
        self.in_flight = None;
        self.following = Some(following);
        if let Ok(leader) = &change {
            self.current.clone_from(leader);
        }
        Poll::Ready(change)
    }

    /// The last leader reported, if it still leads as far as this observer knows.
    pub fn current(&self) -> Option<&Leader> {
        self.current.as_ref()
    }
}

impl Stream for LeaderObserver {
    type Item = Result<Option<Leader>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let change = std::task::ready!(this.poll_change(cx));
        this.ended = change.is_err();
        Poll::Ready(Some(change))
    }
}

impl fmt::Debug for LeaderObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderObserver")
            .field("election", &self.name)
            .field("current", &self.current.as_ref().map(|leader| leader.term))
            .field("reading", &self.in_flight.is_some())
            .finish_non_exhaustive()
    }
}

/// What a [`LeaderObserver`] knows between reads.
struct Following {
    election: Election,
    feed: Option<ChangeFeed>,
    last: Option<Leader>,
    last_term: Option<FencingToken>,
    /// The newest value version seen in `last_term`.
    last_version: Option<u64>,
    vacant_reported: bool,
    backoff: Backoff,
}

impl Following {
    /// The next change ([`LeaderObserver::next`]).
    async fn next(&mut self) -> Result<Option<Leader>> {
        let recheck = self.election.lock.options().recheck;
        let first_read = self.last_term.is_none() && !self.vacant_reported;
        loop {
            if self.feed.as_ref().is_some_and(|feed| !feed.is_live()) {
                // The backend gave up on its subscription: make a new one.
                self.feed = None;
            }
            if self.feed.is_none() {
                // Subscribed before the read, so no change after the read goes unseen.
                match self.election.lock.changes(&self.election.name).await {
                    Ok(feed) => self.feed = Some(feed),
                    Err(err) if err.is_retryable() => {
                        tracing::debug!(election = %self.election.name, error = %err,
                            "subscribing to leader changes failed; re-reading instead");
                    }
                    Err(err) => return Err(err),
                }
            }
            match self.election.leader().await {
                Ok(read) => {
                    self.backoff.reset();
                    if let Some(change) = self.change(read) {
                        return Ok(change);
                    }
                    if first_read {
                        // Nobody leads, and this is the first call: say so.
                        self.vacant_reported = true;
                        return Ok(None);
                    }
                    let wait = async {
                        match &mut self.feed {
                            Some(feed) => feed.next().await,
                            None => std::future::pending().await,
                        }
                    };
                    // A change, or the recheck: read again either way.
                    let _ = timeout(recheck, wait).await;
                }
                Err(err) if err.is_retryable() => {
                    // The subscription may have died with the connection: renew it.
                    self.feed = None;
                    tracing::debug!(election = %self.election.name, error = %err,
                        "reading the leader failed; retrying");
                    tokio::time::sleep(self.backoff.next_pause()).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// What `read` changes for a reader that saw `self.last`: `Some(change)` to report.
    fn change(&mut self, read: Option<Leader>) -> Option<Option<Leader>> {
        match read {
            Some(leader) => {
                if self.last_term.is_some_and(|last| leader.term < last) {
                    return None;
                }
                if self.last_term == Some(leader.term) {
                    if let (Some(seen), Some(read)) = (self.last_version, leader.version) {
                        // An older value of this term (a lagging read, or the two sides
                        // of a dual lock read at different moments), or no change. After
                        // a vacancy, the last leader is news again (a read that missed it).
                        if read < seen || (read == seen && self.last.is_some()) {
                            return None;
                        }
                    }
                    if self
                        .last
                        .as_ref()
                        .is_some_and(|last| last.value == leader.value)
                    {
                        self.last_version = self.last_version.max(leader.version);
                        return None;
                    }
                }
                self.last_term = Some(leader.term);
                self.last_version = leader.version;
                self.last = Some(leader.clone());
                self.vacant_reported = false;
                Some(Some(leader))
            }
            None if self.last.is_some() => {
                self.last = None;
                self.vacant_reported = true;
                Some(None)
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(value: &str, term: u64) -> Leader {
        Leader {
            value: value.as_bytes().to_vec(),
            term: FencingToken(term),
            since: None,
            version: None,
            participant: Participant::new(None),
        }
    }

    fn versioned(value: &str, term: u64, version: u64) -> Leader {
        Leader {
            version: Some(version),
            ..leader(value, term)
        }
    }

    fn observer() -> Following {
        let lock: Arc<dyn DistributedLock> = Arc::new(
            crate::memory::MemoryBackend::client(
                crate::memory::MemorySpace::named("observer-unit"),
                crate::LockOptions::default(),
            )
            .expect("a memory client"),
        );
        Election::new(lock, "unit")
            .expect("an election")
            .observe()
            .following
            .expect("no read in flight")
    }

    /// Terms never go back; a proclaim is news with the same term; a vacancy is reported
    /// once; after a vacancy the last term's leader is news again (a read that missed it),
    /// an older one never.
    #[test]
    fn changes_are_reported_once_and_never_go_back() {
        let mut seen = observer();
        assert_eq!(
            seen.change(Some(leader("a", 5))),
            Some(Some(leader("a", 5)))
        );
        assert_eq!(seen.change(Some(leader("a", 5))), None, "no change");
        assert_eq!(seen.change(Some(leader("old", 4))), None, "an older term");
        assert_eq!(
            seen.change(Some(leader("b", 5))),
            Some(Some(leader("b", 5))),
            "proclaimed"
        );
        assert_eq!(seen.change(None), Some(None), "the vacancy");
        assert_eq!(seen.change(None), None, "reported once");
        assert_eq!(
            seen.change(Some(leader("old", 4))),
            None,
            "still never older"
        );
        assert_eq!(
            seen.change(Some(leader("b", 5))),
            Some(Some(leader("b", 5))),
            "missed"
        );
        assert_eq!(
            seen.change(Some(leader("c", 6))),
            Some(Some(leader("c", 6)))
        );
    }

    /// Within a term, a value with an older version than one seen is a stale read (a
    /// dual lock's sides read at different moments): skipped, before and after a newer
    /// version with the same value; a vacancy still follows.
    #[test]
    fn an_older_value_of_a_term_is_skipped() {
        let mut seen = observer();
        let first = versioned("a", 5, 0);
        assert_eq!(seen.change(Some(first.clone())), Some(Some(first)));
        let moved = versioned("moved", 5, 1);
        assert_eq!(seen.change(Some(moved.clone())), Some(Some(moved)));
        assert_eq!(seen.change(Some(versioned("a", 5, 0))), None, "stale");
        assert_eq!(
            seen.change(Some(versioned("moved", 5, 2))),
            None,
            "same value"
        );
        assert_eq!(seen.change(Some(versioned("b", 5, 1))), None, "older again");
        let next = versioned("c", 5, 3);
        assert_eq!(seen.change(Some(next.clone())), Some(Some(next)));
        assert_eq!(seen.change(None), Some(None), "the vacancy");
        assert_eq!(
            seen.change(Some(versioned("moved", 5, 1))),
            None,
            "missed, but older"
        );
        let missed = versioned("c", 5, 3);
        assert_eq!(
            seen.change(Some(missed.clone())),
            Some(Some(missed)),
            "missed"
        );
        let new_term = versioned("d", 6, 0);
        assert_eq!(seen.change(Some(new_term.clone())), Some(Some(new_term)));
    }
}
