//! The connection to etcd: every request goes through [`EtcdClient`], which puts the
//! request timeout on it, fails over between members and maps errors into
//! [`lock_core::Error`]; watches of deletes wake waiters up, and watches of a name's
//! range feed its observers ([`change_feed`]). The client's lease and its
//! keep-alive are the session (`session.rs`), its TLS options come from `tls.rs`.

use std::future::Future;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, GetResponse, KeyValue,
    LeaseKeepAliveStream, LeaseKeeper, LeaseTimeToLiveOptions, LeaseTimeToLiveResponse, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use futures::stream::{BoxStream, StreamExt};
use lock_core::raw::plumbing::Backoff;
use lock_core::{Error, Result};
use tokio::sync::OnceCell;
use tokio::time::{timeout_at, Instant};

use crate::config::EtcdConfig;
use crate::error::{
    from_client, is_lease_not_found, is_too_large, is_transport, no_leader, not_applied,
    unexpected, BACKEND,
};

/// A cheap-to-clone handle on the etcd connection, with a deadline on every call and
/// failover between members.
///
/// Each member gets its own connection, made on first use; requests go to one member
/// (the *pinned* one) until it fails to answer, then to the next. A request that was
/// certainly not applied (the connection could not be made, or the member has no
/// leader) is retried on the next member within the same deadline; any other failure is
/// returned, and only later requests go elsewhere. (etcd-client's own balancing keeps
/// sending a share of the requests to a dead member, which fails them.)
#[derive(Clone)]
pub(crate) struct EtcdClient {
    members: Arc<Members>,
    timeout: Duration,
}

struct Members {
    endpoints: Vec<String>,
    connections: Vec<OnceCell<Client>>,
    options: ConnectOptions,
    pinned: AtomicUsize,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClient")
            .field("endpoints", &self.members.endpoints)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdClient {
    /// Prepares connections as `config` says and connects to the first member that
    /// answers (see [`EtcdClient::check_reachable`]).
    pub(crate) async fn connect(config: &EtcdConfig) -> Result<Self> {
        let limit = config.options.request_timeout;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(limit)
            .with_keep_alive(Duration::from_secs(10), limit)
            .with_require_leader(true);
        if let Some(user) = &config.username {
            options = options
                .with_user(user.clone(), config.password.clone().unwrap_or_default())
                .with_auto_token_refresh(true);
        }
        if config.tls {
            options = options.with_tls(crate::tls::tls_options(config).await?);
        }
        let endpoints = config.endpoint_urls();
        let client = EtcdClient {
            members: Arc::new(Members {
                connections: endpoints.iter().map(|_| OnceCell::new()).collect(),
                endpoints,
                options,
                pinned: AtomicUsize::new(0),
            }),
            timeout: limit,
        };
        client.check_reachable().await?;
        Ok(client)
    }

    /// Fails fast, within one request timeout, unless a member answers: one status
    /// request (which needs no permission), after authenticating there when the
    /// configuration has credentials (a wrong password is then a configuration error).
    /// A member that answers it has no leader counts as reachable: an election may be
    /// running, and requests ride it out.
    async fn check_reachable(&self) -> Result<()> {
        self.call("connecting", |client| async move {
            match client.maintenance_client().status().await {
                Err(err) if no_leader(&err) => Ok(()),
                answered => answered.map(drop),
            }
        })
        .await
    }

    /// The request timeout.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// The connection to member `index`, made on first use.
    async fn member(&self, index: usize) -> std::result::Result<Client, etcd_client::Error> {
        let members = &self.members;
        let cell = members
            .connections
            .get(index)
            .ok_or_else(|| etcd_client::Error::InvalidArgs("no such member".into()))?;
        cell.get_or_try_init(|| {
            Client::connect(
                [members.endpoints[index].as_str()],
                Some(members.options.clone()),
            )
        })
        .await
        .cloned()
    }

    /// Moves the pin off member `index` (if it is still pinned).
    fn failed(&self, index: usize) {
        let next = (index + 1) % self.members.endpoints.len().max(1);
        let _ =
            self.members
                .pinned
                .compare_exchange(index, next, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Runs one request (built by `request` on a member's connection) under the request
    /// timeout, failing over as described on [`EtcdClient`].
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, mut request: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let members = self.members.endpoints.len();
        let mut last = None;
        for _ in 0..members.max(1) {
            let index = self.members.pinned.load(Ordering::SeqCst) % members.max(1);
            let attempt = async {
                let client = self.member(index).await?;
                request(client).await
            };
            match timeout_at(deadline, attempt).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) if not_applied(&err) => {
                    tracing::debug!(member = %self.members.endpoints[index], error = %err, "{what}: failing over");
                    self.failed(index);
                    // Report "no leader" (the cluster is unavailable) over "cannot
                    // connect" (this member is down) when members disagree.
                    if last.as_ref().is_none_or(|last| !no_leader(last)) {
                        last = Some(err);
                    }
                }
                Ok(Err(err)) => {
                    if is_transport(&err) {
                        self.failed(index);
                    }
                    return Err(from_client(what, err));
                }
                Err(_) => {
                    self.failed(index);
                    return Err(Error::no_answer(BACKEND, what, self.timeout));
                }
            }
        }
        Err(match last {
            Some(err) => from_client(what, err),
            None => Error::no_answer(BACKEND, what, self.timeout),
        })
    }

    /// One transaction.
    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |client| {
            let txn = txn.clone();
            async move { client.kv_client().txn(txn).await }
        })
        .await
    }

    /// One range read (`options` give the range end, limit, revision…) from `key`.
    /// Deletes `key`, only if its create revision is `revision` when one is given; whether
    /// it did.
    pub(crate) async fn delete_if_ours(&self, key: &str, revision: Option<i64>) -> Result<bool> {
        let compares = revision
            .map(|revision| vec![Compare::create_revision(key, CompareOp::Equal, revision)])
            .unwrap_or_default();
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::delete(key, None)]);
        let response = self.txn("release", txn).await?;
        if !response.succeeded() {
            return Ok(false);
        }
        Ok(response.op_responses().iter().any(|op| match op {
            TxnOpResponse::Delete(delete) => delete.deleted() > 0,
            _ => false,
        }))
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: &[u8],
        options: GetOptions,
    ) -> Result<GetResponse> {
        self.call(what, |client| {
            let options = options.clone();
            async move { client.kv_client().get(key, Some(options)).await }
        })
        .await
    }

    /// Grants a lease of `ttl_secs` (for `what`: the session lease, a mark); returns its
    /// id and granted TTL in seconds.
    pub(crate) async fn lease_grant(&self, what: &str, ttl_secs: i64) -> Result<(i64, i64)> {
        let response = self
            .call(what, |client| async move {
                client.lease_client().grant(ttl_secs, None).await
            })
            .await?;
        Ok((response.id(), response.ttl()))
    }

    /// Revokes lease `id` (deleting every key attached to it), for `what`.
    pub(crate) async fn lease_revoke(&self, what: &str, id: i64) -> Result<()> {
        self.call(what, |client| async move {
            client.lease_client().revoke(id).await
        })
        .await
        .map(drop)
    }

    /// Revokes lease `id` (for `what`) in a background task, best effort (the TTL is the
    /// fallback).
    pub(crate) fn revoke_in_background(&self, what: &'static str, id: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.clone();
        runtime.spawn(async move {
            if let Err(err) = client.lease_revoke(what, id).await {
                tracing::debug!(lease = format_args!("{id:x}"), error = %err, "revoking an etcd lease failed; its TTL ends it");
            }
        });
    }

    /// The keys attached to lease `id`: one `LeaseTimeToLive` request with `keys`, answered
    /// by the leader (a follower forwards it), whatever the number of keys. It does not
    /// renew the lease.
    pub(crate) async fn lease_keys(&self, id: i64) -> Result<LeaseKeys> {
        self.call(
            "listing the keys of the session lease",
            |client| async move {
                let options = LeaseTimeToLiveOptions::new().with_keys();
                match client.lease_client().time_to_live(id, Some(options)).await {
                    // etcd answers TTL -1 for a lease it does not know (older versions
                    // answered "lease not found").
                    Ok(answer) if answer.ttl() < 0 => Ok(LeaseKeys::Gone),
                    Ok(answer) => Ok(LeaseKeys::Attached(answer)),
                    Err(err) if is_lease_not_found(&err) => Ok(LeaseKeys::Gone),
                    Err(err) if is_too_large(&err) => Ok(LeaseKeys::TooLarge),
                    Err(err) => Err(err),
                }
            },
        )
        .await
    }

    /// How long lease `id` has left and was granted, in whole seconds as etcd counts
    /// them (`None`: the lease does not exist). One `LeaseTimeToLive` request without
    /// keys; it does not renew the lease.
    pub(crate) async fn lease_ttl(&self, id: i64) -> Result<Option<LeaseTtl>> {
        self.call("reading a lease's time to live", |client| async move {
            match client.lease_client().time_to_live(id, None).await {
                Ok(answer) => Ok(u64::try_from(answer.ttl()).ok().map(|left| LeaseTtl {
                    left: Duration::from_secs(left),
                    granted: Duration::from_secs(u64::try_from(answer.granted_ttl()).unwrap_or(0)),
                })),
                Err(err) if is_lease_not_found(&err) => Ok(None),
                Err(err) => Err(err),
            }
        })
        .await
    }

    /// Opens a keep-alive stream for lease `id`; this sends the first keep-alive and
    /// waits for its answer (which renews the lease).
    pub(crate) async fn open_keep_alive(
        &self,
        id: i64,
    ) -> std::result::Result<(LeaseKeeper, LeaseKeepAliveStream), KeepAliveError> {
        let opened = self
            .call("keeping the session lease alive", |client| async move {
                match client.lease_client().keep_alive(id).await {
                    Err(err) if is_lease_not_found(&err) => Ok(None),
                    other => other.map(Some),
                }
            })
            .await;
        match opened {
            Ok(Some(stream)) => Ok(stream),
            Ok(None) => Err(KeepAliveError::LeaseNotFound),
            Err(err) => Err(KeepAliveError::Failed(err)),
        }
    }

    /// Watches deletions of `key` from now on, and waits until etcd has created the
    /// watch (see [`DeleteWatch`]).
    ///
    /// No start revision is given on purpose: a watch starting in the past (any write
    /// since) lands in etcd's *unsynced* group, which etcd catches up only every 100 ms,
    /// so its events come up to 100 ms late. etcd starts a watch without a start
    /// revision at its current revision + 1 and answers the creation with that current
    /// revision (the start), which the caller compares with its own read.
    ///
    /// Even so, a write that etcd commits between reading its current revision and
    /// registering the watcher makes that watcher unsynced too (about 1 % of creations
    /// under a steady write load). So [`DELETE_WATCHERS`] watchers of the same key are
    /// created on the one stream, one after the other: each has its own small chance,
    /// and the first delete from any of them counts.
    ///
    /// With `puts`, a put of the key ends the wait as well (a writer ahead of a reader
    /// downgrading to read), and the stream carries puts too. The deletes of the keys
    /// `also` come on the same stream, one watcher each, created after the key's (the
    /// start is the key's watchers'), each from its start revision when it has one (not
    /// 0): such a watcher misses nothing since then, though it may start unsynced.
    pub(crate) async fn watch_delete(
        &self,
        key: &[u8],
        puts: bool,
        also: &[(&[u8], i64)],
    ) -> Result<DeleteWatch> {
        const WHAT: &str = "watching the predecessor";
        let deletes = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let options = if puts {
            WatchOptions::new()
        } else {
            deletes.clone()
        };
        self.call(WHAT, |client| {
            let (options, deletes) = (options.clone(), deletes.clone());
            async move {
                // etcd-client's `watch` sends the create request and returns with the
                // stream before etcd has necessarily registered the watcher: wait for
                // the creation answers (etcd sends each before any event of its watcher,
                // and answers the creations of one stream in order).
                let mut stream = client
                    .watch_client()
                    .watch(key.to_vec(), Some(options.clone()))
                    .await?;
                for _ in 1..DELETE_WATCHERS {
                    stream.watch(key.to_vec(), Some(options.clone())).await?;
                }
                for &(other, from) in also {
                    let options = deletes.clone().with_start_revision(from);
                    stream.watch(other.to_vec(), Some(options)).await?;
                }
                let refused = |why: String| etcd_client::Error::WatchError(why);
                let mut start = None;
                let mut created = 0;
                while created < DELETE_WATCHERS + also.len() {
                    let answer = stream
                        .message()
                        .await?
                        .ok_or_else(|| refused("the watch ended before it was created".into()))?;
                    if answer.created() {
                        if answer.canceled() {
                            return Err(refused(format!(
                                "the watch was refused ({})",
                                answer.cancel_reason()
                            )));
                        }
                        created += 1;
                        if created > DELETE_WATCHERS {
                            continue;
                        }
                        // Without a header the start is unknown: the caller's read covers
                        // it all.
                        let at = answer
                            .header()
                            .map(etcd_client::ResponseHeader::revision)
                            .filter(|&revision| revision > 0)
                            .unwrap_or(i64::MAX);
                        start = Some(start.map_or(at, |start: i64| start.min(at)));
                    } else if ends_wait(&answer, puts) {
                        // The first watcher saw the delete before the next was created.
                        return Ok(DeleteWatch::Ended);
                    }
                }
                Ok(DeleteWatch::Watching {
                    stream: Box::new(stream),
                    start: start.unwrap_or(i64::MAX),
                })
            }
        })
        .await
    }
}

impl EtcdClient {
    /// Watches every put and delete of the keys starting with `prefix` (a name's range)
    /// from now on, and waits until etcd has created the watch: a write applied after this
    /// returns comes on the stream (up to 100 ms late if the watcher started unsynced, see
    /// [`EtcdClient::watch_delete`]). Dropping the stream ends the gRPC stream, and etcd
    /// cancels its watcher with it.
    pub(crate) async fn watch_range(&self, prefix: &str) -> Result<Box<WatchStream>> {
        const WHAT: &str = "watching a name's changes";
        let options = WatchOptions::new().with_prefix();
        self.call(WHAT, |client| {
            let options = options.clone();
            async move {
                let mut stream = client.watch_client().watch(prefix, Some(options)).await?;
                let refused = |why: String| etcd_client::Error::WatchError(why);
                // etcd answers the creation before any event of the watcher; events
                // cannot come first.
                let answer = stream
                    .message()
                    .await?
                    .ok_or_else(|| refused("the watch ended before it was created".into()))?;
                if !answer.created() || answer.canceled() {
                    return Err(refused(format!(
                        "the watch was not created ({})",
                        answer.cancel_reason()
                    )));
                }
                Ok(Box::new(stream))
            }
        })
        .await
    }
}

/// How many times in a row a change feed tries to watch again after its watch broke
/// before it ends (its readers then re-read on their own timer, and subscribe again
/// after a failed read).
const REWATCH_TRIES: usize = 8;

/// A change feed of the key range `prefix` on `stream` (made by
/// [`EtcdClient::watch_range`]): it fires on every answer carrying events, once when the
/// watch breaks (a change may have been missed), and once more when a new watch is in
/// place (changes in between are not on it). Dropping it drops the watch.
pub(crate) fn change_feed(
    client: EtcdClient,
    prefix: String,
    stream: Box<WatchStream>,
) -> BoxStream<'static, ()> {
    let feed = Feed {
        client,
        prefix,
        stream: Some(stream),
    };
    futures::stream::unfold(feed, |mut feed| async move {
        feed.next().await.map(|()| ((), feed))
    })
    .boxed()
}

/// The state of a [`change_feed`].
struct Feed {
    client: EtcdClient,
    prefix: String,
    /// The watch, `None` once it broke.
    stream: Option<Box<WatchStream>>,
}

impl Feed {
    /// The next firing; `None` when the watch broke and could not be made again.
    async fn next(&mut self) -> Option<()> {
        if let Some(stream) = self.stream.as_mut() {
            // Each turn awaits an answer from the server.
            loop {
                match stream.message().await {
                    Ok(Some(answer)) if watch_ended(&answer) => {
                        tracing::debug!(
                            prefix = self.prefix,
                            reason = answer.cancel_reason(),
                            "the change watch was cancelled"
                        );
                        break;
                    }
                    Ok(Some(answer)) if !answer.events().is_empty() => return Some(()),
                    // Progress notes and the like: nothing changed.
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(err) => {
                        tracing::debug!(prefix = self.prefix, error = %err, "the change watch broke");
                        break;
                    }
                }
            }
            self.stream = None;
            return Some(());
        }
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for _ in 0..REWATCH_TRIES {
            tokio::time::sleep(backoff.next_pause()).await;
            match self.client.watch_range(&self.prefix).await {
                Ok(stream) => {
                    self.stream = Some(stream);
                    return Some(());
                }
                Err(err) => {
                    tracing::debug!(prefix = self.prefix, error = %err, "watching a name's changes again failed");
                }
            }
        }
        None
    }
}

/// How many watchers [`EtcdClient::watch_delete`] puts on one predecessor.
const DELETE_WATCHERS: usize = 2;

/// A watch of the deletes of one key.
#[derive(Debug)]
pub(crate) enum DeleteWatch {
    /// Every delete of the key at a revision above `start` comes on `stream`.
    Watching {
        stream: Box<WatchStream>,
        start: i64,
    },
    /// The key was deleted (or the watch broke) while the watch was being set up.
    Ended,
}

/// True when a watch answer ends a wait on a delete: a delete (or, with `puts`, any
/// write), or the watcher is gone (cancelled, or behind a compaction).
pub(crate) fn ends_wait(answer: &WatchResponse, puts: bool) -> bool {
    watch_ended(answer)
        || answer
            .events()
            .iter()
            .any(|event| puts || event.event_type() == EventType::Delete)
}

/// Whether `answer` ends a watch (cancelled, or behind a compaction): a change may have
/// been missed.
pub(crate) fn watch_ended(answer: &WatchResponse) -> bool {
    answer.canceled() || answer.compact_revision() != 0
}

/// A lease's time to live, as etcd counts it (whole seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseTtl {
    /// What it has left.
    pub(crate) left: Duration,
    /// What it was granted (and each keep-alive renews it to).
    pub(crate) granted: Duration,
}

/// What a query of the keys attached to a lease found.
#[derive(Debug)]
pub(crate) enum LeaseKeys {
    /// The lease lives; the answer lists the keys attached to it.
    Attached(LeaseTimeToLiveResponse),
    /// The lease does not exist (expired or revoked).
    Gone,
    /// The answer is larger than the client accepts (gRPC's 4 MiB default): too many keys.
    TooLarge,
}

/// Why a keep-alive stream could not be opened.
#[derive(Debug)]
pub(crate) enum KeepAliveError {
    /// The lease does not exist (expired or revoked).
    LeaseNotFound,
    /// The request failed.
    Failed(Error),
}

/// The first key-value of a range answer inside a transaction answer.
pub(crate) fn first_kv(op: &TxnOpResponse) -> Option<&KeyValue> {
    match op {
        TxnOpResponse::Get(get) => get.kvs().first(),
        _ => None,
    }
}

/// The revision a transaction answer was served at.
pub(crate) fn header_revision(response: &TxnResponse, what: &str) -> Result<i64> {
    response
        .header()
        .map(|header| header.revision())
        .ok_or_else(|| unexpected(what, "answer without a header"))
}
