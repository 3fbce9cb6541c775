//! Acquisition: reentrant re-entry by owner id, the retried attempts of a waiting
//! acquire (each with its own owner token), and registering a granted hold.

use super::*;

impl<B: Backend> Keeper<B> {
    /// Acquires `name`, counted in the metrics and traced in a span.
    pub(super) async fn acquire(
        &self,
        name: &LockName,
        options: &AcquireOptions,
    ) -> Result<Option<LockGuard>> {
        // Taken before the check for a closed client: closing waits for this acquire.
        let _in_flight = self.acquiring.token();
        let mut closing = self.closing.subscribe();
        let call = AcquireCall {
            series: self.metrics.series(name),
            started: Instant::now(),
            span: tracing::info_span!(
                "distlock.acquire",
                backend = self.capabilities.backend,
                lock = %name,
                kind = options.kind.label(),
                fencing_token = tracing::field::Empty,
            ),
        };
        call.series.attempt();
        let result = {
            // Counted as waiting until this block ends, or the acquire is dropped.
            let _waiting = (options.wait != Wait::Try).then(|| call.series.waiting(&options.kind));
            // Closing ends it: dropped, the backend's acquire leaves its cleanup to the
            // backend's background work, which closing waits for too.
            tokio::select! {
                biased;
                result = self.acquire_checked(name, options, &call) => result,
                _ = closing.wait_for(|closed| *closed) => Err(self.closed_acquire(name)),
            }
        };
        call.series.acquired(&result, call.started);
        if let Ok(Some(guard)) = &result {
            call.span.record("fencing_token", guard.fencing_token().0);
        }
        result
    }

    async fn acquire_checked(
        &self,
        name: &LockName,
        options: &AcquireOptions,
        call: &AcquireCall,
    ) -> Result<Option<LockGuard>> {
        let ttl = options.ttl.unwrap_or(self.options.ttl);
        check_ttl(&self.capabilities, ttl)?;
        if !self.capabilities.per_lock_ttl && ttl != self.options.ttl {
            return Err(Error::Unsupported {
                backend: self.capabilities.backend,
                operation: format!(
                    "a per-lock ttl ({ttl:?}); this backend uses one session-wide lease of {:?} \
                     (a client connected with another `ttl` has another lease)",
                    self.options.ttl
                ),
            });
        }
        if let Some(cap) = options.max_hold {
            check_duration("max_hold", cap)?;
        }
        check_wait(options.wait)?;
        self.check_kind(options)?;
        if self.is_closed() {
            return Err(self.closed_acquire(name));
        }
        self.ensure_task();

        let Some(owner) = &options.owner else {
            return self.acquire_new(name, options, ttl, call).await;
        };
        let key = (name.clone(), owner.clone());
        let gate = Arc::clone(lock_unpoisoned(&self.gates).entry(key.clone()).or_default());
        let result = {
            let _serialized = gate.lock().await;
            match self.reenter(&key) {
                Some(guard) => Ok(Some(guard)),
                None => self.acquire_new(name, options, ttl, call).await,
            }
        };
        let mut gates = lock_unpoisoned(&self.gates);
        if gates.get(&key).is_some_and(|g| Arc::strong_count(g) == 2) {
            gates.remove(&key);
        }
        result
    }

    /// The error of an acquire of `name` on this client once closed.
    fn closed_acquire(&self, name: &LockName) -> Error {
        self.closed_error(format_args!("acquire `{name}`"))
    }

    /// Refuses a kind of hold the backend does not grant, a bad number of permits,
    /// and reentrancy for any kind but the mutex (a candidate, a permit, a reader or a
    /// writer is one acquisition's own, never shared).
    fn check_kind(&self, options: &AcquireOptions) -> Result<()> {
        options.kind.check_count()?;
        let (granted, what) = match &options.kind {
            HoldKind::Mutex => return Ok(()),
            HoldKind::Candidate { .. } => (self.capabilities.election, "leader elections"),
            HoldKind::Permit { count: 1, .. } => (self.capabilities.semaphore, "semaphores"),
            HoldKind::Permit { .. } => (
                self.capabilities.semaphore && self.capabilities.semaphore_many,
                "taking several permits of a semaphore in one hold (its layout keeps no count \
                 per hold)",
            ),
            HoldKind::Read | HoldKind::Write => (self.capabilities.rwlock, "read-write locks"),
            HoldKind::Upgradeable => (
                self.capabilities.rwlock && self.capabilities.upgradeable,
                "upgradeable read locks",
            ),
        };
        if !granted {
            return Err(Error::unsupported(self.capabilities.backend, what));
        }
        if options.owner.is_some() {
            return Err(Error::config(format!(
                "an acquire of {} cannot be reentrant: leave AcquireOptions::owner unset",
                options.kind.describe()
            )));
        }
        Ok(())
    }

    /// A new guard on an existing hold of the same (name, owner), if any.
    fn reenter(&self, key: &(LockName, OwnerId)) -> Option<LockGuard> {
        let mut table = self.table();
        let id = *table.reentrant.get(key)?;
        let entry = table.holds.get_mut(&id)?;
        if entry.info.state().is_lost() {
            return None;
        }
        entry.refs += 1;
        let info = Arc::clone(&entry.info);
        drop(table);
        Some(LockGuard::new(info, self.arc()?))
    }

    async fn acquire_new(
        &self,
        name: &LockName,
        options: &AcquireOptions,
        ttl: Duration,
        call: &AcquireCall,
    ) -> Result<Option<LockGuard>> {
        let started = call.started;
        let wait = !matches!(options.wait, Wait::Try);
        let deadline = match options.wait {
            Wait::Timeout(limit) => Some(started + limit),
            Wait::Try | Wait::Forever => None,
        };
        let timed_out = || Error::Timeout {
            name: name.to_string(),
            waited: started.elapsed(),
        };
        let mut backoff = Backoff::new(RETRY_FIRST_PAUSE, RETRY_LONGEST_PAUSE);
        loop {
            // Every attempt has its own owner token: the cleanup of a failed attempt (which
            // may still be running on the server) can never touch what a retry takes.
            let token = OwnerToken::generate();
            let request = AcquireRequest {
                name,
                token: &token,
                ttl,
                wait,
                fence_at_least: None,
                kind: &options.kind,
            };
            // The span is entered while the backend works (a boxed future: cheap to wrap).
            let attempt = self.backend.acquire(request).instrument(call.span.clone());
            let result = match deadline {
                Some(deadline) => timeout_at(deadline, attempt)
                    .await
                    .map_err(|_| timed_out())?,
                None => attempt.await,
            };
            let result = match result {
                Ok(Some(acquired)) => self
                    .register(name, token, ttl, options, acquired, &call.series)
                    .map(Some),
                Ok(None) => Ok(None),
                Err(err) => Err(err),
            };
            // A waiting acquire rides out transient failures (a reset connection, a
            // moment without quorum) until its deadline, then reports the last one. Its
            // queue entry lost with an expired session or lease is no reason to stop
            // either: nothing was granted, so the next attempt queues with a new one; nor
            // is a grant that ended before it could be registered. (A queue entry removed
            // behind its back, by an operator, does stop it.)
            match result {
                Err(err) if wait && (err.is_retryable() || session_ran_out(&err)) => {
                    let resume = Instant::now() + backoff.next_pause();
                    if deadline.is_some_and(|deadline| resume >= deadline) {
                        return Err(err);
                    }
                    call.span.in_scope(|| {
                        tracing::debug!(lock = %name, error = %err, "acquire failed; retrying");
                    });
                    sleep_until(resume).await;
                }
                result => return result,
            }
        }
    }

    /// Starts tracking a fresh hold. Synchronous, so an acquire cancelled after the
    /// backend granted the lock cannot leave it untracked. A hold that ended before it
    /// could be registered (its lease ran out, or its session ended: a guard must never
    /// say Held for it) is released in the background, and the acquire fails.
    fn register(
        &self,
        name: &LockName,
        token: OwnerToken,
        ttl: Duration,
        options: &AcquireOptions,
        acquired: Acquired<B::Hold>,
        series: &Arc<Series>,
    ) -> Result<LockGuard> {
        let now = Instant::now();
        let valid_until = validity_deadline(acquired.requested_at, acquired.lease);
        let renewal = options.renewal.unwrap_or(self.options.renewal);
        let cap = options.max_hold.or(self.options.max_hold);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // A first lease shorter than the TTL (a grant the backend handed over with a short
        // lease, see `Acquired::lease`) is renewed a third of the way into it.
        let planned = acquired.requested_at + acquired.lease.min(ttl) / 3;
        let term =
            matches!(options.kind, HoldKind::Candidate { .. }).then_some(acquired.fencing_token);
        let metrics = Arc::new(HoldMetrics::new(
            Arc::clone(series),
            now,
            &options.kind,
            term,
        ));
        let info = Arc::new(HoldInfo {
            id,
            name: name.clone(),
            token,
            fencing_token: acquired.fencing_token,
            acquired_at: acquired.requested_at,
            valid_until: Arc::new(AtomicInstant::new(self.base, valid_until)),
            state: Mutex::new(StateSlot::new(LockState::Held)),
            observer: Arc::clone(&metrics) as Arc<dyn HoldObserver>,
        });
        let entry = Entry {
            info: Arc::clone(&info),
            metrics,
            hold: Arc::new(acquired.hold),
            ttl,
            renewal,
            cap_at: cap.map(|cap| acquired.requested_at + cap),
            session: acquired.session,
            owner: options.owner.clone(),
            refs: 1,
            renew_due: planned,
            renew_planned: planned,
            renew_failing: false,
            server_released: false,
            renewing: false,
        };
        let Some(me) = self.arc() else {
            return Err(self.closed_acquire(name));
        };
        if self.is_closed() {
            // Granted while the client closed: given back at once.
            let _ = self.commands.send(Command::Release(Arc::clone(&me), entry));
            return Err(self.closed_acquire(name));
        }
        let session_ended = lock_unpoisoned(&self.session)
            .as_ref()
            .is_some_and(|status| status.borrow().has_ended(entry.session));
        if valid_until <= now || session_ended {
            let _ = self.commands.send(Command::Release(Arc::clone(&me), entry));
            if session_ended {
                return Err(Error::Lost {
                    name: name.to_string(),
                    reason: LostReason::SessionExpired,
                });
            }
            return Err(Error::Unavailable {
                backend: self.capabilities.backend,
                message: format!("the lease on `{name}` ran out before the grant arrived"),
                source: None,
            });
        }
        let mut table = self.table();
        if let Some(owner) = &entry.owner {
            table.reentrant.insert((name.clone(), owner.clone()), id);
        }
        entry.refresh_state(table.session_suspended);
        // The keeper task is woken only if its own next wake-up would come too late
        // for this hold (a task hop per acquire otherwise, and a re-plan of every hold).
        let wake = match (entry.attention(valid_until, now), table.planned_wake) {
            (Attention::At(at), Some(planned)) => planned > at,
            _ => true,
        };
        // Counted before anything else can see the hold, so that whatever ends it finds
        // it counted.
        entry.metrics.start();
        table.holds.insert(id, entry);
        drop(table);
        if wake {
            self.wake();
        }
        Ok(LockGuard::new(info, me))
    }
}

/// One acquire call as its metrics and its span see it.
struct AcquireCall {
    series: Arc<Series>,
    started: Instant,
    span: Span,
}
