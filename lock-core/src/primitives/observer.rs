//! Following an election's leader: [`LeaderObserver`], a stream of its changes that
//! never goes back a term, pushed by the backend's change feed and re-read every recheck.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::time::timeout;

use super::election::{Election, Leader};
use crate::changes::ChangeFeed;
use crate::error::Result;
use crate::name::LockName;
use crate::plumbing::Backoff;
use crate::token::FencingToken;

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
/// - Changes are pushed by the server where it can ([`DistributedLock::changes`](crate::DistributedLock::changes)) and
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

impl Election {
    /// Follows the leader: see [`LeaderObserver`].
    pub fn observe(&self) -> LeaderObserver {
        LeaderObserver::of(self.clone())
    }
}

impl LeaderObserver {
    /// The observer of `election`, before its first read.
    fn of(election: Election) -> Self {
        let name = election.name().clone();
        LeaderObserver {
            following: Some(Following {
                election,
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
            name,
        }
    }

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
        let recheck = self.election.lock().options().recheck;
        let first_read = self.last_term.is_none() && !self.vacant_reported;
        loop {
            if self.feed.as_ref().is_some_and(|feed| !feed.is_live()) {
                // The backend gave up on its subscription: make a new one.
                self.feed = None;
            }
            if self.feed.is_none() {
                // Subscribed before the read, so no change after the read goes unseen.
                match self.election.lock().changes(self.election.name()).await {
                    Ok(feed) => self.feed = Some(feed),
                    Err(err) if err.is_retryable() => {
                        tracing::debug!(election = %self.election.name(), error = %err,
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
                    tracing::debug!(election = %self.election.name(), error = %err,
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
    use std::sync::Arc;

    use super::*;
    use crate::lock::DistributedLock;
    use crate::occupancy::Participant;

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
