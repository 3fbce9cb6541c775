//! Release: dropping a guard's reference, the owner-checked release on the server,
//! retried while the hold may still exist there, finished in the background when the
//! caller goes away.

use super::*;

impl<B: Backend> Keeper<B> {
    /// Removes a guard's reference; returns the entry when it was the last one.
    pub(super) fn unref(&self, id: u64) -> Unref<B::Hold> {
        let mut table = self.table();
        let Some(entry) = table.holds.get_mut(&id) else {
            return Unref::Gone;
        };
        entry.refs -= 1;
        if entry.refs > 0 {
            return Unref::Shared(entry.info.state());
        }
        let Some(entry) = table.holds.remove(&id) else {
            return Unref::Gone;
        };
        if let Some(owner) = &entry.owner {
            let key = (entry.info.name.clone(), owner.clone());
            if table.reentrant.get(&key) == Some(&id) {
                table.reentrant.remove(&key);
            }
        }
        Unref::Last(entry)
    }

    /// Releases an entry on the server in the background and ends its state.
    pub(super) async fn finish_release(&self, entry: Entry<B::Hold>) {
        let prior = entry.info.state();
        entry.info.transition(LockState::Lost(LostReason::Released));
        if entry.server_released {
            return;
        }
        let result = self.retry_release(HoldEnd::of(&entry), &entry.hold).await;
        found_at_release(&entry.metrics, prior, &result);
        if let Err(err) = result {
            tracing::warn!(lock = %entry.info.name, error = %err, "release failed; the server-side lease ends the hold");
        }
    }

    /// Releases `hold` with [`release_patiently`], judging the end of its session by the
    /// status this client last saw.
    pub(super) async fn retry_release(
        &self,
        end: HoldEnd,
        hold: &B::Hold,
    ) -> Result<BackendRelease> {
        let span = self.release_span(&end.info, true);
        release_patiently(
            end.server,
            || self.table().session,
            || self.release_hold(hold),
        )
        .instrument(span)
        .await
    }

    /// One release request for `entry`, whose state before the release was `prior`.
    pub(super) async fn release_once(
        &self,
        entry: &Entry<B::Hold>,
        prior: LockState,
    ) -> Result<ReleaseOutcome> {
        if entry.server_released {
            return Ok(ReleaseOutcome::AlreadyLost(match prior {
                LockState::Lost(reason) => reason,
                _ => LostReason::HoldCapReached,
            }));
        }
        let result = self.release_hold(&entry.hold).await;
        found_at_release(&entry.metrics, prior, &result);
        match (prior, result) {
            (_, Err(err)) => Err(err),
            (LockState::Lost(reason), _) => Ok(ReleaseOutcome::AlreadyLost(reason)),
            (_, Ok(BackendRelease::Released)) => Ok(ReleaseOutcome::Released),
            (_, Ok(BackendRelease::NotOwner(reason))) => Ok(ReleaseOutcome::AlreadyLost(reason)),
        }
    }

    /// One release request for `hold`. Its deadline is the backend's: every network call
    /// of a [`Backend`] has one (its contract), so a second timer here would only cost
    /// time on every release.
    async fn release_hold(&self, hold: &B::Hold) -> Result<BackendRelease> {
        self.backend.release(hold).await
    }

    /// Closes the client (see [`DistributedLock::close`]): refuses acquires from now on,
    /// ends those in flight, releases every hold still tracked, waits (at most the request
    /// timeout each) for the acquires to end and the releases under way, then closes the
    /// backend (which waits for the cleanups of the ended acquires).
    pub(super) async fn close(&self) -> Result<()> {
        self.closing.send_replace(true);
        // The acquires in flight end as soon as their tasks run, leaving their cleanups
        // to the backend's background work (waited for by its close).
        let limit = self.options.request_timeout;
        self.acquiring.close();
        if timeout(limit, self.acquiring.wait()).await.is_err() {
            tracing::warn!(
                backend = self.capabilities.backend,
                "closing: acquires still in flight after the request timeout"
            );
        }
        let entries: Vec<Entry<B::Hold>> = {
            let mut table = self.table();
            table.reentrant.clear();
            table.holds.drain().map(|(_, entry)| entry).collect()
        };
        if let Some(me) = self.arc() {
            for entry in entries {
                let keeper = Arc::clone(&me);
                self.background
                    .spawn(async move { keeper.finish_release(entry).await });
            }
        }
        // Releases handed to the keeper task before now are started by the time it
        // answers (it handles its commands in order); none are pending if it never ran.
        let (done, flushed) = oneshot::channel();
        let started = lock_unpoisoned(&self.receiver).is_none();
        if started && self.commands.send(Command::Flush(done)).is_ok() {
            let _ = timeout(limit, flushed).await;
        }
        if !self.background.settle(limit).await {
            tracing::warn!(
                backend = self.capabilities.backend,
                "closing: releases still under way after the request timeout; the session's end or the server-side expiry finishes them"
            );
        }
        self.backend.close().await
    }

    pub(super) fn is_closed(&self) -> bool {
        *self.closing.borrow()
    }

    /// The error of `operation` (``acquire `jobs/a` ``) asked of this client once closed.
    pub(super) fn closed_error(&self, operation: impl fmt::Display) -> Error {
        Error::closed(self.capabilities.backend, operation.to_string())
    }

    /// Runs an operator call (`inspect`, `list`, `force_release`, `changes`) within
    /// [`Keeper::deadline`], unless the client is closed: then, and when it failed because
    /// the client closed while it ran, it reports [`Error::Closed`] for `operation`.
    pub(super) async fn operate<T>(
        &self,
        operation: impl FnOnce() -> String,
        what: &str,
        rounds: u32,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if self.is_closed() {
            return Err(self.closed_error(operation()));
        }
        match self.deadline(what, rounds, call).await {
            Err(_) if self.is_closed() => Err(self.closed_error(operation())),
            result => result,
        }
    }

    /// Runs an operator call (`inspect`, `list`, `force_release`) within `rounds` request
    /// timeouts (a listing may take several round trips).
    pub(super) async fn deadline<T>(
        &self,
        what: &str,
        rounds: u32,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        timeout(self.options.request_timeout * rounds, call)
            .await
            .unwrap_or_else(|_| Err(self.deadline_error(what)))
    }

    pub(super) fn deadline_error(&self, what: &str) -> Error {
        Error::no_answer(
            self.capabilities.backend,
            what,
            self.options.request_timeout,
        )
    }
}

/// When a hold ends on the server by itself: where a release that keeps failing may stop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerEnd {
    /// The session epoch the hold belongs to (0 for backends without sessions).
    session: u64,
    /// The end of its last lease on the server, with the drift margin on both sides.
    lease_end: Instant,
    ttl: Duration,
}

impl ServerEnd {
    /// The end of a hold of session `session`, with TTL `ttl`, whose validity deadline is
    /// `valid_until` (from its grant or its last renewal).
    pub(crate) fn new(session: u64, valid_until: Instant, ttl: Duration) -> Self {
        ServerEnd {
            session,
            lease_end: valid_until + drift_margin(ttl) * 2,
            ttl,
        }
    }

    /// Whether the hold can no longer exist on the server, its backend's session being
    /// `status` (`None`: a backend without sessions): its session ended, or (without
    /// sessions) its last lease ran out.
    fn passed(&self, status: Option<SessionStatus>) -> bool {
        match status {
            Some(status) => status.has_ended(self.session),
            None => Instant::now() >= self.lease_end,
        }
    }
}

/// Releases a hold with `release`, again with backoff (50 ms, doubling up to 2 s) while the
/// release fails in a retryable way and the hold may still exist on the server: backends
/// whose holds live with a session (ZooKeeper, etcd) keep an unreleased hold for as long
/// as the session lives, so the server-side TTL is no fallback there. Gives up when the
/// hold's `end` has passed (`session` tells the backend's session status now), or after
/// [`RELEASE_GIVE_UP`] TTLs (at least a minute), whichever comes first; returns the last
/// attempt's result.
pub(crate) async fn release_patiently<F>(
    end: ServerEnd,
    session: impl Fn() -> Option<SessionStatus>,
    mut release: impl FnMut() -> F,
) -> Result<BackendRelease>
where
    F: Future<Output = Result<BackendRelease>>,
{
    const FIRST_PAUSE: Duration = Duration::from_millis(50);
    const LONGEST_PAUSE: Duration = Duration::from_secs(2);
    let give_up = Instant::now() + (end.ttl * RELEASE_GIVE_UP).max(Duration::from_secs(60));
    let mut backoff = Backoff::new(FIRST_PAUSE, LONGEST_PAUSE);
    loop {
        let result = release().await;
        let pause = backoff.next_pause();
        let retry = matches!(&result, Err(err) if err.is_retryable())
            && Instant::now() + pause < give_up
            && !end.passed(session());
        if !retry {
            return result;
        }
        sleep(pause).await;
    }
}

/// Counts the loss a release `found` of a hold whose state before its guard released it
/// was `prior`: gone on the server while it still counted as held (a loss noticed only
/// then, which no transition to Lost counted).
fn found_at_release(metrics: &HoldMetrics, prior: LockState, found: &Result<BackendRelease>) {
    let unnoticed = matches!(
        prior,
        LockState::Held | LockState::Suspect | LockState::Lost(LostReason::Released)
    );
    if let (true, Ok(BackendRelease::NotOwner(reason))) = (unnoticed, found) {
        metrics.found_lost(*reason);
    }
}

/// An explicit release still in progress: if dropped with its entry, the background task
/// finishes the release (with retries).
pub(super) struct UnfinishedRelease<B: Backend> {
    pub(super) keeper: Arc<Keeper<B>>,
    pub(super) entry: Option<Entry<B::Hold>>,
}

impl<B: Backend> Drop for UnfinishedRelease<B> {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            let keeper = Arc::clone(&self.keeper);
            // Fails only when the keeper task has ended; the server-side lease is left.
            let _ = self.keeper.commands.send(Command::Release(keeper, entry));
        }
    }
}
