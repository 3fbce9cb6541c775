//! A leader service: the long-running form of [`Election::lead`]. It campaigns, runs
//! the work while it leads (cancelled the moment leadership is lost), campaigns again
//! after a loss or a resign with jittered backoff, reports what happens as
//! [`LeaderEvent`]s and metrics, and on shutdown resigns and returns, leaving nothing on
//! the server.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::election::{Election, Leader, LeaderObserver, Leadership};
use crate::error::{Error, Result};
use crate::ext::{work_while_held, HeldEnd, LockContext};
use crate::metrics::ServiceSeries;
use crate::options::AcquireOptions;
use crate::plumbing::{lock_unpoisoned, Backoff};
use crate::state::{LostReason, ReleaseOutcome};
use crate::token::FencingToken;

/// First pause before campaigning again after a term or a failed campaign (jittered).
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause before campaigning again (jittered).
const LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// What a [`LeaderService`] reports as it runs.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// The service started a campaign.
    Campaigning,
    /// The service leads in `term`; its work starts.
    Elected {
        /// The term: the leadership's fencing token.
        term: FencingToken,
    },
    /// Leadership of `term` was lost; the work had been cancelled before the event.
    Lost {
        /// The term lost.
        term: FencingToken,
        /// Why it was lost.
        reason: LostReason,
    },
    /// The service resigned `term`: its work returned, or the service was shut down.
    Resigned {
        /// The term given up.
        term: FencingToken,
        /// What the release found; `None` when it failed with an error retrying may
        /// cure (the leadership then ends with its lease at the latest).
        release: Option<ReleaseOutcome>,
    },
    /// The election's leader changed, as the service follows it: another candidate's
    /// term, this service's own, or `None` while nobody leads.
    Leader(Option<Leader>),
    /// A campaign failed with an error retrying may cure; the next one starts after
    /// `retry_in`.
    CampaignFailed {
        /// The error, as text.
        error: String,
        /// The pause before the next campaign.
        retry_in: Duration,
    },
}

/// How a [`LeaderService`] ended its run.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSummary {
    /// Terms this service led.
    pub terms: u64,
    /// Terms lost (not resigned).
    pub lost: u64,
}

/// Campaigns for an election over and over, running work each time it leads, in the
/// spirit of Curator's `LeaderSelector` with `autoRequeue` and client-go's leader
/// election loop:
///
/// - **One leader's work at a time.** The work of a term runs only while its leadership
///   is Held, and is dropped (cancelled at its next await point) the moment the
///   leadership is lost: before its lease can end on the server, so before another
///   candidate can lead, as long as the work does not block its thread.
/// - **Requeue.** After the work returns (a resign) or its leadership is lost, the
///   service pauses (jittered, doubling up to 10 s; back to 100 ms after a term that
///   lasted longer than the pause) and campaigns again, in the election's FIFO order.
///   Campaigns that fail with a retryable error are retried the same way; other errors
///   (a closed client, a conflict on the name) end the run.
/// - **Shutdown.** When the `shutdown` future given to [`LeaderService::run`] resolves,
///   the work is dropped, the leadership resigned (awaited) or the campaign withdrawn,
///   and `run` returns: no candidate entry is left behind.
/// - **Events and metrics.** [`LeaderService::events`] streams [`LeaderEvent`]s; the
///   client's metrics count campaigns and the leader changes the service saw
///   (`distlock_leader_campaigns_total`, `distlock_leader_changes_total`), beside the
///   terms won and leaderships every election records.
#[derive(Debug)]
pub struct LeaderService {
    election: Election,
    value: Vec<u8>,
    first_pause: Duration,
    longest_pause: Duration,
    subscribers: Mutex<Vec<mpsc::UnboundedSender<LeaderEvent>>>,
}

impl LeaderService {
    /// A service campaigning in `election` with `value` (what readers see while it
    /// leads).
    pub fn new(election: Election, value: impl Into<Vec<u8>>) -> Self {
        LeaderService {
            election,
            value: value.into(),
            first_pause: FIRST_PAUSE,
            longest_pause: LONGEST_PAUSE,
            subscribers: Mutex::new(Vec::new()),
        }
    }

    /// Pauses before campaigning again: from `first`, doubling up to `longest`, each
    /// drawn at random below its bound (full jitter).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `first` is zero or above `longest`.
    pub fn with_backoff(mut self, first: Duration, longest: Duration) -> Result<Self> {
        if first.is_zero() || first > longest {
            return Err(Error::config(
                "a leader service's first pause must be above zero and at most its longest",
            ));
        }
        self.first_pause = first;
        self.longest_pause = longest;
        Ok(self)
    }

    /// The election.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// A stream of what the service reports from now on; it ends when the service is
    /// dropped.
    pub fn events(&self) -> LeaderEvents {
        let (tell, events) = mpsc::unbounded_channel();
        lock_unpoisoned(&self.subscribers).push(tell);
        LeaderEvents(events)
    }

    /// Runs the service until `shutdown` resolves (see [`LeaderService`]): each time it
    /// leads, `work` runs with the term in its context's fencing token. Returns how many
    /// terms it led.
    ///
    /// # Errors
    /// A campaign error retrying cannot cure; the service then holds and queues nothing.
    pub async fn run<W, Fut>(
        &self,
        mut work: W,
        shutdown: impl Future<Output = ()>,
    ) -> Result<ServiceSummary>
    where
        W: FnMut(LockContext) -> Fut + Send,
        Fut: Future<Output = ()> + Send,
    {
        let lock = self.election.lock();
        let metrics = ServiceSeries::new(
            lock.capabilities().backend,
            lock.options().metrics_names.then(|| self.election.name()),
        );
        let mut shutdown = pin!(shutdown);
        let mut observer = Some(self.election.observe());
        let mut backoff = Backoff::new(self.first_pause, self.longest_pause);
        let mut summary = ServiceSummary { terms: 0, lost: 0 };
        let forever = AcquireOptions::forever();
        loop {
            self.emit(LeaderEvent::Campaigning);
            metrics.campaign();
            let campaign = self.election.campaign_with(self.value.clone(), &forever);
            let won = tokio::select! {
                won = campaign => won,
                () = self.follow(&mut observer, &metrics, shutdown.as_mut()) => {
                    return Ok(summary);
                }
            };
            let leadership = match won {
                Ok(Some(leadership)) => leadership,
                Ok(None) => unreachable!("a campaign that waits forever returns a leadership"),
                Err(err) if err.is_retryable() => {
                    let retry_in = backoff.next_pause();
                    tracing::warn!(election = %self.election.name(), error = %err, ?retry_in,
                        "a leader service's campaign failed; campaigning again");
                    self.emit(LeaderEvent::CampaignFailed {
                        error: err.to_string(),
                        retry_in,
                    });
                    if self
                        .pause(retry_in, &mut observer, &metrics, shutdown.as_mut())
                        .await
                    {
                        return Ok(summary);
                    }
                    continue;
                }
                Err(err) => return Err(err),
            };
            summary.terms += 1;
            let elected_at = Instant::now();
            let term = leadership.term();
            self.emit(LeaderEvent::Elected { term });
            let stop = self.follow(&mut observer, &metrics, shutdown.as_mut());
            let (guard, value) = leadership.into_parts();
            let stopped = match work_while_held(guard, &mut work, stop).await {
                HeldEnd::Lost(reason) => {
                    summary.lost += 1;
                    self.emit(LeaderEvent::Lost { term, reason });
                    false
                }
                HeldEnd::Done((), guard) => {
                    self.resign(Leadership::from_parts(guard, value)).await?;
                    false
                }
                HeldEnd::Stopped(guard) => {
                    self.resign(Leadership::from_parts(guard, value)).await?;
                    true
                }
            };
            if stopped {
                return Ok(summary);
            }
            if elected_at.elapsed() > self.longest_pause {
                backoff.reset();
            }
            let pause = backoff.next_pause();
            if self
                .pause(pause, &mut observer, &metrics, shutdown.as_mut())
                .await
            {
                return Ok(summary);
            }
        }
    }

    /// Resigns `leadership` and reports it.
    ///
    /// # Errors
    /// A release error retrying cannot cure (a retryable one leaves the release to the
    /// background and the lease, and is reported as an undecided release).
    async fn resign(&self, leadership: Leadership) -> Result<()> {
        let term = leadership.term();
        let release = match leadership.resign().await {
            Ok(release) => Some(release),
            Err(err) if err.is_retryable() => {
                tracing::warn!(election = %self.election.name(), error = %err,
                    "a leader service's resign failed; its lease ends it");
                None
            }
            Err(err) => return Err(err),
        };
        self.emit(LeaderEvent::Resigned { term, release });
        Ok(())
    }

    /// Sleeps `pause` while following the leader; `true` if `shutdown` came first.
    async fn pause(
        &self,
        pause: Duration,
        observer: &mut Option<LeaderObserver>,
        metrics: &ServiceSeries,
        shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> bool {
        tokio::select! {
            () = tokio::time::sleep(pause) => false,
            () = self.follow(observer, metrics, shutdown) => true,
        }
    }

    /// Reports the leader's changes until `shutdown` resolves. Following stops (and the
    /// service goes on) after an error retrying cannot cure.
    async fn follow(
        &self,
        observer: &mut Option<LeaderObserver>,
        metrics: &ServiceSeries,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) {
        loop {
            let change = async {
                match observer.as_mut() {
                    Some(observer) => observer.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return,
                change = change => match change {
                    Ok(leader) => {
                        metrics.leader_changed();
                        self.emit(LeaderEvent::Leader(leader));
                    }
                    Err(err) => {
                        tracing::warn!(election = %self.election.name(), error = %err,
                            "a leader service stopped following its election's leader");
                        *observer = None;
                    }
                },
            }
        }
    }

    fn emit(&self, event: LeaderEvent) {
        lock_unpoisoned(&self.subscribers).retain(|tell| tell.send(event.clone()).is_ok());
    }
}

/// The events of a [`LeaderService`], as a [`Stream`] (see [`LeaderService::events`]).
#[derive(Debug)]
pub struct LeaderEvents(mpsc::UnboundedReceiver<LeaderEvent>);

impl LeaderEvents {
    /// The next event; `None` once the service is gone.
    pub async fn next(&mut self) -> Option<LeaderEvent> {
        self.0.recv().await
    }
}

impl Stream for LeaderEvents {
    type Item = LeaderEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaderEvent>> {
        self.get_mut().0.poll_recv(cx)
    }
}
