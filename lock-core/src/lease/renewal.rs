//! Renewal: the watchdog task (one batched renewal per interval per client and renewal
//! group), explicit extensions (serialized per hold), the schedule, and session health.

use super::*;

impl<B: Backend> Keeper<B> {
    pub(super) async fn extend_hold(&self, id: u64, ttl: Option<Duration>) -> Result<Instant> {
        // Wait for a renewal of this hold already in flight: the server must apply ours
        // after it, or the deadline we record could be one the server no longer keeps.
        let waited_until = Instant::now() + self.options.request_timeout;
        let extension = loop {
            let ended = self.renewal_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(taken) = self.start_extend(id, ttl)? {
                break taken;
            }
            if timeout_at(waited_until, ended).await.is_err() {
                return Err(self.deadline_error("extend (waiting for the renewal in flight)"));
            }
        };
        let span = tracing::info_span!(
            "distlock.extend",
            backend = self.capabilities.backend,
            lock = %extension.info.name,
            fencing_token = extension.info.fencing_token.0,
        );
        let requested_at = Instant::now();
        let items = [RenewItem {
            hold: &*extension.hold,
            ttl: extension.ttl,
        }];
        let result = timeout(self.options.request_timeout, self.backend.renew(&items))
            .instrument(span)
            .await
            .unwrap_or_else(|_| Err(self.deadline_error("extend")));
        self.metrics.renewal_call(requested_at.elapsed());
        let mut ended = None;
        let extended = self.extend_done(id, &extension.info, requested_at, result, &mut ended);
        let outcome = match &extended {
            Ok(_) => Renewal::Renewed,
            Err(Error::Lost { .. }) => Renewal::Lost,
            Err(_) => Renewal::Failed,
        };
        extension.metrics.series().renewal(outcome, None);
        if let Some((hold, end)) = ended {
            // Lost already: free what the server still keeps before saying so, or (past
            // the request timeout) in the background.
            let release = self.retry_release(end.clone(), &hold);
            let release = timeout(self.options.request_timeout, release);
            if release.await.is_err() {
                self.release_ended([(hold, end)]);
            }
        }
        extended
    }

    /// Checks that hold `id` can be extended by `ttl` and marks its renewal in flight;
    /// `None` while another renewal of it is in flight.
    fn start_extend(&self, id: u64, ttl: Option<Duration>) -> Result<Option<Extension<'_, B>>> {
        let mut table = self.table();
        let entry = table.holds.get_mut(&id).ok_or_else(|| Error::NotHeld {
            name: String::new(),
            message: "the hold was already released".into(),
        })?;
        if let Some(err) = entry.lost_error() {
            return Err(err);
        }
        let wanted = ttl.unwrap_or(entry.ttl);
        check_ttl(&self.capabilities, wanted)?;
        if !self.capabilities.per_lock_ttl && wanted != entry.ttl {
            return Err(Error::Unsupported {
                backend: self.capabilities.backend,
                operation: format!(
                    "extending one hold for {wanted:?}; this backend uses one session-wide \
                     lease of {:?}",
                    entry.ttl
                ),
            });
        }
        let Some(effective) = entry.effective_ttl(wanted, Instant::now()) else {
            return Err(Error::Lost {
                name: entry.info.name.to_string(),
                reason: LostReason::HoldCapReached,
            });
        };
        if entry.renewing {
            return Ok(None);
        }
        entry.renewing = true;
        Ok(Some(Extension {
            hold: Arc::clone(&entry.hold),
            info: Arc::clone(&entry.info),
            metrics: Arc::clone(&entry.metrics),
            ttl: effective,
            _renewing: Renewing {
                keeper: self,
                ids: vec![id],
                group: None,
            },
        }))
    }

    /// Records the outcome of an extension of hold `id` sent at `requested_at`; a hold
    /// found lost is left in `ended`, to be released on the server.
    fn extend_done(
        &self,
        id: u64,
        info: &HoldInfo,
        requested_at: Instant,
        result: Result<Vec<RenewOutcome>>,
        ended: &mut Option<(Arc<B::Hold>, HoldEnd)>,
    ) -> Result<Instant> {
        let mut table = self.table();
        let suspended = table.session_suspended;
        let entry = table.holds.get_mut(&id);
        let outcome = match result {
            Ok(outcomes) => match outcomes.first() {
                None => Err(Error::Protocol {
                    backend: self.capabilities.backend,
                    message: "renewal returned no outcome".into(),
                    source: None,
                }),
                Some(RenewOutcome::Renewed { lease }) => Ok(Ok(*lease)),
                Some(RenewOutcome::Lost(reason)) => Ok(Err(*reason)),
                Some(RenewOutcome::Undecided) => Err(Error::Unavailable {
                    backend: self.capabilities.backend,
                    message: format!("the extension of `{}` could not be decided", info.name),
                    source: None,
                }),
            },
            Err(err) => Err(err),
        };
        match outcome {
            Ok(Ok(lease)) => {
                let valid_until = validity_deadline(requested_at, lease);
                if let Some(entry) = entry {
                    if let Some(err) = entry.lost_error() {
                        return Err(err);
                    }
                    entry.renewed(requested_at, lease, suspended);
                }
                drop(table);
                self.wake();
                Ok(valid_until)
            }
            Ok(Err(reason)) => {
                info.transition(LockState::Lost(reason));
                *ended = entry.map(|entry| entry.end());
                Err(Error::Lost {
                    name: info.name.to_string(),
                    reason,
                })
            }
            Err(err) => {
                if let Some(entry) = entry {
                    entry.renew_failing = true;
                    entry.refresh_state(suspended);
                }
                Err(err)
            }
        }
    }

    /// Expires holds whose deadline or cap passed, starts a batched renewal of the holds
    /// that are due (one per renewal group that has none in flight), and returns when to
    /// look again (also recorded as the table's [`Table::planned_wake`]).
    fn plan(&self) -> Instant {
        /// How long the keeper sleeps with nothing to watch.
        const IDLE: Duration = Duration::from_secs(3600);
        let now = Instant::now();
        let mut table = self.table();
        let Table {
            holds,
            renewing_groups,
            ..
        } = &mut *table;
        let mut next = now + IDLE;
        // The due holds by renewal group, for the groups without a renewal in flight, and
        // whether one of them is overdue (only that starts the group's batch).
        let mut due: HashMap<u64, (bool, Vec<u64>)> = HashMap::new();
        // Holds that ended on the client: removed on the server too, so that backends
        // whose holds live with a session (ZooKeeper, etcd) do not keep them.
        let mut ended = Vec::new();
        for (id, entry) in holds.iter_mut() {
            if entry.info.state().is_lost() {
                continue;
            }
            let valid_until = entry.info.valid_until.load();
            // The last renewals are cut at the cap, so an expiry near the cap is the cap's.
            let cap_reached = entry.cap_at.is_some_and(|cap| {
                cap <= now || (valid_until <= now && cap <= valid_until + drift_margin(entry.ttl))
            });
            if cap_reached {
                entry
                    .info
                    .transition(LockState::Lost(LostReason::HoldCapReached));
                ended.push(entry.end());
                continue;
            }
            if valid_until <= now {
                let reason = self.backend.expired_reason(&entry.hold);
                entry.info.transition(LockState::Lost(reason));
                ended.push(entry.end());
                continue;
            }
            let wake_at = match entry.attention(valid_until, now) {
                Attention::Due { at, overdue } => {
                    let group = self.backend.renewal_group(&entry.hold);
                    if !entry.renewing && !renewing_groups.contains(&group) {
                        let batch = due.entry(group).or_default();
                        batch.0 |= overdue;
                        batch.1.push(*id);
                    }
                    at
                }
                Attention::At(at) => at,
            };
            next = next.min(wake_at);
        }
        if let Some(me) = self.arc() {
            for (group, (_, ids)) in due.into_iter().filter(|(_, (overdue, _))| *overdue) {
                renewing_groups.insert(group);
                tokio::spawn(Arc::clone(&me).renew_batch(group, ids));
            }
        }
        table.planned_wake = Some(next);
        drop(table);
        self.release_ended(ended);
        next
    }

    /// Removes holds that ended on the client from the server too, in the background, so
    /// that backends whose holds live with a session (ZooKeeper, etcd) do not keep them,
    /// nor a dual lock the side it still held when the other was lost. Called once the
    /// holds' guards have stopped vouching (their state is Lost).
    fn release_ended(&self, ended: impl IntoIterator<Item = (Arc<B::Hold>, HoldEnd)>) {
        for (hold, end) in ended {
            if let Some(me) = self.arc() {
                tokio::spawn(async move {
                    if let Err(err) = me.retry_release(end, &hold).await {
                        tracing::warn!(error = %err, "release of an ended hold failed; the server-side lease ends it");
                    }
                });
            }
        }
    }

    /// Renews the holds `ids` of renewal `group` in one backend call.
    async fn renew_batch(self: Arc<Self>, group: u64, ids: Vec<u64>) {
        // First of all, so that the group is free again however this task ends.
        let mut renewing = Renewing {
            keeper: &self,
            ids: Vec::new(),
            group: Some(group),
        };
        let now = Instant::now();
        let mut earliest = now + self.options.request_timeout;
        let batch: Vec<DueHold<B::Hold>> = {
            let mut table = self.table();
            ids.iter()
                .filter_map(|id| {
                    let entry = table.holds.get_mut(id)?;
                    if entry.info.state().is_lost() || entry.renewing {
                        return None;
                    }
                    let ttl = entry.effective_ttl(entry.ttl, now)?;
                    entry.renewing = true;
                    earliest = earliest.min(entry.info.valid_until.load());
                    Some(DueHold {
                        id: *id,
                        hold: Arc::clone(&entry.hold),
                        ttl,
                        info: Arc::clone(&entry.info),
                        metrics: Arc::clone(&entry.metrics),
                        planned: entry.renew_planned,
                    })
                })
                .collect()
        };
        renewing.ids = batch.iter().map(|due| due.id).collect();
        if batch.is_empty() {
            self.wake();
            return;
        }
        let items: Vec<RenewItem<'_, B::Hold>> = batch
            .iter()
            .map(|due| RenewItem {
                hold: &*due.hold,
                ttl: due.ttl,
            })
            .collect();
        let span = tracing::info_span!(
            "distlock.renew",
            backend = self.capabilities.backend,
            holds = batch.len(),
            lock = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
        );
        if let [due] = batch.as_slice() {
            span.record("lock", tracing::field::display(&due.info.name));
            span.record("fencing_token", due.info.fencing_token.0);
        }
        let requested_at = Instant::now();
        let renewal = timeout_at(earliest.max(requested_at), self.backend.renew(&items));
        let result = match renewal.instrument(span.clone()).await {
            Ok(Ok(outcomes)) if outcomes.len() == items.len() => Ok(outcomes),
            Ok(Ok(_)) => Err("renewal returned the wrong number of outcomes".to_owned()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("renewal got no answer before the validity deadline".to_owned()),
        };
        self.metrics.renewal_call(requested_at.elapsed());
        drop(items);
        // No await from here on: what this logs belongs to the renewal.
        let _entered = span.enter();
        let mut table = self.table();
        let suspended = table.session_suspended;
        let mut ended = Vec::new();
        let count = |due: &DueHold<B::Hold>, outcome| {
            let lag = requested_at.saturating_duration_since(due.planned);
            due.metrics.series().renewal(outcome, Some(lag));
        };
        match result {
            Ok(outcomes) => {
                for (due, outcome) in batch.iter().zip(outcomes) {
                    count(due, renewal_counted(&outcome));
                    let Some(entry) = table.holds.get_mut(&due.id) else {
                        continue;
                    };
                    match outcome {
                        RenewOutcome::Renewed { lease } => {
                            if entry.info.state().is_lost() {
                                continue;
                            }
                            entry.renewed(requested_at, lease, suspended);
                        }
                        RenewOutcome::Lost(reason) => {
                            entry.info.transition(LockState::Lost(reason));
                            ended.push(entry.end());
                        }
                        RenewOutcome::Undecided => entry.renewal_failed(suspended),
                    }
                }
            }
            Err(message) => {
                tracing::warn!(backend = self.capabilities.backend, %message, holds = batch.len(), "renewal failed; holds are suspect");
                for due in &batch {
                    count(due, Renewal::Failed);
                    if let Some(entry) = table.holds.get_mut(&due.id) {
                        entry.renewal_failed(suspended);
                    }
                }
            }
        }
        drop(table);
        self.release_ended(ended);
        self.wake();
    }

    /// Records the session's `status`: the holds of an ended session turn Lost, and are
    /// then released on the server like any hold that ended on the client (a dual lock's
    /// other side is not bound to the session that ended).
    fn apply_session(&self, status: SessionStatus) {
        let mut table = self.table();
        table.session = Some(status);
        table.session_suspended = status.health == SessionHealth::Suspended;
        let suspended = table.session_suspended;
        let mut ended = Vec::new();
        for entry in table.holds.values_mut() {
            if status.has_ended(entry.session) {
                if entry.info.state().is_lost() {
                    continue;
                }
                entry
                    .info
                    .transition(LockState::Lost(LostReason::SessionExpired));
                ended.push(entry.end());
            } else if entry.session == status.epoch {
                entry.refresh_state(suspended);
            }
        }
        drop(table);
        self.release_ended(ended);
    }
}

pub(super) async fn run_keeper<B: Backend>(
    keeper: Weak<Keeper<B>>,
    mut commands: mpsc::UnboundedReceiver<Command<B>>,
    mut session: Option<watch::Receiver<SessionStatus>>,
) {
    if let (Some(receiver), Some(keeper)) = (&mut session, keeper.upgrade()) {
        let initial = *receiver.borrow_and_update();
        keeper.apply_session(initial);
    }
    loop {
        let next = match keeper.upgrade() {
            Some(keeper) => keeper.plan(),
            None => return,
        };
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Wake) => {}
                Some(Command::Release(keeper, entry)) => {
                    let background = keeper.background.clone();
                    background.spawn(async move { keeper.finish_release(entry).await });
                }
                Some(Command::Flush(done)) => {
                    let _ = done.send(());
                }
            },
            _ = sleep_until(next) => {}
            status = session_change(&mut session) => {
                match (status, keeper.upgrade()) {
                    (Some(status), Some(keeper)) => keeper.apply_session(status),
                    (None, _) => session = None,
                    (_, None) => return,
                }
            }
        }
    }
}

async fn session_change(
    session: &mut Option<watch::Receiver<SessionStatus>>,
) -> Option<SessionStatus> {
    match session {
        Some(receiver) => match receiver.changed().await {
            Ok(()) => Some(*receiver.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// A hold in a watchdog renewal: what the backend call needs, and what its metrics do.
struct DueHold<H> {
    id: u64,
    hold: Arc<H>,
    ttl: Duration,
    info: Arc<HoldInfo>,
    metrics: Arc<HoldMetrics>,
    /// When the renewal was planned ([`Entry::renew_planned`]).
    planned: Instant,
}

/// An extension of one hold, marked in flight until dropped.
struct Extension<'a, B: Backend> {
    hold: Arc<B::Hold>,
    info: Arc<HoldInfo>,
    metrics: Arc<HoldMetrics>,
    ttl: Duration,
    _renewing: Renewing<'a, B>,
}

/// Marks renewals of some holds in flight (see [`Entry::renewing`]), and a batch's
/// renewal group (see [`Table::renewing_groups`]); clears the marks when dropped, also
/// when the renewal is cancelled, and only then wakes what waits for them.
struct Renewing<'a, B: Backend> {
    keeper: &'a Keeper<B>,
    ids: Vec<u64>,
    group: Option<u64>,
}

impl<B: Backend> Drop for Renewing<'_, B> {
    fn drop(&mut self) {
        let mut table = self.keeper.table();
        for id in &self.ids {
            if let Some(entry) = table.holds.get_mut(id) {
                entry.renewing = false;
            }
        }
        if let Some(group) = self.group {
            table.renewing_groups.remove(&group);
        }
        drop(table);
        self.keeper.renewal_ended.notify_waiters();
        self.keeper.wake();
    }
}

impl<B: Backend> Keeper<B> {
    /// Amends hold `id` on the server (an owner-checked write: a proclaim, a downgrade). A
    /// hold the server no longer gives us turns Lost, and the caller learns why.
    pub(super) async fn amend_hold(&self, id: u64, amendment: Amendment<'_>) -> Result<()> {
        let (hold, info, metrics) = {
            let table = self.table();
            let entry = table.holds.get(&id).ok_or_else(|| Error::NotHeld {
                name: String::new(),
                message: "the hold was already released".into(),
            })?;
            if let Some(err) = entry.lost_error() {
                return Err(err);
            }
            (
                Arc::clone(&entry.hold),
                Arc::clone(&entry.info),
                Arc::clone(&entry.metrics),
            )
        };
        let span = tracing::info_span!(
            "distlock.amend",
            amendment = amendment.label(),
            backend = self.capabilities.backend,
            lock = %info.name,
            fencing_token = info.fencing_token.0,
        );
        // An upgrade repeats its step whenever the name changes (subscribed before the
        // first step, so no change after it goes unseen), and at least every recheck.
        let mut feed = match amendment {
            Amendment::Upgrade => self.backend.changes(&info.name).await.ok(),
            _ => None,
        };
        let mut watch = info.watch();
        loop {
            let amended = self
                .deadline(amendment.label(), 1, self.backend.amend(&hold, amendment))
                .instrument(span.clone())
                .await?;
            match amended {
                Amended::Done => {
                    match amendment {
                        Amendment::Downgrade => metrics.became(&HoldKind::Read),
                        Amendment::Upgrade => metrics.became(&HoldKind::Write),
                        Amendment::Proclaim(_) => {}
                    }
                    return Ok(());
                }
                Amended::NotOwner(reason) => {
                    info.transition(LockState::Lost(reason));
                    return Err(Error::Lost {
                        name: info.name.to_string(),
                        reason,
                    });
                }
                Amended::Pending => {
                    let change = async {
                        match &mut feed {
                            Some(feed) => feed.next().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        reason = watch.lost() => {
                            return Err(Error::Lost { name: info.name.to_string(), reason });
                        }
                        _ = tokio::time::timeout(self.options.recheck, change) => {}
                    }
                }
            }
        }
    }
}

/// How the metrics count a renewal the backend answered with `outcome`.
fn renewal_counted(outcome: &RenewOutcome) -> Renewal {
    match outcome {
        RenewOutcome::Renewed { .. } => Renewal::Renewed,
        RenewOutcome::Lost(_) => Renewal::Lost,
        RenewOutcome::Undecided => Renewal::Failed,
    }
}
