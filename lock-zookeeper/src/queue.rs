//! The waiting queue of one acquisition: create the ephemeral sequential node (in
//! [`create`]), wait for it to be first by watching only its predecessor, and remove it
//! in the background if the acquisition does not hand it over.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{AcquireRequest, Acquired, Cleanup, CleanupOnDrop};
use lock_core::{Error, FencingToken, Result};
use tokio::time::{sleep, Instant};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{from_client, is_connection_loss, is_session_gone, BACKEND};
use crate::hold::{delete_in_epoch, lease_of, ZkHold};
use crate::layout::{node_data, queue_order};
use crate::session::{Live, Session};

mod create;

use create::Queued;

/// Tries to create the node of one attempt (parents missing, connection lost).
const CREATE_ATTEMPTS: usize = 5;
/// Connection losses tolerated within one attempt before giving up on it.
const LOSS_RETRIES: usize = 20;
/// Shortest pause after a connection loss.
const LOSS_PAUSE: Duration = Duration::from_millis(50);

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

    /// One attempt on session `live`: queue a node, then wait for it to be first.
    pub(crate) async fn attempt(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        request: &AcquireRequest<'_>,
        pending: &mut CleanupOnDrop<QueuedNode>,
    ) -> Result<Option<Acquired<ZkHold>>, Step> {
        let Queued {
            name,
            czxid,
            ordered_at,
            children,
        } = self
            .create(live, dir, marker, node_data(request.kind), pending)
            .await?;
        let path = format!("{dir}/{name}");
        let mut losses = 0;
        // The create (or the barrier of the search) was ordered by the leader after
        // `ordered_at`: the first look needs no barrier of its own, and mostly came with
        // the create. A grant's validity runs from such a point, never from a read a
        // cut-off follower may answer from its own copy.
        let mut first = Some((ordered_at, children));
        loop {
            let (listed_at, listed) = match first.take() {
                Some((at, Some(children))) => (at, Ok(Ok(children))),
                Some((at, None)) => (
                    at,
                    self.session
                        .call("list lock nodes", live.client.list_children(dir))
                        .await,
                ),
                None => (
                    Instant::now(),
                    ordered_children(self.session, live, &path, dir).await,
                ),
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
                return Err(Step::Restart(Error::Unavailable {
                    backend: BACKEND,
                    message: format!("lock node {path} vanished while queued"),
                    source: None,
                }));
            };
            if index == 0 {
                // First: the lock is ours, or we lead. The node is this session's (created
                // on it, or found by its marker and its `ephemeralOwner` checked: never
                // one left by an older session, CURATOR-696), and the listing came on the
                // same session, whose expiry fails every later request.
                pending.state_mut().armed = false;
                let hold = ZkHold::new(live, path);
                return Ok(Some(Acquired {
                    hold,
                    fencing_token: FencingToken(czxid),
                    requested_at: listed_at,
                    lease: lease_of(live, request.ttl),
                    session: live.epoch,
                }));
            }
            if !request.wait {
                let deleted = self
                    .session
                    .call("delete lock node", live.client.delete(&path, None))
                    .await;
                if matches!(deleted, Ok(Ok(()) | Err(zk::Error::NoNode))) {
                    pending.state_mut().armed = false;
                }
                return Ok(None);
            }
            let predecessor = format!("{dir}/{}", queue[index - 1]);
            match self
                .session
                .call(
                    "watch predecessor",
                    live.client.get_and_watch_data(&predecessor),
                )
                .await
            {
                Ok(Ok((_, _, watcher))) => {
                    tokio::select! {
                        _ = watcher.changed() => {}
                        () = sleep(self.recheck()) => {}
                    }
                }
                // Gone already: look again at once.
                Ok(Err(zk::Error::NoNode)) => {}
                Ok(Err(err)) => {
                    self.tolerate(live, step(err, "watch predecessor"), &mut losses)
                        .await?;
                }
                Err(err) => self.tolerate(live, Step::Retry(err), &mut losses).await?,
            }
        }
    }

    /// Lets a connection loss pass (waiting for the reconnect) a bounded number of
    /// times; passes any other step on.
    async fn tolerate(&self, live: &Live, step: Step, losses: &mut usize) -> Result<(), Step> {
        match step {
            Step::Retry(err) => {
                *losses += 1;
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

/// The children of `dir` as of a point the leader ordered after this call: a
/// [`Live::barrier`] on `anchor`, then the listing, sent together.
async fn ordered_children(
    session: &Session,
    live: &Live,
    anchor: &str,
    dir: &str,
) -> Result<Result<Vec<String>, zk::Error>> {
    let barrier = live.barrier(anchor);
    let list = live.client.list_children(dir);
    session
        .call("list lock nodes", async move {
            let (barrier, list) = tokio::join!(barrier, list);
            barrier.and(list)
        })
        .await
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
