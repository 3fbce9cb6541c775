//! The waiting queue of one acquisition: create the ephemeral sequential node (in
//! [`create`]), wait for its kind to be granted behind the nodes ahead by watching only
//! the node that must go first (the predecessor; for a reader the first writer ahead),
//! and remove it in the background if the acquisition does not hand it over. A permit
//! of a semaphore ([`semaphore`]) runs that queue on the semaphore's `locks` mutex, then
//! waits for a lease.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use lock_core::raw::{
    backend::{AcquireRequest, Acquired, HoldKind},
    plumbing::{Cleanup, CleanupOnDrop},
};
use lock_core::{Error, FencingToken, LockName, Result};
use tokio::time::{sleep, Instant};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{from_client, is_connection_loss, is_session_gone, BACKEND};
use crate::hold::{delete_in_epoch, lease_of, ZkHold};
use crate::layout::{node_data, node_kind, queue_order, NodeKind, BESIDE, DOWNGRADED};
use crate::session::{Live, Session};

mod create;
mod semaphore;

use create::Queued;
pub(crate) use semaphore::PermitNodes;

/// Tries to create the node of one attempt (parents missing, connection lost).
const CREATE_ATTEMPTS: usize = 5;
/// Connection losses tolerated within one attempt before giving up on it.
const LOSS_RETRIES: usize = 20;
/// Shortest pause after a connection loss.
const LOSS_PAUSE: Duration = Duration::from_millis(50);
/// A grant rests on a point the leader ordered younger than the lease divided by this.
const FRESH_PART: u32 = 10;

/// What a queued node finds ahead of it ([`Queue::blocker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ahead {
    /// Granted.
    Granted,
    /// Granted once it passes the upgradeable reader at this index of the nodes ahead.
    Passes(usize),
    /// Waits for the node at this index of the nodes ahead.
    Blocked(usize),
}

/// How an attempt ends when it does not end with a result.
#[derive(Debug)]
pub(crate) enum Step {
    /// A connection loss or a request deadline: the session may still be fine.
    Retry(Error),
    /// The session is gone (or our node vanished): start over on the next session.
    Restart(Error),
    /// Give up.
    Fail(Error),
}

impl Step {
    pub(crate) fn into_error(self) -> Error {
        match self {
            Step::Retry(err) | Step::Restart(err) | Step::Fail(err) => err,
        }
    }
}

fn step(err: zk::Error, what: &str) -> Step {
    if is_connection_loss(&err) {
        Step::Retry(from_client(what, err))
    } else if is_session_gone(&err) {
        Step::Restart(from_client(what, err))
    } else {
        Step::Fail(from_client(what, err))
    }
}

/// A zxid (a lock node's czxid: its fencing token) as a token.
pub(crate) fn fencing(zxid: i64) -> Result<u64, Step> {
    u64::try_from(zxid).map_err(|_| {
        Step::Fail(Error::Protocol {
            backend: BACKEND,
            message: format!("the server reported an invalid zxid {zxid}"),
            source: None,
        })
    })
}

/// The node an acquire queued, removed in the background if the acquire does not hand
/// it over (cancelled, failed, or a try that found the lock held).
#[derive(Debug)]
pub(crate) struct QueuedNode {
    session: Arc<Session>,
    dir: String,
    marker: String,
    epoch: u64,
    /// A create was sent: a node may exist even if its path is unknown.
    armed: bool,
    /// The node's path once known.
    node: Option<String>,
}

impl QueuedNode {
    /// Nothing queued yet for `marker` in `dir` on session `epoch`.
    pub(crate) fn new(session: &Arc<Session>, dir: &str, marker: &str, epoch: u64) -> Self {
        QueuedNode {
            session: Arc::clone(session),
            dir: dir.to_owned(),
            marker: marker.to_owned(),
            epoch,
            armed: false,
            node: None,
        }
    }
}

impl Cleanup for QueuedNode {
    async fn cleanup(self) {
        let path = match self.node {
            Some(path) => Some(path),
            None => find_by_marker(&self.session, &self.dir, &self.marker, self.epoch).await,
        };
        if let Some(path) = path {
            delete_in_epoch(&self.session, &path, self.epoch).await;
        }
    }

    fn is_needed(&self) -> bool {
        self.armed
    }
}

/// What an acquisition queues and how.
#[derive(Debug)]
pub(crate) struct Ask<'a> {
    /// The kind of hold.
    pub(crate) kind: &'a HoldKind,
    /// The data of its node.
    pub(crate) data: &'a [u8],
    /// Whether to wait (else withdraw at once when not granted).
    pub(crate) wait: bool,
    /// The lock's name, for errors.
    pub(crate) name: &'a LockName,
    /// Whether a grant must rest on a listing the leader ordered (behind a barrier):
    /// every hold's does; a semaphore's `locks` mutex orders acquirers only (the lease
    /// count behind the lease's create decides the grant), so its wake-ups save the
    /// barrier's quorum write.
    pub(crate) ordered: bool,
}

/// A node granted in its queue.
#[derive(Debug)]
pub(crate) struct Granted {
    path: String,
    czxid: u64,
    /// An instant before a point the leader ordered after the grant was decided from.
    at: Instant,
}

impl Granted {
    /// The acquisition `request` made with this grant on session `live`.
    fn acquired(self, live: &Live, request: &AcquireRequest<'_>) -> Acquired<ZkHold> {
        Acquired {
            hold: ZkHold::new(live, self.path),
            fencing_token: FencingToken(self.czxid),
            requested_at: self.at,
            lease: lease_of(live, request.ttl),
            session: live.epoch,
        }
    }
}

/// Refuses `kind` on lock `name` beside the lock nodes of a directory (`queue`, in queue
/// order, `ours` among them skipped) of kinds that cannot be one primitive with it
/// ([`HoldKind::check_beside`]): a read-write lock beside a mutex, say, a permit beside
/// any lock node, or anything else in the directory of a semaphore with lease nodes
/// (`leased`, see [`Queue::leased`]). Kinds are read from node names, so Curator's nodes
/// count too.
fn check_kinds(
    (kind, name): (&HoldKind, &LockName),
    leased: bool,
    queue: &[&str],
    ours: &str,
) -> Result<(), Step> {
    if leased {
        return Err(Step::Fail(Error::Conflict {
            name: name.to_string(),
            ours: kind.describe(),
            theirs: "a semaphore".to_owned(),
        }));
    }
    queue
        .iter()
        .filter(|node| **node != ours)
        .filter_map(|node| node_kind(node))
        .try_for_each(|other| kind.check_beside(&other.hold_kind(None), name))
        .map_err(Step::Fail)
}

/// The queue-side requests of one lock client, on its session.
pub(crate) struct Queue<'a> {
    session: &'a Session,
}

impl<'a> Queue<'a> {
    pub(crate) fn new(session: &'a Session) -> Self {
        Queue { session }
    }

    fn config(&self) -> &ZkConfig {
        self.session.config()
    }

    fn acls(&self) -> zk::Acls<'static> {
        self.config().acl.acls()
    }

    fn recheck(&self) -> Duration {
        self.config().options.recheck
    }

    /// One attempt on session `live`: queue a node, then wait for it to be granted.
    pub(crate) async fn attempt(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        request: &AcquireRequest<'_>,
        pending: &mut CleanupOnDrop<QueuedNode>,
    ) -> Result<Option<Acquired<ZkHold>>, Step> {
        let asked = Ask {
            kind: request.kind,
            data: &node_data(request.kind),
            wait: request.wait,
            name: request.name,
            ordered: true,
        };
        let granted = self
            .queue_and_wait(live, dir, marker, &asked, pending)
            .await?;
        Ok(granted.map(|granted| granted.acquired(live, request)))
    }

    /// Queues a node `<dir>/<marker><seq>` as `asked`, then waits until its kind is
    /// granted behind the nodes ahead ([`HoldKind::granted_behind`]), watching only the
    /// node that must go first: the predecessor, or for a reader the first writer
    /// ahead. `None`: not granted and not to wait (the node is deleted).
    pub(crate) async fn queue_and_wait(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        asked: &Ask<'_>,
        pending: &mut CleanupOnDrop<QueuedNode>,
    ) -> Result<Option<Granted>, Step> {
        let Queued {
            name,
            czxid,
            ordered_at,
            children,
        } = self.create(live, dir, marker, asked.data, pending).await?;
        let path = format!("{dir}/{name}");
        let mut losses = 0;
        // A grant's validity runs from a point the leader ordered, never from a read a
        // cut-off follower may answer from its own copy: the create, or the barrier of a
        // later listing. Whether the node is first needs no such point: a listing behind
        // our create (on our session) shows every node ahead that still exists, and none
        // can join ahead of it. So a listing is sent behind a new barrier only once the
        // last point is no longer fresh ([`Queue::fresh`]).
        let mut grant_at = ordered_at;
        let mut first = Some(children);
        loop {
            let listed = match first.take() {
                Some(Some(children)) => Ok(Ok(children)),
                Some(None) => self.list(live, dir).await,
                None if asked.ordered && !self.fresh(live, grant_at) => {
                    let at = Instant::now();
                    let listed = ordered_children(self.session, live, &path, dir).await;
                    if matches!(listed, Ok(Ok(_))) {
                        grant_at = at;
                    }
                    listed
                }
                None => self.list(live, dir).await,
            };
            let children = match listed {
                Ok(Ok(children)) => children,
                Ok(Err(zk::Error::NoNode)) => Vec::new(),
                Ok(Err(err)) => {
                    self.tolerate(live, step(err, "list lock nodes"), &mut losses)
                        .await?;
                    continue;
                }
                Err(err) => {
                    self.tolerate(live, Step::Retry(err), &mut losses).await?;
                    continue;
                }
            };
            let queue = queue_order(&children);
            let Some(index) = queue.iter().position(|child| *child == name) else {
                return Err(vanished(&path));
            };
            let leased = match self.leased(live, dir, asked.kind, &children).await {
                Ok(leased) => leased,
                Err(step) => {
                    self.tolerate(live, step, &mut losses).await?;
                    continue;
                }
            };
            check_kinds((asked.kind, asked.name), leased, &queue, &name)?;
            let ahead = &queue[..index];
            let blocker = match self.blocker(live, dir, asked.kind, ahead).await {
                // A reader passing an upgradeable reader holds only once marked beside it.
                Ok(Ahead::Passes(upgradeable)) => {
                    let beside = format!("{dir}/{}", ahead[upgradeable]);
                    match self.pass_beside(live, &beside, &path).await {
                        Ok(true) => None,
                        Ok(false) => Some(upgradeable),
                        Err(step) => {
                            self.tolerate(live, step, &mut losses).await?;
                            continue;
                        }
                    }
                }
                Ok(Ahead::Granted) => None,
                Ok(Ahead::Blocked(blocker)) => Some(blocker),
                Err(step) => {
                    self.tolerate(live, step, &mut losses).await?;
                    continue;
                }
            };
            let Some(blocker) = blocker else {
                // Granted: the node is this session's (created on it, or found by its
                // marker and its `ephemeralOwner` checked: never one left by an older
                // session, CURATOR-696), and the listing came on the same session,
                // whose expiry fails every later request.
                pending.state_mut().armed = false;
                return Ok(Some(Granted {
                    path,
                    czxid,
                    at: grant_at,
                }));
            };
            if !asked.wait {
                self.withdraw(live, &path, pending).await;
                return Ok(None);
            }
            let last = only_blocker(asked.kind, ahead, blocker);
            let blocker = format!("{dir}/{}", ahead[blocker]);
            let own = last.then_some(path.as_str());
            let gone = self
                .await_change(live, &blocker, own, asked.kind, &mut losses)
                .await?;
            if gone && last && (!asked.ordered || self.fresh(live, grant_at)) {
                // The one node ahead that held us back is gone, and ours was there
                // until then: granted without another listing.
                pending.state_mut().armed = false;
                return Ok(Some(Granted {
                    path,
                    czxid,
                    at: grant_at,
                }));
            }
        }
    }

    /// The children of `dir`, as the server we talk to has them.
    async fn list(&self, live: &Live, dir: &str) -> Result<Result<Vec<String>, zk::Error>> {
        self.session
            .call("list lock nodes", live.client.list_children(dir))
            .await
    }

    /// Whether a grant may still rest on a point the leader ordered at `at`: younger than
    /// a tenth of the lease, so that the guard keeps most of it.
    fn fresh(&self, live: &Live, at: Instant) -> bool {
        at.elapsed() < lease_of(live, self.config().options.ttl) / FRESH_PART
    }

    /// Watches `blocker` until it changes. `true` once it is gone (its deletion seen, or
    /// found gone); `false` after any other change (data, a session's end) or failure,
    /// after which the caller lists again. With `own` (our node, when the blocker is
    /// the only node ahead that holds it back) that node is watched too, in the same
    /// round trip: the server sends a session's events in order, so our node's deletion
    /// is seen before a later deletion of the blocker, and a grant never rests on a node
    /// that vanished. Every `recheck` the blocker's stat (and our node) are read again,
    /// since a push may be missed.
    async fn await_change(
        &self,
        live: &Live,
        blocker: &str,
        own: Option<&str>,
        kind: &HoldKind,
        losses: &mut usize,
    ) -> Result<bool, Step> {
        let watch_blocker = live.client.get_and_watch_data(blocker);
        let watch_own = own.map(|own| live.client.check_and_watch_stat(own));
        let (watched, own_watched) =
            tokio::join!(self.session.call("watch lock node", watch_blocker), async {
                match watch_own {
                    Some(watch) => Some(self.session.call("watch own lock node", watch).await),
                    None => None,
                }
            });
        let mut own_changed = match own_watched {
            None => None,
            Some(Ok(Ok((Some(_), watcher)))) => Some(Box::pin(watcher.changed())),
            // Our node is gone: the listing tells.
            Some(Ok(Ok((None, _)))) => return Ok(false),
            Some(Ok(Err(err))) => {
                self.tolerate(live, step(err, "watch own lock node"), losses)
                    .await?;
                return Ok(false);
            }
            Some(Err(err)) => {
                self.tolerate(live, Step::Retry(err), losses).await?;
                return Ok(false);
            }
        };
        let (stat, watcher) = match watched {
            // Downgraded since it was read: look again at once.
            Ok(Ok((data, _, _)))
                if matches!(kind, HoldKind::Read | HoldKind::Upgradeable) && data == DOWNGRADED =>
            {
                return Ok(false)
            }
            Ok(Ok((_, stat, watcher))) => (stat, watcher),
            Ok(Err(zk::Error::NoNode)) => return Ok(true),
            Ok(Err(err)) => {
                self.tolerate(live, step(err, "watch lock node"), losses)
                    .await?;
                return Ok(false);
            }
            Err(err) => {
                self.tolerate(live, Step::Retry(err), losses).await?;
                return Ok(false);
            }
        };
        let mut changed = pin!(watcher.changed());
        loop {
            tokio::select! {
                biased;
                _ = async {
                    match own_changed.as_mut() {
                        Some(own) => own.as_mut().await,
                        None => std::future::pending().await,
                    }
                } => return Ok(false),
                event = &mut changed => {
                    // Ours, had it changed first, would have been seen first.
                    let own_still = own_changed
                        .as_mut()
                        .is_none_or(|own| own.as_mut().now_or_never().is_none());
                    return Ok(event.event_type == zk::EventType::NodeDeleted && own_still);
                }
                () = sleep(self.recheck()) => {
                    let blocker_now = live.client.check_stat(blocker);
                    let own_now = own.map(|own| live.client.check_stat(own));
                    let (blocker_now, own_now) = tokio::join!(
                        self.session.call("check lock node", blocker_now),
                        async {
                            match own_now {
                                Some(own) => Some(self.session.call("check lock node", own).await),
                                None => None,
                            }
                        }
                    );
                    let own_there = own_now.is_none_or(|own| matches!(own, Ok(Ok(Some(_)))));
                    match blocker_now {
                        Ok(Ok(Some(now))) if now.mzxid == stat.mzxid && own_there => {}
                        Ok(Ok(_)) => return Ok(false),
                        Ok(Err(err)) => {
                            self.tolerate(live, step(err, "check lock node"), losses).await?;
                            return Ok(false);
                        }
                        Err(err) => {
                            self.tolerate(live, Step::Retry(err), losses).await?;
                            return Ok(false);
                        }
                    }
                }
            }
        }
    }

    /// Deletes the queued node at `path` of an acquisition that does not wait; disarms
    /// its cleanup once it is gone.
    async fn withdraw(&self, live: &Live, path: &str, pending: &mut CleanupOnDrop<QueuedNode>) {
        let deleted = self
            .session
            .call("delete lock node", live.client.delete(path, None))
            .await;
        if matches!(deleted, Ok(Ok(()) | Err(zk::Error::NoNode))) {
            pending.state_mut().armed = false;
        }
    }

    /// What a node of `kind` behind `ahead` (nodes of `dir`, queue order) finds
    /// ([`HoldKind::granted_behind`] over their kinds, a writer's node read by its mark):
    /// granted, granted once it passes the upgradeable reader at an index
    /// ([`Queue::pass_beside`]), or blocked by the node at an index. The last node ahead
    /// blocks an exclusive kind; a reader the first writer ahead (as Curator's reader
    /// watches), else the first upgradeable reader ahead (a second one waits for it); an
    /// upgradeable reader the last node ahead that is no reader.
    async fn blocker(
        &self,
        live: &Live,
        dir: &str,
        kind: &HoldKind,
        ahead: &[&str],
    ) -> Result<Ahead, Step> {
        if !matches!(kind, HoldKind::Read | HoldKind::Upgradeable) {
            return Ok(ahead
                .len()
                .checked_sub(1)
                .map_or(Ahead::Granted, Ahead::Blocked));
        }
        let mut seen: Vec<(usize, HoldKind)> = Vec::with_capacity(ahead.len());
        for (index, node) in ahead.iter().enumerate() {
            let other = match node_kind(node) {
                Some(NodeKind::Read) => HoldKind::Read,
                Some(NodeKind::Write) => {
                    let path = format!("{dir}/{node}");
                    match self
                        .session
                        .call("read writer node", live.client.get_data(&path))
                        .await
                    {
                        Ok(Ok((data, _))) => NodeKind::Write.hold_kind(Some(&data)),
                        Ok(Err(zk::Error::NoNode)) => continue,
                        Ok(Err(err)) => return Err(step(err, "read writer node")),
                        Err(err) => return Err(Step::Retry(err)),
                    }
                }
                _ => HoldKind::Mutex,
            };
            seen.push((index, other));
            if *kind == HoldKind::Read && !kind.granted_behind(seen.iter().map(|(_, other)| other))
            {
                // Decided, and every node before this one lets the reader pass: the first
                // writer, or the second upgradeable reader (then wait for the first).
                let first = seen.iter().find(|(_, o)| *o == HoldKind::Upgradeable);
                return Ok(Ahead::Blocked(match (&seen[seen.len() - 1].1, first) {
                    (HoldKind::Upgradeable, Some((first, _))) => *first,
                    _ => index,
                }));
            }
        }
        if kind.granted_behind(seen.iter().map(|(_, other)| other)) {
            let upgradeable = seen.iter().find(|(_, o)| *o == HoldKind::Upgradeable);
            return Ok(match upgradeable {
                Some((index, _)) => Ahead::Passes(*index),
                None => Ahead::Granted,
            });
        }
        let blocker = seen
            .iter()
            .rev()
            .find(|(_, other)| *other != HoldKind::Read);
        Ok(blocker.map_or(Ahead::Granted, |(index, _)| Ahead::Blocked(*index)))
    }

    /// Marks our reader's node `own` [`BESIDE`] the upgradeable reader's node `beside`,
    /// in one transaction with a check that that node is still at version 0 (still
    /// [`UPGRADEABLE`](crate::layout::UPGRADEABLE): an upgrade changes it first).
    /// `true`: marked, granted (also when an earlier attempt, whose answer was lost,
    /// marked it); `false`: it changed or went, look again.
    async fn pass_beside(&self, live: &Live, beside: &str, own: &str) -> Result<bool, Step> {
        const WHAT: &str = "mark a reader beside an upgradeable reader";
        let mut writer = live.client.new_multi_writer();
        let commit = writer
            .add_check_version(beside, 0)
            .and_then(|()| writer.add_set_data(own, BESIDE, None))
            .map(|()| writer.commit())
            .map_err(|err| step(err, WHAT))?;
        match self.session.call(WHAT, commit).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, .. })) => {
                match self.session.call(WHAT, live.client.get_data(own)).await {
                    Ok(Ok((data, _))) => Ok(data == BESIDE),
                    Ok(Err(err)) => Err(step(err, WHAT)),
                    Err(err) => Err(Step::Retry(err)),
                }
            }
            Ok(Err(zk::MultiWriteError::OperationFailed {
                source: zk::Error::NoNode,
                ..
            })) => Err(vanished(own)),
            Ok(Err(err)) => Err(step(err.into(), WHAT)),
            Err(err) => Err(Step::Retry(err)),
        }
    }

    /// Whether the upgraded node `name` of `dir` holds alone: no node ahead of it, and no
    /// reader's node behind it marked [`BESIDE`] (every reader granted behind it passed
    /// it, and marked itself before the upgrade changed the node). The listing comes
    /// after the upgrade's write on this session, so it shows every mark made before it;
    /// a lagging server answers from a past state, where a node gone now is gone too: it
    /// can only delay the answer.
    pub(crate) async fn upgraded_alone(
        &self,
        live: &Live,
        dir: &str,
        name: &str,
    ) -> Result<bool, Step> {
        let children = match self.list(live, dir).await {
            Ok(Ok(children)) => children,
            Ok(Err(err)) => return Err(step(err, "list lock nodes")),
            Err(err) => return Err(Step::Retry(err)),
        };
        let queue = queue_order(&children);
        match queue.iter().position(|node| *node == name) {
            Some(0) => {}
            Some(_) => return Ok(false),
            None => return Err(vanished(&format!("{dir}/{name}"))),
        }
        for node in queue.iter().skip(1) {
            if node_kind(node) != Some(NodeKind::Read) {
                continue;
            }
            let path = format!("{dir}/{node}");
            match self
                .session
                .call("read reader node", live.client.get_data(&path))
                .await
            {
                Ok(Ok((data, _))) if data == BESIDE => return Ok(false),
                Ok(Ok(_) | Err(zk::Error::NoNode)) => {}
                Ok(Err(err)) => return Err(step(err, "read reader node")),
                Err(err) => return Err(Step::Retry(err)),
            }
        }
        Ok(true)
    }

    /// Lets a connection loss pass (waiting for the reconnect) a bounded number of
    /// times; passes any other step on.
    async fn tolerate(&self, live: &Live, step: Step, losses: &mut usize) -> Result<(), Step> {
        match step {
            Step::Retry(err) => {
                *losses += 1;
                tracing::debug!(error = %err, losses, epoch = live.epoch, "connection loss while queued");
                if *losses > LOSS_RETRIES {
                    return Err(Step::Fail(err));
                }
                sleep(LOSS_PAUSE).await;
                self.session
                    .wait_usable(live.epoch, self.config().options.request_timeout)
                    .await;
                Ok(())
            }
            other => Err(other),
        }
    }
}

/// Whether `ahead[blocker]` is the only node of `ahead` (queue order) that holds back a
/// node of `kind`, so that its deletion grants it: no node joins the queue ahead of a
/// queued one (sequence numbers only grow while the directory has children), and
/// [`Queue::blocker`] found every node before it not in the way. For an exclusive kind
/// the blocker is the one node ahead; a reader's blocker may have readers around it, and
/// no writer's node (a downgraded or upgradeable one, which a reader passes only after
/// reading it again: an upgradeable one asks for [`Queue::pass_beside`]).
fn only_blocker(kind: &HoldKind, ahead: &[&str], blocker: usize) -> bool {
    (blocker == 0 || *kind == HoldKind::Read)
        && ahead
            .iter()
            .enumerate()
            .all(|(i, node)| i == blocker || node_kind(node) == Some(NodeKind::Read))
}

/// The error of a queued node found gone.
fn vanished(path: &str) -> Step {
    Step::Restart(Error::Unavailable {
        backend: BACKEND,
        message: format!("lock node {path} vanished while queued"),
        source: None,
    })
}

/// The children of `dir` as of a point the leader ordered after this call
/// ([`Live::behind_barrier`] on `anchor`).
async fn ordered_children(
    session: &Session,
    live: &Live,
    anchor: &str,
    dir: &str,
) -> Result<Result<Vec<String>, zk::Error>> {
    let listed = live.behind_barrier(anchor, |client| client.list_children(dir));
    session.call("list lock nodes", listed).await
}

/// The path of the child of `dir` carrying `marker`, looked up on session `epoch`.
async fn find_by_marker(session: &Session, dir: &str, marker: &str, epoch: u64) -> Option<String> {
    for _ in 0..3 {
        let live = session.live().ok().filter(|live| live.epoch == epoch)?;
        match ordered_children(session, &live, dir, dir).await {
            Ok(Ok(children)) => {
                return children
                    .into_iter()
                    .find(|c| c.starts_with(marker))
                    .map(|c| format!("{dir}/{c}"))
            }
            Ok(Err(err)) if !is_connection_loss(&err) => return None,
            _ => {
                session
                    .wait_usable(epoch, session.config().options.request_timeout)
                    .await;
            }
        }
    }
    None
}
