//! Holds and their lease on ZooKeeper: the hold type, renewal and release requests, and
//! the lease a hold gets.
//!
//! A hold is an ephemeral node: it lives as long as the session, which the client library
//! keeps alive with pings. Renewal of all holds of a client is a barrier the leader
//! commits with a quorum ([`Live::barrier`]: it proves the session alive at the leader,
//! which a follower's own copy cannot), followed on the same session by one `multiRead`
//! request of `getData` operations (chunked for very many holds), which checks that every
//! node still exists and is owned by this session as of that barrier. Both are sent at
//! once: one round trip, two requests per renewal whatever the number of holds below 500.
//! A hold whose validity deadline passes without a renewal is released (its node deleted)
//! by the lease machinery of `lock-core`; if the client dies, the session timeout (= the
//! TTL) ends the node on the server instead.
//!
//! The lease runs from before the renewal was sent. The leader expires a session a
//! session timeout after the last activity a follower reported for it, at the leader's
//! pings (every `tickTime / 2`); activity the follower had no chance to report before
//! being cut off is not counted, a residue ZooKeeper gives clients no way to close.
//!
//! A hold whose node is gone (found by a renewal or a release) reads the broken marks
//! (see [`crate::layout`]) to tell [`LostReason::Broken`] from [`LostReason::Vanished`]:
//! one more read, on that path only. While the marks cannot be read, such a hold stays
//! undecided (Suspect, renewed again soon) and its release fails with a retryable error.

use std::time::Duration;

use futures::future::join_all;
use lock_core::raw::backend::{Amended, BackendRelease, RenewItem, RenewOutcome};
use lock_core::{Error, LostReason, Result};
use zookeeper_client as zk;

use crate::error::{from_client, is_session_gone, read_found, BACKEND};
use crate::layout::{
    broken_node, is_marked_broken, node_kind, owner_token_of_path, root_of_node, NodeKind,
};
use crate::session::{Live, Session};

/// Operations per `multiRead` request.
const RENEW_CHUNK: usize = 500;
/// What reading the broken marks is called in errors.
const READ_MARKS: &str = "read broken marks";
/// Attempts of a background delete.
const DELETE_ATTEMPTS: usize = 3;

/// One hold: the lock node and the session (epoch and id) it belongs to.
#[derive(Debug)]
pub struct ZkHold {
    pub(crate) path: String,
    pub(crate) epoch: u64,
    pub(crate) session_id: i64,
}

impl ZkHold {
    /// A hold on `path` created in session `live`.
    pub(crate) fn new(live: &Live, path: String) -> Self {
        ZkHold {
            path,
            epoch: live.epoch,
            session_id: live.session_id(),
        }
    }

    /// The full path of the lock node (relative to the chroot, if any).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The kind of its node.
    pub fn node_kind(&self) -> Option<NodeKind> {
        self.path.rsplit('/').next().and_then(node_kind)
    }

    /// The session epoch the hold belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// Deletes `path` if session `epoch` is still the live one, a few times on connection
/// loss; gives up quietly (the session timeout is the last resort).
pub(crate) async fn delete_in_epoch(session: &Session, path: &str, epoch: u64) {
    for _ in 0..DELETE_ATTEMPTS {
        let Ok(live) = session.live() else { return };
        if live.epoch != epoch {
            return;
        }
        match session.call("delete", live.client.delete(path, None)).await {
            Ok(Ok(())) | Ok(Err(zk::Error::NoNode)) => return,
            Ok(Err(err)) if is_session_gone(&err) => return,
            Ok(Err(err)) => tracing::debug!(%path, error = %err, "delete failed; retrying"),
            Err(err) => tracing::debug!(%path, error = %err, "delete failed; retrying"),
        }
        session
            .wait_usable(epoch, session.config().options.request_timeout)
            .await;
    }
}

/// Releases `hold`: deletes its node if it still belongs to the live session.
pub(crate) async fn release(session: &Session, hold: &ZkHold) -> Result<BackendRelease> {
    let live = match session.live() {
        Ok(live) => live,
        Err(_) if hold.epoch <= session.epoch() => {
            // The hold's session is gone, and its ephemeral node with it.
            return Ok(BackendRelease::NotOwner(LostReason::SessionExpired));
        }
        Err(err) => return Err(err),
    };
    if live.epoch != hold.epoch || live.session_id() != hold.session_id {
        return Ok(BackendRelease::NotOwner(LostReason::SessionExpired));
    }
    match session
        .call("delete lock node", live.client.delete(&hold.path, None))
        .await?
    {
        Ok(()) => Ok(BackendRelease::Released),
        Err(zk::Error::NoNode) => {
            let reasons = gone_reasons(session, &live, &[&hold.path]).await?;
            Ok(BackendRelease::NotOwner(
                reasons.into_iter().next().unwrap_or(LostReason::Vanished),
            ))
        }
        Err(err) => Err(from_client("delete lock node", err)),
    }
}

/// Stores `value` as the data of `hold`'s node (a candidate's value, or a writer's
/// [`DOWNGRADED`](crate::layout::DOWNGRADED) mark) if the node still belongs to the live
/// session: a `setData` at any version on its path, which only this acquisition's session
/// ever created (the owner token is in its name; a node of an older session fails with
/// `NoNode` or is refused by the epoch check). ZooKeeper tells the watchers of the
/// directory (the change feeds) and of the node (readers waiting behind a writer).
pub(crate) async fn set_data(session: &Session, hold: &ZkHold, value: &[u8]) -> Result<Amended> {
    const WHAT: &str = "amend lock node";
    let live = match live_of(session, hold)? {
        Ok(live) => live,
        Err(reason) => return Ok(Amended::NotOwner(reason)),
    };
    match session
        .call(WHAT, live.client.set_data(&hold.path, value, None))
        .await?
    {
        Ok(_) => Ok(Amended::Done),
        Err(err) => not_ours(session, &live, hold, err, WHAT).await,
    }
}

/// The first part of each upgrade step of `hold`, an upgradeable reader's (crate docs,
/// *Read-write lock*): the first sets its node's data from [`UPGRADEABLE`] to none, a
/// plain writer's, at version 0, so only once (a later step finds version 1); from then on
/// no reader passes it ([`BESIDE`]). Returns the live session, or why the hold is not
/// ours.
///
/// [`UPGRADEABLE`]: crate::layout::UPGRADEABLE
/// [`BESIDE`]: crate::layout::BESIDE
pub(crate) async fn mark_upgraded(
    session: &Session,
    hold: &ZkHold,
) -> Result<Result<Live, LostReason>> {
    const WHAT: &str = "upgrade lock node";
    let live = match live_of(session, hold)? {
        Ok(live) => live,
        Err(reason) => return Ok(Err(reason)),
    };
    let marked = live.client.set_data(&hold.path, &[], Some(0));
    match session.call(WHAT, marked).await? {
        // Set now, or by an earlier step.
        Ok(_) | Err(zk::Error::BadVersion) => Ok(Ok(live)),
        Err(err) => Ok(match not_ours(session, &live, hold, err, WHAT).await? {
            Amended::NotOwner(reason) => Err(reason),
            _ => Err(LostReason::Vanished),
        }),
    }
}

/// Why `hold`, whose node is gone, is lost (see [`gone_reasons`]).
pub(crate) async fn gone_reason(
    session: &Session,
    live: &Live,
    hold: &ZkHold,
) -> Result<LostReason> {
    let reasons = gone_reasons(session, live, &[&hold.path]).await?;
    Ok(reasons.into_iter().next().unwrap_or(LostReason::Vanished))
}

/// The live session of `hold`, or why it has none (its session ended).
fn live_of(session: &Session, hold: &ZkHold) -> Result<Result<Live, LostReason>> {
    let live = match session.live() {
        Ok(live) => live,
        Err(_) if hold.epoch <= session.epoch() => return Ok(Err(LostReason::SessionExpired)),
        Err(err) => return Err(err),
    };
    if live.epoch != hold.epoch || live.session_id() != hold.session_id {
        return Ok(Err(LostReason::SessionExpired));
    }
    Ok(Ok(live))
}

/// What an amendment of `hold` that failed with `err` found: not ours any more (its
/// node gone: why, from the broken marks; its session expired), or an error.
async fn not_ours(
    session: &Session,
    live: &Live,
    hold: &ZkHold,
    err: zk::Error,
    what: &str,
) -> Result<Amended> {
    match err {
        zk::Error::NoNode => Ok(Amended::NotOwner(gone_reason(session, live, hold).await?)),
        zk::Error::SessionExpired => Ok(Amended::NotOwner(LostReason::SessionExpired)),
        err => Err(from_client(what, err)),
    }
}

/// Renews `items`: one `multiRead` per chunk, all chunks in flight at once.
pub(crate) async fn renew(
    session: &Session,
    items: &[RenewItem<'_, ZkHold>],
) -> Result<Vec<RenewOutcome>> {
    let live = match session.live() {
        Ok(live) => live,
        Err(err) => {
            // Holds of older sessions are lost for sure; the current one may come back.
            let epoch = session.epoch();
            if items.iter().all(|item| item.hold.epoch < epoch) {
                return Ok(items
                    .iter()
                    .map(|_| RenewOutcome::Lost(LostReason::SessionExpired))
                    .collect());
            }
            return Err(err);
        }
    };
    let mut outcomes: Vec<Option<RenewOutcome>> = items
        .iter()
        .map(|item| {
            (item.hold.epoch != live.epoch || item.hold.session_id != live.session_id())
                .then_some(RenewOutcome::Lost(LostReason::SessionExpired))
        })
        .collect();
    let pending: Vec<usize> = (0..items.len())
        .filter(|i| outcomes[*i].is_none())
        .collect();
    if let Some(first) = pending.first() {
        // The barrier is sent first: the reads, sent after it, answer from a state the
        // leader committed after the renewal was sent.
        let barrier = session.call("renew", live.barrier(&items[*first].hold.path));
        let reads = pending.chunks(RENEW_CHUNK).map(|chunk| {
            let paths: Vec<&str> = chunk.iter().map(|i| items[*i].hold.path.as_str()).collect();
            read_stats(session, &live, paths)
        });
        let (barrier, results) = tokio::join!(barrier, join_all(reads));
        barrier?.map_err(|err| from_client("renew", err))?;
        record(items, &live, &pending, results, &mut outcomes)?;
        let gone: Vec<usize> = pending
            .into_iter()
            .filter(|i| outcomes[*i] == Some(RenewOutcome::Lost(LostReason::Vanished)))
            .collect();
        if !gone.is_empty() {
            let paths: Vec<&str> = gone.iter().map(|i| items[*i].hold.path.as_str()).collect();
            match gone_reasons(session, &live, &paths).await {
                Ok(reasons) => {
                    for (i, reason) in gone.into_iter().zip(reasons) {
                        outcomes[i] = Some(RenewOutcome::Lost(reason));
                    }
                }
                Err(err) => {
                    tracing::debug!(error = %err, "holds gone for a reason not known yet");
                    for i in gone {
                        outcomes[i] = Some(RenewOutcome::Undecided);
                    }
                }
            }
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.unwrap_or(RenewOutcome::Lost(LostReason::Vanished)))
        .collect())
}

/// Turns the owners read for the `pending` items into their outcomes.
fn record(
    items: &[RenewItem<'_, ZkHold>],
    live: &Live,
    pending: &[usize],
    results: Vec<Result<Vec<Option<i64>>>>,
    outcomes: &mut [Option<RenewOutcome>],
) -> Result<()> {
    for (chunk, result) in pending.chunks(RENEW_CHUNK).zip(results) {
        for (index, found) in chunk.iter().zip(result?) {
            let item = &items[*index];
            outcomes[*index] = Some(match found {
                Some(owner) if owner == live.session_id() => RenewOutcome::Renewed {
                    lease: lease_of(live, item.ttl),
                },
                Some(_) => RenewOutcome::Lost(LostReason::Taken),
                None => RenewOutcome::Lost(LostReason::Vanished),
            });
        }
    }
    Ok(())
}

/// The ephemeral owner of each path (`None`: no such node), in one `multiRead`;
/// concurrent single reads on servers without `multiRead`.
async fn read_stats(session: &Session, live: &Live, paths: Vec<&str>) -> Result<Vec<Option<i64>>> {
    let mut reader = live.client.new_multi_reader();
    for path in &paths {
        reader
            .add_get_data(path)
            .map_err(|err| from_client("renew", err))?;
    }
    match session.call("renew", reader.commit()).await? {
        Ok(results) => results
            .into_iter()
            .map(|result| {
                read_found("renew", result, |result| match result {
                    zk::MultiReadResult::Data { stat, .. } => Ok(stat.ephemeral_owner),
                    other => Err(other),
                })
            })
            .collect(),
        Err(zk::Error::Unimplemented) => {
            let limit = session.config().options.request_timeout;
            let reads = join_all(paths.iter().map(|path| live.client.check_stat(path)));
            let stats = tokio::time::timeout(limit, reads)
                .await
                .map_err(|_| Error::no_answer(BACKEND, "renew", limit))?;
            stats
                .into_iter()
                .map(|stat| {
                    stat.map(|s| s.map(|s| s.ephemeral_owner))
                        .map_err(|err| from_client("renew", err))
                })
                .collect()
        }
        Err(err) => Err(from_client("renew", err)),
    }
}

/// Why the nodes at `paths` of holds are gone: [`LostReason::Broken`] for those whose
/// owner token the marks beside their directory mark broken, else
/// [`LostReason::Vanished`]. Each marks node is read once, all at once.
///
/// # Errors
/// A retryable [`Error::Unavailable`] when a marks node could not be read: the reason is
/// unknown then, not a vanishing.
async fn gone_reasons(session: &Session, live: &Live, paths: &[&str]) -> Result<Vec<LostReason>> {
    let marks_node = |path: &str| broken_node(root_of_node(path));
    let mut nodes: Vec<String> = paths.iter().map(|path| marks_node(path)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let unreadable = |source: Error| Error::Unavailable {
        backend: BACKEND,
        message: "a lock node is gone and its broken marks cannot be read".to_owned(),
        source: Some(Box::new(source)),
    };
    let reads = join_all(nodes.iter().map(|node| live.client.get_data(node)));
    let mut marks = Vec::with_capacity(nodes.len());
    for read in session.call(READ_MARKS, reads).await.map_err(unreadable)? {
        marks.push(match read {
            Ok((data, _)) => data,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(err) => return Err(unreadable(from_client(READ_MARKS, err))),
        });
    }
    Ok(paths
        .iter()
        .map(|path| {
            let marks = nodes
                .binary_search(&marks_node(path))
                .map_or(&[][..], |i| &marks[i]);
            match owner_token_of_path(path) {
                Some(token) if is_marked_broken(marks, token) => LostReason::Broken,
                _ => LostReason::Vanished,
            }
        })
        .collect())
}

/// The lease a hold gets for `ttl` on session `live`: the shorter of the TTL and the
/// negotiated session timeout. The server cannot expire the session earlier, measured
/// from before a request it answered.
pub(crate) fn lease_of(live: &Live, ttl: Duration) -> Duration {
    ttl.min(live.client.session_timeout())
}
