//! [`EtcdBackend`]: opening a client (fails fast when etcd does not answer), its
//! capabilities, and the acquire / renew / release orchestration over the queue
//! ([`crate::queue`]), the hold protocol ([`crate::hold`]) and the session lease.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::KeyValue;
use lock_core::raw::{
    backend::{
        AcquireRequest, Acquired, Amended, Amendment, Backend, BackendRelease, ChangeFeed,
        RenewItem, RenewOutcome, SemaphoreResize, SessionStatus,
    },
    driver::Connect,
    plumbing::{Background, Backoff, Cleanup, CleanupOnDrop},
    url::LockUrl,
};
use lock_core::{
    Capabilities, Error, ErrorKind, FencingSource, FencingToken, LockName, LockOptions, LostReason,
    Occupancy, Participant, Result,
};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::config::EtcdConfig;
use crate::connection::{change_feed, EtcdClient};
use crate::error::{unexpected, BACKEND};
use crate::hold::{self, EtcdHold, HoldCheck};
use crate::layout::{broken_mark, entry_value, lock_prefix};
use crate::operator;
use crate::queue::{Place, Queue};
use crate::session::{KeepAlive, Session};
use crate::slots::{Slot, Slots};

/// The protocol half of an etcd lock client (see the crate docs).
pub struct EtcdBackend {
    client: EtcdClient,
    session: Arc<Session>,
    queue: Queue,
    holds: HoldCheck,
    prefix: String,
    label: String,
    slots: Arc<Slots>,
    /// The TTL of the client's lease.
    ttl: Duration,
    /// The shortest life of a broken hold's mark ([`EtcdConfig::mark_ttl`]).
    mark_ttl: Duration,
    /// The cleanups of abandoned acquires, which closing waits for.
    background: Background,
}

/// Opened with [`Error::InvalidConfig`] for a bad configuration or refused credentials;
/// [`Error::Connection`] (or [`Error::Unavailable`]) when no member answers within the
/// request timeout.
#[async_trait]
impl Connect for EtcdBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = EtcdConfig;

    fn config_from_url(url: &LockUrl) -> Result<EtcdConfig> {
        EtcdConfig::from_url(url)
    }

    fn validate(config: &EtcdConfig) -> Result<()> {
        config.validate()
    }

    fn lock_options(config: &EtcdConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: EtcdConfig) -> Result<EtcdBackend> {
        let client = EtcdClient::connect(&config).await?;
        let session = Arc::new(Session::new(client.clone(), config.options.ttl));
        Ok(EtcdBackend {
            queue: Queue {
                client: client.clone(),
                session: Arc::clone(&session),
                recheck: config.options.recheck,
            },
            client,
            session,
            holds: HoldCheck::default(),
            label: config.label(),
            prefix: config.prefix.clone(),
            slots: Arc::new(Slots::default()),
            ttl: config.options.ttl,
            mark_ttl: config.mark_ttl,
            background: Background::new(),
        })
    }
}

impl EtcdBackend {
    /// The key range of lock `name` (see [`EtcdConfig::lock_prefix`]).
    pub fn lock_prefix(&self, name: &LockName) -> String {
        lock_prefix(&self.prefix, name)
    }

    /// The id of the client's current lease, if it has a live one.
    pub fn lease_id(&self) -> Option<i64> {
        self.session.live_lease().map(|lease| lease.id)
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        // The client is gone: free its keys now rather than at the TTL.
        self.session.close();
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoint", &self.label)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// The key of an acquire in progress. If the acquire future is dropped, the key is
/// deleted in a background task (only if its create revision is ours, once known), and
/// only then is its slot free for another acquire of the same name in this client.
struct PendingKey {
    client: EtcdClient,
    /// The session, and the lease the key is attached to: once that lease is gone (revoked,
    /// expired and replaced), so is the key.
    session: Arc<Session>,
    lease: i64,
    key: String,
    revision: Option<i64>,
    /// Until when a put of the key sent by this acquire may still reach the server (its
    /// requests' deadlines); only meaningful while `revision` is unknown.
    put_until: Instant,
    slot: Slot,
}

/// Pauses between the deletes of a cancelled acquire's key whose put may be in flight.
const IN_FLIGHT_DELETES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_millis(1500),
];

impl Cleanup for PendingKey {
    async fn cleanup(self) {
        let mut result = self.delete_until_answered(self.revision).await;
        if self.revision.is_none() {
            // The put may still be on its way (dropped after it was sent, before its
            // answer), and land after the delete, attached to a lease that lives on.
            // Delete again a few times, the last once no put of ours can be applied
            // any more (its deadline passed).
            let mut at = Instant::now();
            for pause in IN_FLIGHT_DELETES {
                at += pause;
                if at >= self.put_until {
                    break;
                }
                sleep_until(at).await;
                // Only the last delete's outcome is reported.
                let _ = self.client.delete_if_ours(&self.key, None).await;
            }
            sleep_until(self.put_until).await;
            result = self.delete_until_answered(None).await;
        }
        if let Err(err) = result {
            tracing::warn!(key = self.key, error = %err, "removing the key of a cancelled acquire failed; the lease TTL ends it");
        }
        drop(self.slot);
    }
}

impl PendingKey {
    /// Deletes the key (only if its create revision is `revision`, when known), again with
    /// backoff while the delete fails in a retryable way, until a delete is answered, the
    /// lease it is attached to is gone (and the key with it), or [`CLEANUP_GIVE_UP`].
    async fn delete_until_answered(&self, revision: Option<i64>) -> Result<bool> {
        let give_up = Instant::now() + CLEANUP_GIVE_UP;
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let result = self.client.delete_if_ours(&self.key, revision).await;
            let pause = backoff.next_pause();
            let retry = matches!(&result, Err(err) if err.is_retryable())
                && self.session.holds_lease(self.lease)
                && Instant::now() + pause < give_up;
            if !retry {
                return result;
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// What the key of `request` stores ([`entry_value`]): a candidate's proposal (as the Go
/// client's `Election` stores it), a mutex's owner token (so that an inspection shows who
/// queues), a permit's, reader's or writer's kind and owner token.
fn stored_value(request: AcquireRequest<'_>) -> Result<Vec<u8>> {
    entry_value(request.kind, request.token.as_str())
        .ok_or_else(|| Error::unsupported(BACKEND, format!("holds of {}", request.kind.describe())))
}

/// Leaves the queue at once (a try that must wait, a conflict): deletes the pending key
/// (created at `revision`) now, so nobody sees it after the acquire returns. On failure
/// the pending guard, dropped, retries the delete in the background.
async fn leave(client: &EtcdClient, pending: CleanupOnDrop<PendingKey>, key: &str, revision: i64) {
    if client.delete_if_ours(key, Some(revision)).await.is_ok() {
        drop(pending.disarm());
    }
}

/// A cancelled acquire's delete that keeps failing is given up after this long; the
/// lease ends the key then, at the client's end at the latest.
const CLEANUP_GIVE_UP: Duration = Duration::from_secs(60);

/// What every client of this backend offers (known without a server).
pub const CAPABILITIES: Capabilities = Capabilities::new(BACKEND)
    .fair(true)
    .per_lock_ttl(false)
    .min_ttl(Duration::from_secs(1))
    .push_wakeup(true)
    .durable(true)
    .fencing(FencingSource::CreateRevision)
    .election(true)
    .semaphore(true)
    .semaphore_many(true)
    .semaphore_resize(true)
    .rwlock(true)
    .upgradeable(true);

#[async_trait]
impl Backend for EtcdBackend {
    type Hold = EtcdHold;

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<EtcdHold>>> {
        let prefix = self.lock_prefix(request.name);
        // Every kind queues alike; what differs is what the key stores, and which
        // entries ahead it is granted behind (see `crate::queue`).
        let value = stored_value(request)?;
        // A key of its own for each acquisition under way: it queues on the server at
        // once, in FIFO order with every other client's.
        let slot = self.slots.take(request.name);
        let lease = self.session.lease().await?;
        let key = slot.key(&prefix, lease.id, request.kind);
        let place = Place {
            name: request.name,
            prefix: &prefix,
            key: &key,
            kind: request.kind,
        };
        let mut pending = CleanupOnDrop::new(PendingKey {
            client: self.client.clone(),
            session: Arc::clone(&self.session),
            lease: lease.id,
            key: key.clone(),
            revision: None,
            // Enqueueing sends at most three puts, each within the request timeout.
            put_until: Instant::now() + self.client.request_timeout() * 3,
            slot,
        })
        .tracked_by(&self.background);
        let enqueued = self.queue.enqueue(&place, lease.id, &value).await?;
        let revision = enqueued.revision;
        pending.state_mut().revision = Some(revision);
        let ahead: Vec<&KeyValue> = enqueued.ahead.iter().collect();
        let granted = match self.queue.granted(&place, revision, None, &ahead).await {
            Ok(granted) => granted,
            Err(err) => {
                // A conflict: leave no key behind for anyone to see after the error.
                leave(&self.client, pending, &key, revision).await;
                return Err(err);
            }
        };
        if !granted {
            if !request.wait {
                // Like TryLock: leave the queue at once.
                leave(&self.client, pending, &key, revision).await;
                return Ok(None);
            }
            if let Err(err) = self.queue.wait_turn(&place, &enqueued, lease).await {
                if err.kind() == ErrorKind::Conflict {
                    leave(&self.client, pending, &key, revision).await;
                }
                return Err(match err {
                    Error::Lost { reason, .. } => Error::Lost {
                        name: request.name.to_string(),
                        reason,
                    },
                    other => other,
                });
            }
        }
        // The hold lives as long as the lease: measure it from the last keep-alive,
        // refreshed now if it is older than TTL/3.
        let lease = match self.session.lease_by_id(lease.id) {
            Some(now) if Instant::now() < now.refresh_due() => now,
            _ => match self.session.keep_alive(lease.id, lease.ttl / 3).await? {
                KeepAlive::Alive(now) => now,
                KeepAlive::Gone => {
                    return Err(Error::Lost {
                        name: request.name.to_string(),
                        reason: LostReason::SessionExpired,
                    })
                }
            },
        };
        let fencing = u64::try_from(revision)
            .map_err(|_| unexpected("acquire", format!("create revision {revision}")))?;
        let slot = pending.disarm().slot;
        Ok(Some(Acquired {
            hold: EtcdHold {
                mark: broken_mark(&self.prefix, &key),
                key,
                revision,
                lease: lease.id,
                owner: request.token.as_str().to_owned(),
                kind: Mutex::new(request.kind.clone()),
                slot: Mutex::new(Some(slot)),
            },
            fencing_token: FencingToken(fencing),
            requested_at: lease.fresh_at,
            lease: lease.ttl,
            session: lease.epoch,
        }))
    }

    async fn renew(&self, items: &[RenewItem<'_, EtcdHold>]) -> Result<Vec<RenewOutcome>> {
        let started = Instant::now();
        let current = self.session.live_lease();
        let mut outcomes = vec![RenewOutcome::Lost(LostReason::SessionExpired); items.len()];
        let live: Vec<(usize, &EtcdHold)> = items
            .iter()
            .enumerate()
            .filter(|(_, item)| current.is_some_and(|lease| lease.id == item.hold.lease))
            .map(|(i, item)| (i, item.hold))
            .collect();
        for item in items {
            if current.is_none_or(|lease| lease.id != item.hold.lease) {
                item.hold.free_slot();
            }
        }
        let Some(current) = current.filter(|_| !live.is_empty()) else {
            return Ok(outcomes);
        };
        // Two requests whatever the number of holds: one keep-alive for the client's
        // lease (shared with concurrent users; a lease time-to-live query does not renew
        // it), and one list of the keys still attached to the lease, since a keep-alive
        // success alone proves nothing about keys deleted behind our back.
        let holds: Vec<&EtcdHold> = live.iter().map(|(_, hold)| *hold).collect();
        let (kept, checked) = futures::join!(
            self.session.keep_alive(current.id, current.ttl / 6),
            self.holds.check(&self.client, current.id, &holds)
        );
        let (lease, verdicts) = match (kept, checked) {
            (_, Ok(None)) => {
                // The server does not know the lease (expired, or revoked behind our
                // back): every hold on it is lost, whatever the keep-alive got.
                self.session.expire(current.id);
                for (_, hold) in &live {
                    hold.free_slot();
                }
                return Ok(outcomes);
            }
            (Ok(KeepAlive::Gone), _) => {
                for (_, hold) in &live {
                    hold.free_slot();
                }
                return Ok(outcomes);
            }
            (Err(err), _) | (_, Err(err)) => return Err(err),
            (Ok(KeepAlive::Alive(lease)), Ok(Some(verdicts))) => (lease, verdicts),
        };
        let remaining = lease
            .valid_until()
            .saturating_duration_since(started)
            .min(lease.ttl);
        for ((i, hold), lost) in live.iter().zip(verdicts) {
            outcomes[*i] = match lost {
                None => RenewOutcome::Renewed { lease: remaining },
                Some(reason) => {
                    hold.free_slot();
                    RenewOutcome::Lost(reason)
                }
            };
        }
        Ok(outcomes)
    }

    async fn release(&self, hold: &EtcdHold) -> Result<BackendRelease> {
        let released = hold::release(&self.client, hold).await;
        hold.free_slot();
        released
    }

    /// The keys of the name's range in create revision order, and a token floor (see
    /// *Operating* in the crate docs). No participant shows a `since`: etcd keeps no time.
    async fn inspect(&self, name: &LockName) -> Result<Occupancy> {
        operator::inspect(&self.client, &self.lock_prefix(name)).await
    }

    /// The names with a queue key under the prefix, from keys-only range reads (see
    /// *Operating* in the crate docs).
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        operator::list(&self.client, &self.prefix, prefix).await
    }

    /// Deletes the holder's key and leaves a mark for its renewal (see *Operating* in
    /// the crate docs).
    async fn force_release(&self, name: &LockName) -> Result<Option<Participant>> {
        operator::force_release(
            &self.client,
            &self.prefix,
            &self.lock_prefix(name),
            self.ttl,
            self.mark_ttl,
        )
        .await
    }

    /// Rewrites every entry's value with the new number, in one transaction that holds only
    /// if the range is as read (see *Semaphores* in the crate docs).
    async fn resize_semaphore(&self, name: &LockName, resize: &SemaphoreResize<'_>) -> Result<()> {
        operator::resize(&self.client, name, &self.lock_prefix(name), resize).await
    }

    /// Puts the value on the candidate's key if its create revision is still the hold's
    /// (the Go client's `Election.Proclaim`; see *Leader election* in the crate docs), or
    /// rewrites a writer's entry into a reader's in place, or takes an upgrade step (see
    /// *Read-write locks*).
    async fn amend(&self, hold: &EtcdHold, amendment: Amendment<'_>) -> Result<Amended> {
        match amendment {
            Amendment::Proclaim(value) => hold::proclaim(&self.client, hold, value).await,
            Amendment::Downgrade => hold::downgrade(&self.client, hold).await,
            Amendment::Upgrade => hold::upgrade(&self.client, hold).await,
            other => Err(other.unsupported(self.capabilities().backend)),
        }
    }

    /// A watch of the name's key range: every put (a campaign, a proclaim) and delete (a
    /// resign, a release, an expiry) fires the feed. It is in place when this returns, and
    /// dropping the feed cancels it.
    async fn changes(&self, name: &LockName) -> Result<ChangeFeed> {
        let prefix = self.lock_prefix(name);
        let stream = self.client.watch_range(&prefix).await?;
        Ok(ChangeFeed::from_stream(change_feed(
            self.client.clone(),
            prefix,
            stream,
        )))
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.session.subscribe())
    }

    /// Waits (at most the request timeout) for the cleanups of abandoned acquires, then
    /// revokes the client's lease: every key attached to it goes at once.
    async fn close(&self) -> Result<()> {
        self.background.settle(self.client.request_timeout()).await;
        self.session.close_now().await
    }
}
