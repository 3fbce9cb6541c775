//! What an operator asks and does: what a lock directory shows ([`inspect`]: its lock
//! nodes in queue order (those granted by [`HoldKind::granted_behind`] hold or lead, the
//! rest wait; a semaphore's lease nodes up to its permits hold), their owner tokens,
//! sessions, creation times, kinds and, for election candidates (`latch-` nodes), values,
//! the holders' fencing tokens (a leader's term), and the token floor), a feed of its changes
//! ([`changes`]), which directories of a namespace have a holder ([`list`]), and breaking
//! a hold ([`force_release`]).
//!
//! An inspection takes two round trips at most, each under the request timeout: a
//! barrier, the listing of the directory (with its stat) and the stats of its ancestors,
//! sent together; then the stats of the lock nodes listed, sent together (`exists` needs
//! no READ on the node, so nodes with a creator-only ACL are read as well; a candidate's
//! node is read with its data, its value, a writer's and a lease node with theirs: a
//! downgrade mark, a number of permits). An empty or missing directory costs the first
//! round trip only; a semaphore's directory one more (its `leases` and `locks` listed).
//!
//! # Token floor
//! The directory's `pzxid` (the zxid of its last child change, its own create at the
//! least), lowered below the second lock node's czxid when there is one: every lock node
//! created later has a greater czxid, and every waiter already queued is granted a token
//! above the floor as well. Without a directory, the `pzxid` of its deepest existing
//! ancestor (the root at the least): the directory's delete, if it ever existed, changed
//! that ancestor's children (or a deeper one's, since deleted), so the floor is also at
//! least every token the name was ever granted.

use std::sync::{Arc, Weak};
use std::time::{Duration, UNIX_EPOCH};

use futures::future::join_all;
use futures::{stream, StreamExt, TryStreamExt};
use lock_core::raw::{Backoff, ChangeFeed, HoldKind};
use lock_core::{Error, FencingToken, LockName, Occupancy, Participant, Result};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};
use zookeeper_client as zk;

use crate::error::{from_client, read_found, BACKEND};
use crate::layout::{
    broken_node, mark_broken, node_kind, owner_token, parent, permits_in, queue_order,
    semaphore_dirs, unescape_segment, NodeKind, SEMAPHORE_LEASES,
};
use crate::queue::{fencing, Step};
use crate::session::{Live, Session};

const WHAT: &str = "inspect lock directory";
const BREAK: &str = "break lock";
/// Attempts of a break whose holder or marks changed under it.
const BREAK_ATTEMPTS: usize = 8;
/// Request timeouts a whole break may take, its attempts together.
const BREAK_TIMEOUTS: u32 = 8;
/// First pause before such an attempt.
const BREAK_PAUSE: Duration = Duration::from_millis(10);
const LIST: &str = "list lock directories";
const WATCH: &str = "watch lock directory";
/// Pause between attempts to watch a lock directory on a new session.
const REWATCH_PAUSE: Duration = Duration::from_millis(200);
/// Directories read per `multiRead` of a listing.
const LIST_CHUNK: usize = 500;
/// `multiRead` requests of one listing in flight at once.
const CHUNKS_IN_FLIGHT: usize = 4;

/// The occupancy of lock directory `dir`.
///
/// # Errors
/// [`Error::InvalidConfig`] when the directory refuses READ (`NoAuth`); connection
/// errors, or [`Error::Unavailable`] while no session is established.
pub(crate) async fn inspect(session: &Session, dir: &str) -> Result<Occupancy> {
    let live = session.live()?;
    let above = ancestors(dir);
    // The barrier first: the reads sent behind it answer from a state the leader
    // committed after this call, never from a cut-off follower's older copy.
    let (barrier, listed, stats) = session
        .call(WHAT, async {
            let barrier = live.barrier(dir);
            let listed = live.client.get_children(dir);
            let stats = join_all(above.iter().map(|path| live.client.check_stat(path)));
            tokio::join!(barrier, listed, stats)
        })
        .await?;
    barrier.map_err(|err| from_client(WHAT, err))?;
    let (children, stat) = match listed {
        Ok(listed) => listed,
        Err(zk::Error::NoNode) => {
            let mut floor = None;
            for stat in stats {
                if let Some(stat) = stat.map_err(|err| from_client(WHAT, err))? {
                    floor = Some(stat.pzxid);
                    break;
                }
            }
            return Ok(Occupancy::default().token_floor(floor.map(token).transpose()?));
        }
        Err(err) => return Err(from_client(WHAT, err)),
    };
    if children.iter().any(|child| child == SEMAPHORE_LEASES) {
        return inspect_semaphore(session, &live, dir).await;
    }
    let present = read_queue(session, &live, dir, &children).await?;
    occupancy(present, Vec::new(), stat.pzxid, |kind| kind)
}

/// A lock node read for an inspection: its name, stat and data (where read).
type Present<'a> = (&'a str, zk::Stat, Option<Vec<u8>>);

/// The lock nodes among `children` of `dir` that are still there, in queue order, read.
async fn read_queue<'a>(
    session: &Session,
    live: &Live,
    dir: &str,
    children: &'a [String],
) -> Result<Vec<Present<'a>>> {
    let queue = queue_order(children);
    let nodes: Vec<String> = queue.iter().map(|node| format!("{dir}/{node}")).collect();
    let reads = nodes
        .iter()
        .zip(&queue)
        .map(|(path, node)| read_node(live, path, node_kind(node)));
    let stats = session.call(WHAT, join_all(reads)).await?;
    // A node gone since the listing left the queue.
    let mut present = Vec::with_capacity(queue.len());
    for (node, read) in queue.into_iter().zip(stats) {
        if let Some((stat, value)) = read.map_err(|err| from_client(WHAT, err))? {
            present.push((node, stat, value));
        }
    }
    Ok(present)
}

/// The occupancy of the nodes `present` (queue order) of a directory whose `pzxid` is
/// `pzxid`, with `queued` (participants of no node in `present`) waiting behind them:
/// each node holds when its kind (`adjust`ed) is granted behind the kinds ahead
/// ([`HoldKind::granted_behind`]).
fn occupancy(
    present: Vec<Present<'_>>,
    queued: Vec<Participant>,
    pzxid: i64,
    adjust: impl Fn(HoldKind) -> HoldKind,
) -> Result<Occupancy> {
    let mut floor = token(pzxid)?;
    let mut kinds: Vec<HoldKind> = Vec::with_capacity(present.len());
    let (mut holders, mut waiters) = (Vec::new(), Vec::new());
    for (node, stat, value) in present {
        let kind = adjust(
            node_kind(node).map_or(HoldKind::Mutex, |kind| kind.hold_kind(value.as_deref())),
        );
        let granted = waiters.is_empty() && kind.granted_behind(&kinds);
        let shown = (kind.is_shared() || kind == HoldKind::Write).then(|| kind.clone());
        let value = matches!(kind, HoldKind::Candidate { .. })
            .then_some(value)
            .flatten();
        kinds.push(kind);
        if granted {
            holders.push(holder(node, &stat)?.value(value).kind(shown));
        } else {
            if waiters.is_empty() {
                floor = floor.min(FencingToken(token(stat.czxid)?.0.saturating_sub(1)));
            }
            waiters.push(participant(node, &stat).value(value).kind(shown));
        }
    }
    waiters.extend(queued);
    Ok(Occupancy::shared(holders, waiters).token_floor(Some(floor)))
}

/// The occupancy of the semaphore in `dir`: its lease nodes hold up to the permits (ours
/// say how many; Curator's do not), the rest and the acquirers queued for the `locks`
/// mutex wait.
async fn inspect_semaphore(session: &Session, live: &Live, dir: &str) -> Result<Occupancy> {
    let (locks, leases) = semaphore_dirs(dir);
    let (leased, queued) = session
        .call(WHAT, async {
            tokio::join!(
                live.client.get_children(&leases),
                live.client.list_children(&locks)
            )
        })
        .await?;
    // No `leases` yet: 0 is a floor below every token.
    let (leased, pzxid) = match leased {
        Ok((leased, stat)) => (leased, stat.pzxid),
        Err(zk::Error::NoNode) => (Vec::new(), 0),
        Err(err) => return Err(from_client(WHAT, err)),
    };
    let queued = match queued {
        Ok(queued) => queued,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(err) => return Err(from_client(WHAT, err)),
    };
    let present = read_queue(session, live, &leases, &leased).await?;
    let permits = present
        .iter()
        .find_map(|(_, _, data)| data.as_deref().and_then(permits_in))
        .unwrap_or(u32::MAX);
    // An acquirer with a lease node shows once, by its lease node.
    let leasing: Vec<&str> = present
        .iter()
        .filter_map(|(node, _, _)| owner_token(node))
        .collect();
    let waiting = read_queue(session, live, &locks, &queued)
        .await?
        .into_iter()
        .filter(|(node, _, _)| owner_token(node).is_none_or(|token| !leasing.contains(&token)))
        .map(|(node, stat, _)| participant(node, &stat).kind(Some(HoldKind::Permit { permits })))
        .collect();
    occupancy(present, waiting, pzxid, |_| HoldKind::Permit { permits })
}

/// The stat of lock node `path` (`None`: gone) and, for a candidate's node, its data (the
/// candidate's value, `None` where the node refuses READ). `exists` for the others: it
/// needs no READ.
async fn read_node(
    live: &Live,
    path: &str,
    kind: Option<NodeKind>,
) -> Result<Option<(zk::Stat, Option<Vec<u8>>)>, zk::Error> {
    if matches!(
        kind,
        Some(NodeKind::Latch | NodeKind::Write | NodeKind::Lease)
    ) {
        match live.client.get_data(path).await {
            Ok((data, stat)) => return Ok(Some((stat, Some(data)))),
            Err(zk::Error::NoNode) => return Ok(None),
            Err(zk::Error::NoAuth) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(live.client.check_stat(path).await?.map(|stat| (stat, None)))
}

/// Lock node `node` with stat `stat` as a participant: its owner token, session and
/// creation time.
fn participant(node: &str, stat: &zk::Stat) -> Participant {
    // ZooKeeper writes session ids in hex; 0 is no session (a persistent node).
    let owner = stat.ephemeral_owner;
    let session = (owner != 0).then(|| format!("0x{owner:x}"));
    let since = u64::try_from(stat.ctime)
        .ok()
        .map(|millis| UNIX_EPOCH + Duration::from_millis(millis));
    Participant::new(owner_token(node).map(str::to_owned))
        .session(session)
        .since(since)
}

/// Lock node `node` with stat `stat` as the holder: a participant with its fencing token.
pub(crate) fn holder(node: &str, stat: &zk::Stat) -> Result<Participant> {
    Ok(participant(node, stat).fencing_token(Some(token(stat.czxid)?)))
}

/// A feed of the changes under lock directory `dir`: nodes created and deleted (a grant,
/// a release, an expiry, a waiter), data changed (a proclaim).
///
/// One persistent recursive watch on `dir` (ZooKeeper 3.6+ `addWatch`), added before
/// this returns, so every change after it fires the feed. A task follows it: it fires
/// the feed at each event and at each reconnect (events may be lost while disconnected,
/// ZOOKEEPER-4698), and after a session expiry watches again on the next session. The
/// task ends, its watch removed, when the feed is dropped or the lock client closed.
/// A server without `addWatch` (before 3.6) gives a feed that never fires: readers re-read
/// every `recheck`.
///
/// # Errors
/// Connection errors of adding the watch, [`Error::Unavailable`] while no session is
/// established.
pub(crate) async fn changes(session: &Arc<Session>, dir: String) -> Result<ChangeFeed> {
    let live = session.live()?;
    let watcher = match session
        .call(
            WATCH,
            live.client
                .watch(&dir, zk::AddWatchMode::PersistentRecursive),
        )
        .await?
    {
        Ok(watcher) => watcher,
        Err(zk::Error::Unimplemented) => {
            tracing::debug!(%dir, "the server has no persistent watches; the feed never fires");
            return Ok(ChangeFeed::never());
        }
        Err(err) => return Err(from_client(WATCH, err)),
    };
    // One pending fire is enough: the reader re-reads everything.
    let (fire, fired) = mpsc::channel(1);
    let follower = Follower {
        session: Arc::downgrade(session),
        dir,
        epoch: live.epoch,
    };
    drop(live);
    tokio::spawn(async move {
        tokio::select! {
            () = follower.follow(watcher, &fire) => {}
            () = fire.closed() => {}
        }
    });
    let stream = stream::unfold(fired, |mut fired| async move {
        fired.recv().await?;
        Some(((), fired))
    });
    Ok(ChangeFeed::from_stream(stream.boxed()))
}

/// The task behind a change feed: its lock directory and the session epoch it watches on.
struct Follower {
    /// Weak: the feed never keeps a closed lock client's session.
    session: Weak<Session>,
    dir: String,
    epoch: u64,
}

impl Follower {
    /// Fires `fire` at each event of `watcher`, and watches again on each new session.
    /// Returns once the lock client is closed or gone.
    async fn follow(mut self, mut watcher: zk::PersistentWatcher, fire: &mpsc::Sender<()>) {
        loop {
            let event = watcher.changed().await;
            let terminal =
                event.event_type == zk::EventType::Session && event.session_state.is_terminated();
            let disconnected = event.event_type == zk::EventType::Session
                && event.session_state == zk::SessionState::Disconnected;
            if !disconnected {
                // Full: a fire is pending already.
                let _ = fire.try_send(());
            }
            if terminal {
                // The watcher says no more after a terminal event.
                drop(watcher);
                match self.rewatch().await {
                    Some(next) => {
                        watcher = next;
                        let _ = fire.try_send(());
                    }
                    None => return,
                }
            }
        }
    }

    /// Watches the directory on the next session: one try per new session (each request
    /// under the request timeout), [`REWATCH_PAUSE`] apart; `None` once the lock client is
    /// closed or gone.
    async fn rewatch(&mut self) -> Option<zk::PersistentWatcher> {
        loop {
            let session = self.session.upgrade()?;
            if session.is_closed() {
                return None;
            }
            session
                .wait_usable(self.epoch, session.config().connect_timeout)
                .await;
            if let Ok(live) = session.live() {
                if live.epoch > self.epoch {
                    let watched = session
                        .call(
                            WATCH,
                            live.client
                                .watch(&self.dir, zk::AddWatchMode::PersistentRecursive),
                        )
                        .await;
                    match watched {
                        Ok(Ok(watcher)) => {
                            self.epoch = live.epoch;
                            return Some(watcher);
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(dir = %self.dir, error = %err, "watching again failed; retrying");
                        }
                        Err(err) => {
                            tracing::debug!(dir = %self.dir, error = %err, "watching again failed; retrying");
                        }
                    }
                }
            }
            drop(session);
            sleep(REWATCH_PAUSE).await;
        }
    }
}

/// The names under namespace root `root` that start with `prefix` and whose directory has
/// a lock node, sorted.
///
/// A barrier and the listing of `root`, sent together; then the children of the
/// directories whose names start with `prefix`, [`LIST_CHUNK`] directories per
/// `multiRead`, [`CHUNKS_IN_FLIGHT`] requests in flight, each under the request timeout.
/// Children of `root` that no name escapes to (not a lock directory) are skipped; a
/// missing `root` has no names.
///
/// # Errors
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) when a directory refuses
/// READ; connection errors, or [`Error::Unavailable`](lock_core::Error::Unavailable)
/// while no session is established.
pub(crate) async fn list(session: &Session, root: &str, prefix: &str) -> Result<Vec<LockName>> {
    let live = session.live()?;
    let (barrier, listed) = session
        .call(LIST, async {
            tokio::join!(live.barrier(root), live.client.list_children(root))
        })
        .await?;
    barrier.map_err(|err| from_client(LIST, err))?;
    let segments = match listed {
        Ok(segments) => segments,
        Err(zk::Error::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(from_client(LIST, err)),
    };
    let mut candidates: Vec<(LockName, String)> = segments
        .into_iter()
        .filter_map(|segment| {
            let name = unescape_segment(&segment)?;
            name.as_str()
                .starts_with(prefix)
                .then(|| (name, format!("{root}/{segment}")))
        })
        .collect();
    candidates.sort_unstable();
    // Futures do nothing until polled: at most `CHUNKS_IN_FLIGHT` are sent at once.
    let reads: Vec<_> = candidates
        .chunks(LIST_CHUNK)
        .map(|chunk| {
            let dirs: Vec<&str> = chunk.iter().map(|(_, dir)| dir.as_str()).collect();
            have_lock_nodes(session, &live, dirs)
        })
        .collect();
    let held: Vec<Vec<bool>> = stream::iter(reads)
        .buffered(CHUNKS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(candidates
        .into_iter()
        .zip(held.into_iter().flatten())
        .filter_map(|((name, _), held)| held.then_some(name))
        .collect())
}

/// Whether each of `dirs` has a lock node (a missing directory has none), in one
/// `multiRead`; concurrent listings on servers without `multiRead`.
async fn have_lock_nodes(session: &Session, live: &Live, dirs: Vec<&str>) -> Result<Vec<bool>> {
    // A semaphore's directory counts while its `leases` child lives (until reaped).
    let held = |children: &[String]| {
        !queue_order(children).is_empty() || children.iter().any(|c| c == SEMAPHORE_LEASES)
    };
    let mut reader = live.client.new_multi_reader();
    for dir in &dirs {
        reader
            .add_get_children(dir)
            .map_err(|err| from_client(LIST, err))?;
    }
    match session.call(LIST, reader.commit()).await? {
        Ok(results) => results
            .into_iter()
            .map(|result| {
                let found = read_found(LIST, result, |result| match result {
                    zk::MultiReadResult::Children { children } => Ok(held(&children)),
                    other => Err(other),
                });
                found.map(|held| held.unwrap_or(false))
            })
            .collect(),
        Err(zk::Error::Unimplemented) => {
            let listings = join_all(dirs.iter().map(|dir| live.client.list_children(dir)));
            session
                .call(LIST, listings)
                .await?
                .into_iter()
                .map(|listed| match listed {
                    Ok(children) => Ok(held(&children)),
                    Err(zk::Error::NoNode) => Ok(false),
                    Err(err) => Err(from_client(LIST, err)),
                })
                .collect()
        }
        Err(err) => Err(from_client(LIST, err)),
    }
}

/// A zxid as a fencing token (the lock grants a node's czxid).
fn token(zxid: i64) -> Result<FencingToken> {
    fencing(zxid).map(FencingToken).map_err(Step::into_error)
}

/// The ancestors of `dir`, deepest first, the root last.
fn ancestors(dir: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut path = dir;
    while let Some(cut) = path.rfind('/') {
        path = if cut == 0 { "/" } else { &path[..cut] };
        out.push(path);
        if cut == 0 {
            break;
        }
    }
    out
}

/// Breaks the hold of lock directory `dir`: deletes its first lock node (at the version
/// read) and marks its owner token broken in the marks node beside the directory (see
/// [`crate::layout`]; created if missing, else written at the version read), in one
/// transaction; returns the holder removed, `None` if the directory has no lock node.
/// Starts over, at most [`BREAK_ATTEMPTS`] times after a short pause, when the holder or
/// the marks changed in between (the holder left by itself and the next one holds now;
/// another break wrote its mark): what it removes is the holder at the moment of the
/// transaction. Where the namespace refuses to let the marks be read or written
/// (`NoAuth`), the node is deleted without a mark.
///
/// Each attempt takes three round trips under the request timeout each: a barrier with
/// the listing of `dir` and the read of the marks; the stat of the holder's node; the
/// transaction. The whole break takes [`BREAK_TIMEOUTS`] request timeouts at most.
///
/// # Errors
/// [`Error::InvalidConfig`] when the directory refuses the delete (`NoAuth`); connection
/// errors (the hold may or may not be removed), also when the break ran out of time;
/// [`Error::Unavailable`] while no session is established or when the holder kept
/// changing.
pub(crate) async fn force_release(session: &Session, dir: &str) -> Result<Option<Participant>> {
    let limit = session.config().options.request_timeout * BREAK_TIMEOUTS;
    let broken = async {
        // A semaphore's holders are its lease nodes: the oldest is broken.
        let (_, leases) = semaphore_dirs(dir);
        let live = session.live()?;
        let is_semaphore = session
            .call(BREAK, live.client.check_stat(&leases))
            .await?
            .map_err(|err| from_client(BREAK, err))?
            .is_some();
        let queue = if is_semaphore { leases.as_str() } else { dir };
        break_hold(session, queue, parent(dir)).await
    };
    timeout(limit, broken)
        .await
        .unwrap_or_else(|_| Err(Error::no_answer(BACKEND, BREAK, limit)))
}

/// The attempts of [`force_release`] on the queue `dir` of a lock directory in `root`.
async fn break_hold(session: &Session, dir: &str, root: &str) -> Result<Option<Participant>> {
    let live = session.live()?;
    let marks_node = broken_node(root);
    let failed = |err| from_client(BREAK, err);
    let mut backoff = Backoff::new(BREAK_PAUSE, BREAK_PAUSE * 16);
    for _ in 0..BREAK_ATTEMPTS {
        let (barrier, listed, read) = session
            .call(BREAK, async {
                tokio::join!(
                    live.barrier(dir),
                    live.client.list_children(dir),
                    live.client.get_data(&marks_node)
                )
            })
            .await?;
        barrier.map_err(failed)?;
        let children = match listed {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(failed(err)),
        };
        // `Some(marks)`: the marks and their version, `None` while the node does not
        // exist yet; `None` where reading them is refused (the break leaves no mark).
        let marks = match read {
            Ok((data, stat)) => Some(Some((data, stat.version))),
            Err(zk::Error::NoNode) => Some(None),
            Err(zk::Error::NoAuth) => None,
            Err(err) => return Err(failed(err)),
        };
        let Some(node) = queue_order(&children).first().map(|node| node.to_string()) else {
            return Ok(None);
        };
        let path = format!("{dir}/{node}");
        let Some(stat) = session
            .call(BREAK, live.client.check_stat(&path))
            .await?
            .map_err(failed)?
        else {
            continue;
        };
        let holder = holder(&node, &stat)?;
        let mut writer = live.client.new_multi_writer();
        writer
            .add_delete(&path, Some(stat.version))
            .map_err(failed)?;
        let mark = owner_token(&node).zip(marks);
        match &mark {
            Some((token, Some((data, version)))) => writer
                .add_set_data(&marks_node, &mark_broken(data, token), Some(*version))
                .map_err(failed)?,
            Some((token, None)) => {
                let persistent = zk::CreateMode::Persistent.with_acls(session.config().acl.acls());
                writer
                    .add_create(&marks_node, &mark_broken(&[], token), &persistent)
                    .map_err(failed)?;
            }
            None => {}
        }
        match session.call(BREAK, writer.commit()).await? {
            Ok(_) => return Ok(Some(holder)),
            Err(zk::MultiWriteError::OperationFailed {
                index: 0 | 1,
                source: zk::Error::NoNode | zk::Error::BadVersion | zk::Error::NodeExists,
            }) => {}
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoAuth,
            }) => {
                tracing::debug!(%marks_node, "the namespace refuses the broken marks; breaking without a mark");
                match session
                    .call(BREAK, live.client.delete(&path, Some(stat.version)))
                    .await?
                {
                    Ok(()) => return Ok(Some(holder)),
                    Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                    Err(err) => return Err(failed(err)),
                }
            }
            Err(err) => return Err(failed(err.into())),
        }
        sleep(backoff.next_pause()).await;
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        message: format!("the holder of {dir} kept changing while it was being broken"),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_run_from_the_parent_to_the_root() {
        assert_eq!(ancestors("/locks/a%2Fb"), ["/locks", "/"]);
        assert_eq!(ancestors("/jobs"), ["/"]);
        assert_eq!(ancestors("/x/y/z"), ["/x/y", "/x", "/"]);
    }
}
