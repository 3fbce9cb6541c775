//! The session: ONE etcd lease per client, shared by every key the client holds or
//! queues, so keeping locks alive costs one keep-alive per interval however many there
//! are.
//!
//! The lease is granted on first use and kept alive on demand, over one keep-alive
//! stream: by the renewal of held locks (the core's watchdog, at TTL/3), by waiters
//! while they queue, and by an acquire that finds it stale. Nobody keeps it alive when
//! nothing needs it, so an idle client's lease simply expires; the next acquire then
//! grants a new one, which starts a new *epoch* (see [`SessionStatus`]): every hold of
//! an older epoch is lost.
//!
//! Time is measured on the monotonic clock from *before* each keep-alive (or grant) is
//! sent: the server keeps the lease at least `TTL` from when it processes the request,
//! which is later.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use lock_core::raw::{
    backend::{SessionHealth, SessionStatus},
    plumbing::lock_unpoisoned,
};
use lock_core::{Error, Result};
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};

use crate::connection::{EtcdClient, KeepAliveError};
use crate::error::{unexpected, BACKEND};

/// One granted lease as the client knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// etcd's lease id.
    pub(crate) id: i64,
    /// The session epoch this lease is (1 for the first lease of a client).
    pub(crate) epoch: u64,
    /// The TTL the server granted.
    pub(crate) ttl: Duration,
    /// When the last successful grant or keep-alive was sent.
    pub(crate) fresh_at: Instant,
}

impl Lease {
    /// Until when the lease is guaranteed, with the drift margin taken off.
    pub(crate) fn valid_until(&self) -> Instant {
        lock_core::raw::backend::validity_deadline(self.fresh_at, self.ttl)
    }

    /// When a keep-alive is due so holders keep two thirds of the TTL in hand.
    pub(crate) fn refresh_due(&self) -> Instant {
        self.fresh_at + self.ttl / 3
    }
}

struct KeepAliveChannel {
    id: i64,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

/// What one keep-alive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepAlive {
    /// The lease lives; the state after the keep-alive.
    Alive(Lease),
    /// The lease is gone on the server (expired or revoked), or was replaced.
    Gone,
}

/// The client's lease and its keep-alive stream.
pub(crate) struct Session {
    client: EtcdClient,
    ttl_secs: i64,
    current: Mutex<Option<Lease>>,
    /// The latest epoch handed out (also of expired leases).
    epoch: Mutex<u64>,
    /// Serializes grants, so concurrent acquires share one new lease.
    granting: tokio::sync::Mutex<()>,
    /// The keep-alive stream; one keep-alive in flight at a time.
    channel: tokio::sync::Mutex<Option<KeepAliveChannel>>,
    status: watch::Sender<SessionStatus>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("ttl_secs", &self.ttl_secs)
            .field("current", &*self.current())
            .finish_non_exhaustive()
    }
}

/// Whole seconds of `ttl`, rounded up, at least 1.
pub(crate) fn ttl_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

impl Session {
    pub(crate) fn new(client: EtcdClient, ttl: Duration) -> Self {
        Session {
            client,
            ttl_secs: ttl_seconds(ttl),
            current: Mutex::new(None),
            epoch: Mutex::new(0),
            granting: tokio::sync::Mutex::new(()),
            channel: tokio::sync::Mutex::new(None),
            status: watch::Sender::new(SessionStatus {
                epoch: 0,
                health: SessionHealth::Connected,
            }),
        }
    }

    fn current(&self) -> MutexGuard<'_, Option<Lease>> {
        lock_unpoisoned(&self.current)
    }

    /// The current lease if the client still believes it alive.
    pub(crate) fn live_lease(&self) -> Option<Lease> {
        let lease = (*self.current())?;
        (Instant::now() < lease.valid_until()).then_some(lease)
    }

    /// Whether lease `id` is the session's current lease: neither revoked by the client
    /// nor replaced after it ran out.
    pub(crate) fn holds_lease(&self, id: i64) -> bool {
        self.current().is_some_and(|lease| lease.id == id)
    }

    /// The lease `id` if it is still the current, live one.
    pub(crate) fn lease_by_id(&self, id: i64) -> Option<Lease> {
        self.live_lease().filter(|lease| lease.id == id)
    }

    /// Session health for the core's state machine.
    pub(crate) fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        self.status.subscribe()
    }

    fn publish(&self, epoch: u64, health: SessionHealth) {
        self.status.send_if_modified(|status| {
            // Never step back to an older epoch.
            if epoch < status.epoch || (status.epoch == epoch && status.health == health) {
                return false;
            }
            *status = SessionStatus { epoch, health };
            true
        });
    }

    /// A lease fit for a new key: the current one, kept alive first if its last
    /// keep-alive is older than TTL/3; a new one (new epoch) if it is gone or stale.
    pub(crate) async fn lease(self: &Arc<Self>) -> Result<Lease> {
        if let Some(lease) = self.live_lease() {
            if Instant::now() < lease.refresh_due() {
                return Ok(lease);
            }
            if let KeepAlive::Alive(lease) = self.keep_alive(lease.id, lease.ttl / 3).await? {
                return Ok(lease);
            }
        }
        self.grant().await
    }

    /// Keeps lease `id` alive unless that was done less than `max_age` ago (concurrent
    /// users share one keep-alive). [`KeepAlive::Gone`] if the lease is gone on the
    /// server, past its deadline, or no longer the current one.
    ///
    /// # Errors
    /// When the keep-alive got no answer in time or failed (the session is then
    /// reported `Suspended`).
    pub(crate) async fn keep_alive(&self, id: i64, max_age: Duration) -> Result<KeepAlive> {
        let mut channel = self.channel.lock().await;
        let Some(lease) = self.lease_by_id(id) else {
            return Ok(KeepAlive::Gone);
        };
        if lease.fresh_at.elapsed() < max_age {
            return Ok(KeepAlive::Alive(lease));
        }
        let sent_at = Instant::now();
        let deadline = sent_at + self.client.request_timeout();
        let ttl = match self.keep_alive_round(&mut channel, lease, deadline).await {
            Ok(Some(ttl)) => ttl,
            Ok(None) => {
                *channel = None;
                self.expire(id);
                return Ok(KeepAlive::Gone);
            }
            Err(err) => {
                *channel = None;
                self.publish(lease.epoch, SessionHealth::Suspended);
                return Err(err);
            }
        };
        let mut current = self.current();
        match current.as_mut() {
            Some(state) if state.id == id => {
                state.fresh_at = sent_at;
                state.ttl = ttl;
                let lease = *state;
                drop(current);
                self.publish(lease.epoch, SessionHealth::Connected);
                Ok(KeepAlive::Alive(lease))
            }
            _ => Ok(KeepAlive::Gone),
        }
    }

    /// One keep-alive: on the open stream, or on a new one (which may go to another
    /// member) if there is none or it broke. `None` when the lease is gone.
    async fn keep_alive_round(
        &self,
        channel: &mut Option<KeepAliveChannel>,
        lease: Lease,
        deadline: Instant,
    ) -> Result<Option<Duration>> {
        const WHAT: &str = "keeping the session lease alive";
        // The stream is taken out while a keep-alive is in flight: if this future is
        // dropped midway, the stream goes with it, so a late answer can never be taken
        // for the answer to a later keep-alive (which would overstate the lease).
        if let Some(mut open) = channel.take().filter(|c| c.id == lease.id) {
            match timeout_at(deadline, stream_round(&mut open, lease.id)).await {
                Ok(Ok(answer)) => {
                    *channel = Some(open);
                    return Ok(answer);
                }
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "keep-alive stream broke; reopening it");
                }
                Err(_) => {
                    return Err(Error::no_answer(
                        BACKEND,
                        WHAT,
                        self.client.request_timeout(),
                    ))
                }
            }
        }
        // Opening a stream sends the first keep-alive and waits for its answer, which
        // renews the lease to the TTL it was granted with.
        match self.client.open_keep_alive(lease.id).await {
            Ok((keeper, stream)) => {
                *channel = Some(KeepAliveChannel {
                    id: lease.id,
                    keeper,
                    stream,
                });
                Ok(Some(lease.ttl))
            }
            Err(KeepAliveError::LeaseNotFound) => Ok(None),
            Err(KeepAliveError::Failed(err)) => Err(err),
        }
    }

    /// Marks lease `id` gone: its epoch is reported expired.
    pub(crate) fn expire(&self, id: i64) {
        let mut current = self.current();
        if let Some(lease) = current.filter(|lease| lease.id == id) {
            *current = None;
            drop(current);
            self.publish(lease.epoch, SessionHealth::Expired);
        }
    }

    /// Grants a new lease (a new epoch) unless a concurrent caller just did. The grant
    /// runs in its own task, so a caller that gives up midway (a cancelled acquire)
    /// leaves no unknown lease behind: the lease is kept for the next acquire.
    async fn grant(self: &Arc<Self>) -> Result<Lease> {
        let session = Arc::clone(self);
        tokio::spawn(async move { session.grant_now().await })
            .await
            .map_err(|err| Error::Protocol {
                backend: BACKEND,
                message: "granting the session lease: task failed".into(),
                source: Some(Box::new(err)),
            })?
    }

    async fn grant_now(&self) -> Result<Lease> {
        let _granting = self.granting.lock().await;
        if let Some(lease) = self.live_lease() {
            if Instant::now() < lease.refresh_due() {
                return Ok(lease);
            }
        }
        let sent_at = Instant::now();
        let (id, ttl) = self
            .client
            .lease_grant("granting the session lease", self.ttl_secs)
            .await?;
        let Some(ttl) = granted(ttl) else {
            return Err(unexpected(
                "granting the session lease",
                format!("granted TTL {ttl}"),
            ));
        };
        let epoch = {
            let mut epoch = lock_unpoisoned(&self.epoch);
            *epoch += 1;
            *epoch
        };
        let lease = Lease {
            id,
            epoch,
            ttl,
            fresh_at: sent_at,
        };
        let old = self.current().replace(lease);
        self.publish(epoch, SessionHealth::Connected);
        if let Some(old) = old {
            // Past its deadline: whatever is left on it belongs to lost holds.
            self.revoke_in_background(old.id);
        }
        tracing::debug!(
            lease = format_args!("{id:x}"),
            epoch,
            "etcd session lease granted"
        );
        Ok(lease)
    }

    /// Revokes lease `id` in a background task, best effort (the TTL is the fallback).
    pub(crate) fn revoke_in_background(&self, id: i64) {
        self.client
            .revoke_in_background("revoking the session lease", id);
    }

    /// Ends the session now: revokes the current lease and waits for the answer (each
    /// request within the request timeout), so that every key attached to it is gone.
    pub(crate) async fn close_now(&self) -> Result<()> {
        let lease = self.current().take();
        let Some(lease) = lease else {
            return Ok(());
        };
        self.publish(lease.epoch, SessionHealth::Expired);
        self.client
            .lease_revoke("revoking the session lease", lease.id)
            .await
    }

    /// Ends the session: revokes the current lease in the background.
    pub(crate) fn close(&self) {
        let lease = self.current().take();
        if let Some(lease) = lease {
            self.revoke_in_background(lease.id);
            self.publish(lease.epoch, SessionHealth::Expired);
        }
    }
}

/// One keep-alive on an open stream; `None` when the server says the lease is gone.
async fn stream_round(
    open: &mut KeepAliveChannel,
    id: i64,
) -> std::result::Result<Option<Duration>, etcd_client::Error> {
    open.keeper.keep_alive().await?;
    match open.stream.message().await? {
        Some(answer) if answer.id() == id => Ok(granted(answer.ttl())),
        Some(answer) => Err(etcd_client::Error::LeaseKeepAliveError(format!(
            "keep-alive answered for lease {:x}",
            answer.id()
        ))),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "keep-alive stream closed".into(),
        )),
    }
}

/// A granted TTL in seconds as a duration; `None` for 0 or less (lease gone).
fn granted(ttl_secs: i64) -> Option<Duration> {
    u64::try_from(ttl_secs)
        .ok()
        .filter(|secs| *secs > 0)
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn granted_ttl_zero_means_gone() {
        assert_eq!(granted(0), None);
        assert_eq!(granted(-1), None);
        assert_eq!(granted(5), Some(Duration::from_secs(5)));
    }
}
