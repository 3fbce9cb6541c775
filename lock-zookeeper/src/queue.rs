//! The waiting queue of one acquisition: create the ephemeral sequential node (in
//! [`create`]), wait for its kind to be granted behind the nodes ahead by watching only
//! the node that must go first (in [`ahead`]: the predecessor; for a reader the first
//! writer ahead), and remove it in the background if the acquisition does not hand it
//! over. A permit of a semaphore ([`semaphore`]) runs that queue on the semaphore's
//! `locks` mutex, then waits for a lease.

use std::sync::Arc;
use std::time::Duration;

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
use crate::layout::{node_data, node_kind, queue_order};
use crate::session::{Live, Session};

mod ahead;
mod create;
mod semaphore;

use ahead::{only_blocker, Ahead};
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
