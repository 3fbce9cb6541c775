//! Putting an acquisition's node in the queue: the create (counting the directory's
//! children with it, or listing them right behind it), the search for the node after a
//! lost reply, and the missing parents.

use lock_core::raw::plumbing::CleanupOnDrop;
use lock_core::Error;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{fencing, ordered_children, step, Queue, QueuedNode, Step, CREATE_ATTEMPTS};
use crate::error::BACKEND;
use crate::layout::queue_order;
use crate::session::Live;

/// This session's node in the queue of a lock directory.
#[derive(Debug)]
pub(super) struct Queued {
    /// Its name in the directory.
    pub(super) name: String,
    /// Its czxid, the fencing token.
    pub(super) czxid: u64,
    /// An instant before a point the leader ordered after the node existed (the create,
    /// or the barrier of the search).
    pub(super) ordered_at: Instant,
    /// The directory's children as of that point or later, if they were listed.
    pub(super) children: Option<Vec<String>>,
}

/// One create of an ephemeral sequential node: in `dir`, named `prefix` (`dir` and the
/// marker) and the sequence, with `data` and `options`.
#[derive(Clone, Copy)]
struct NewNode<'a> {
    dir: &'a str,
    prefix: &'a str,
    data: &'a [u8],
    options: &'a zk::CreateOptions<'a>,
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

impl Queue<'_> {
    /// Creates the ephemeral sequential node `<dir>/<marker><seq>` with data `data`; after
    /// a connection loss, finds it by its marker (owned by this session) instead of
    /// creating another.
    pub(super) async fn create(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        data: &[u8],
        pending: &mut CleanupOnDrop<QueuedNode>,
    ) -> Result<Queued, Step> {
        self.create_node(live, dir, marker, data, false, pending)
            .await
    }

    /// [`Queue::create`], the directory listed right behind the create when `listed`
    /// (a caller that needs the names, not only the count, saves a round trip).
    pub(super) async fn create_node(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        data: &[u8],
        listed: bool,
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
            // A count saves the listing when the node is alone; when the last create
            // found others queued, a listing sent with the create saves a round trip
            // (and the count's write).
            let counted = !listed && self.session.counts_children() && !self.session.queue_seen();
            let node = NewNode {
                dir,
                prefix: &prefix,
                data,
                options: &options,
            };
            let created = if counted {
                self.create_counted(live, &node).await?
            } else {
                self.create_listed(live, &node).await
            };
            let lost = match created {
                Created::Node {
                    name,
                    czxid,
                    children,
                } => {
                    pending.state_mut().node = Some(format!("{dir}/{name}"));
                    if !listed {
                        let alone = children
                            .as_deref()
                            .is_some_and(|children| queue_order(children).len() <= 1);
                        self.session.saw_queue(!alone);
                    }
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
    async fn create_counted(&self, live: &Live, node: &NewNode<'_>) -> Result<Created, Step> {
        let mut writer = live.client.new_multi_writer();
        let commit = writer
            .add_create(node.prefix, node.data, node.options)
            .and_then(|()| writer.add_set_data(node.dir, &[], None))
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
                message: format!(
                    "unexpected reply to the create of a lock node in {}",
                    node.dir
                ),
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
    async fn create_listed(&self, live: &Live, node: &NewNode<'_>) -> Created {
        let created = live.client.create(node.prefix, node.data, node.options);
        let listed = live.client.list_children(node.dir);
        let (created, listed) = tokio::join!(
            self.session.call("create lock node", created),
            self.session.call("list lock nodes", listed),
        );
        match created {
            Ok(Ok((stat, sequence))) => match fencing(stat.czxid) {
                Ok(czxid) => Created::Node {
                    name: format!("{}{sequence}", &node.prefix[node.dir.len() + 1..]),
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
