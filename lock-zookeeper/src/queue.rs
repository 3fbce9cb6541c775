//! The waiting queue of one acquisition: create the ephemeral sequential node (finding it
//! again after a connection loss), wait for it to be first by watching only its
//! predecessor, and remove it in the background if the acquisition does not hand it over.

use std::sync::Arc;
use std::time::Duration;

use lock_core::raw::{AcquireRequest, Acquired, Cleanup, CleanupOnDrop};
use lock_core::{Error, FencingToken, Result};
use tokio::time::{sleep, Instant};
use zookeeper_client as zk;

use crate::config::{ZkAcl, ZkConfig};
use crate::connection::{Live, Session};
use crate::error::{from_client, is_connection_loss, is_session_gone, BACKEND};
use crate::hold::{delete_in_epoch, lease_of, ZkHold};
use crate::layout::queue_order;

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

fn fencing(czxid: i64) -> Result<u64, Step> {
    u64::try_from(czxid).map_err(|_| {
        Step::Fail(Error::Protocol {
            backend: BACKEND,
            message: format!("lock node has an invalid czxid {czxid}"),
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

/// This session's node in the queue of a lock directory.
#[derive(Debug)]
struct Queued {
    /// Its name in the directory.
    name: String,
    /// Its czxid, the fencing token.
    czxid: u64,
    /// An instant before a point the leader ordered after the node existed (the create,
    /// or the barrier of the search).
    ordered_at: Instant,
    /// The directory's children as of that point or later, if they were listed.
    children: Option<Vec<String>>,
}

/// What one create request came to.
enum Created {
    /// The node, with the directory's children as of its create if they are known.
    Node {
        name: String,
        czxid: u64,
        children: Option<Vec<String>>,
    },
    /// The lock directory (or an ancestor) does not exist; nothing was created.
    NoDirectory,
    /// The directory refused the `setData` of a counted create; nothing was created.
    Refused,
    /// No reply or a failure: the node may or may not exist.
    Unknown(Step),
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
        match self.config().acl {
            ZkAcl::Open => zk::Acls::anyone_all(),
            ZkAcl::Creator => zk::Acls::creator_all(),
        }
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
        } = self.create(live, dir, marker, pending).await?;
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

    /// Creates the ephemeral sequential node `<dir>/<marker><seq>`; after a connection
    /// loss, finds it by its marker (owned by this session) instead of creating another.
    async fn create(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        pending: &mut CleanupOnDrop<QueuedNode>,
    ) -> Result<Queued, Step> {
        let prefix = format!("{dir}/{marker}");
        let acls = self.acls();
        let options = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let mut losses = 0;
        for _ in 0..CREATE_ATTEMPTS {
            // Dropped from here on, the acquire leaves a node it may have created to
            // `QueuedNode`'s cleanup, whose search is sent after the create.
            pending.state_mut().armed = true;
            let sent_at = Instant::now();
            let created = if self.session.counts_children() {
                self.create_counted(live, dir, &prefix, &options).await?
            } else {
                self.create_listed(live, dir, &prefix, &options).await
            };
            let lost = match created {
                Created::Node {
                    name,
                    czxid,
                    children,
                } => {
                    pending.state_mut().node = Some(format!("{dir}/{name}"));
                    return Ok(Queued {
                        name,
                        czxid,
                        ordered_at: sent_at,
                        children,
                    });
                }
                Created::NoDirectory => {
                    self.make_parents(live, dir).await?;
                    continue;
                }
                Created::Refused => {
                    tracing::debug!(%dir, "lock directory refuses setData; creates are listed instead");
                    self.session.stop_counting();
                    continue;
                }
                Created::Unknown(step) => step,
            };
            // The create may or may not have happened: look for our node.
            self.tolerate(live, lost, &mut losses).await?;
            loop {
                let searched_at = Instant::now();
                match self.find_own(live, dir, marker).await {
                    Ok(Some((name, czxid, children))) => {
                        pending.state_mut().node = Some(format!("{dir}/{name}"));
                        return Ok(Queued {
                            name,
                            czxid,
                            ordered_at: searched_at,
                            children: Some(children),
                        });
                    }
                    Ok(None) => break,
                    Err(step) => self.tolerate(live, step, &mut losses).await?,
                }
            }
        }
        Err(Step::Fail(Error::Unavailable {
            backend: BACKEND,
            message: format!("could not create a lock node in {dir}"),
            source: None,
        }))
    }

    /// Creates the node in a transaction with a `setData` of `dir` (to no data, as
    /// Curator and this crate create it), whose reply carries the directory's child
    /// count: a count of one is our node alone, the lock is ours without a listing. One
    /// write, about as fast as the create alone, where a listing behind the create waits
    /// for it on the server and then costs almost a round trip of its own. All
    /// operations of a transaction share its zxid, so the directory's new `mzxid` is the
    /// node's czxid (a create inside a transaction reports no stat on some servers).
    async fn create_counted(
        &self,
        live: &Live,
        dir: &str,
        prefix: &str,
        options: &zk::CreateOptions<'_>,
    ) -> Result<Created, Step> {
        let mut writer = live.client.new_multi_writer();
        let commit = writer
            .add_create(prefix, &[], options)
            .and_then(|()| writer.add_set_data(dir, &[], None))
            .map(|()| writer.commit())
            .map_err(|err| step(err, "create lock node"))?;
        let results = match self.session.call("create lock node", commit).await {
            Ok(Ok(results)) => results,
            Ok(Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::NoNode,
            })) => return Ok(Created::NoDirectory),
            Ok(Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoAuth,
            })) => return Ok(Created::Refused),
            Ok(Err(err)) => return Ok(Created::Unknown(step(err.into(), "create lock node"))),
            Err(err) => return Ok(Created::Unknown(Step::Retry(err))),
        };
        let mut results = results.into_iter();
        let (
            Some(zk::MultiWriteResult::Create { path, .. }),
            Some(zk::MultiWriteResult::SetData { stat }),
        ) = (results.next(), results.next())
        else {
            return Err(Step::Fail(Error::Protocol {
                backend: BACKEND,
                message: format!("unexpected reply to the create of a lock node in {dir}"),
                source: None,
            }));
        };
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        let children = (stat.num_children == 1).then(|| vec![name.clone()]);
        Ok(Created::Node {
            czxid: fencing(stat.mzxid)?,
            name,
            children,
        })
    }

    /// Creates the node and lists `dir` right behind it, both sent before either reply:
    /// the client sends each request when it is called, and the server applies a
    /// session's requests in order, so the listing sees the node.
    async fn create_listed(
        &self,
        live: &Live,
        dir: &str,
        prefix: &str,
        options: &zk::CreateOptions<'_>,
    ) -> Created {
        let created = live.client.create(prefix, &[], options);
        let listed = live.client.list_children(dir);
        let (created, listed) = tokio::join!(
            self.session.call("create lock node", created),
            self.session.call("list lock nodes", listed),
        );
        match created {
            Ok(Ok((stat, sequence))) => match fencing(stat.czxid) {
                Ok(czxid) => Created::Node {
                    name: format!("{}{sequence}", &prefix[dir.len() + 1..]),
                    czxid,
                    // A failed listing is repeated by the caller.
                    children: listed.ok().and_then(Result::ok),
                },
                Err(step) => Created::Unknown(step),
            },
            // No directory: the listing failed alike. Both are sent again.
            Ok(Err(zk::Error::NoNode)) => Created::NoDirectory,
            Ok(Err(err)) => Created::Unknown(step(err, "create lock node")),
            Err(err) => Created::Unknown(Step::Retry(err)),
        }
    }

    /// Our node in `dir` (by marker) with its czxid and the listing it was found in, if
    /// it exists and belongs to this session. Looked for after a barrier: the server we
    /// talk to now may not have applied yet a create that another one forwarded before
    /// the connection broke.
    async fn find_own(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
    ) -> Result<Option<(String, u64, Vec<String>)>, Step> {
        let children = match ordered_children(self.session, live, dir, dir).await {
            Ok(Ok(children)) => children,
            Ok(Err(zk::Error::NoNode)) => return Ok(None),
            Ok(Err(err)) => return Err(step(err, "list lock nodes")),
            Err(err) => return Err(Step::Retry(err)),
        };
        let Some(name) = children.iter().find(|c| c.starts_with(marker)).cloned() else {
            return Ok(None);
        };
        let path = format!("{dir}/{name}");
        match self
            .session
            .call("read lock node", live.client.get_data(&path))
            .await
        {
            Ok(Ok((_, stat))) if stat.ephemeral_owner == live.session_id() => {
                Ok(Some((name, fencing(stat.czxid)?, children)))
            }
            // Not this session's: never adopt it.
            Ok(Ok(_)) | Ok(Err(zk::Error::NoNode)) => Ok(None),
            Ok(Err(err)) => Err(step(err, "read lock node")),
            Err(err) => Err(Step::Retry(err)),
        }
    }

    /// Creates the missing ancestors of `dir` (the prefix included) as container nodes,
    /// which the server removes once they are empty again.
    async fn make_parents(&self, live: &Live, dir: &str) -> Result<(), Step> {
        let acls = self.acls();
        let options = zk::CreateMode::Container.with_acls(acls);
        let ends = dir
            .char_indices()
            .filter(|(i, c)| *c == '/' && *i > 0)
            .map(|(i, _)| i)
            .chain(std::iter::once(dir.len()));
        for end in ends {
            let path = &dir[..end];
            match self
                .session
                .call(
                    "create lock directory",
                    live.client.create(path, &[], &options),
                )
                .await
            {
                Ok(Ok(_)) | Ok(Err(zk::Error::NodeExists)) => {}
                Ok(Err(zk::Error::NoNode)) => {
                    return Err(Step::Fail(Error::config(format!(
                        "cannot create {path}: the chroot {:?} does not exist on the server",
                        self.config().chroot.as_deref().unwrap_or("/")
                    ))))
                }
                Ok(Err(err)) => return Err(step(err, "create lock directory")),
                // The create is retried and meets NoNode again if this one failed.
                Err(_) => return Ok(()),
            }
        }
        Ok(())
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
