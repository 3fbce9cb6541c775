//! The `zk://` backend: ephemeral sequential nodes in Curator's layout, lowest sequence
//! holds the lock, each waiter watches only its predecessor.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::raw::{
    AcquireRequest, Acquired, Backend, BackendRelease, RenewItem, RenewOutcome, SessionStatus,
};
use lock_core::raw::{Connect, LeaseClient, LockUrl};
use lock_core::LockOptions;
use lock_core::{Capabilities, Error, FencingSource, FencingToken, LockName, LostReason, Result};
use tokio::sync::watch;
use tokio::time::{sleep, Instant};
use zookeeper_client as zk;

use crate::client::{Live, Session};
use crate::config::{forbidden_in_path, ZkAcl, ZkConfig};
use crate::error::{from_zk, is_connection_loss, is_session_gone, BACKEND};
use crate::lease::{delete_in_epoch, lease_of, renew, ZkHold};

/// The URL schemes of this backend.
pub const SCHEMES: &[&str] = &["zk"];

/// A lock client on ZooKeeper.
pub type ZkLock = LeaseClient<ZkBackend>;

/// What Curator's InterProcessMutex names its nodes after the protection prefix.
const LOCK_NODE: &str = "lock-";
/// Curator's protection prefix.
const PROTECTED: &str = "_c_";
/// Tries to create the node of one attempt (parents missing, connection lost).
const CREATE_ATTEMPTS: usize = 5;
/// Connection losses tolerated within one attempt before giving up on it.
const LOSS_RETRIES: usize = 20;
/// New sessions an acquire waits through before failing.
const RESTARTS: usize = 5;
/// Shortest pause after a connection loss.
const LOSS_PAUSE: Duration = Duration::from_millis(50);

/// Escapes a lock name into one ZooKeeper path segment.
///
/// `%`, `/` and the characters ZooKeeper rejects are percent-encoded byte by byte; the
/// segments `.` and `..` become `%2E` and `%2E%2E`. Distinct names give distinct
/// segments, and plain names (e.g. `jobs`) are unchanged, so a Curator
/// InterProcessMutex on `<base>/jobs` is the same lock as the name `jobs`.
pub fn escape_segment(name: &str) -> String {
    match name {
        "." => return "%2E".to_owned(),
        ".." => return "%2E%2E".to_owned(),
        _ => {}
    }
    lock_core::raw::escape_where(name, |c| c == '/' || forbidden_in_path(c))
}

/// The directory of lock `name` under `base`: `<base>/<escaped name>`.
pub fn lock_dir(base: &str, name: &LockName) -> String {
    format!("{base}/{}", escape_segment(name.as_str()))
}

/// The lock nodes among the `children` of a lock directory, in queue order: the names
/// that end in `lock-` and the ten digits ZooKeeper appends to a sequential node (ours
/// and Curator's `_c_<uuid>-lock-<seq>`), ordered by those digits as Curator orders
/// them. Any other child is no lock node and has no place in the queue, whatever its
/// name sorts like (Curator does not skip it, but can only be blocked by it: it grants
/// the lock to the first child alone, which is then our first lock node too or none).
pub fn queue_order(children: &[String]) -> Vec<&str> {
    let mut nodes: Vec<(&str, &str)> = children
        .iter()
        .filter_map(|child| Some((sequence(child)?, child.as_str())))
        .collect();
    nodes.sort_unstable();
    nodes.into_iter().map(|(_, child)| child).collect()
}

/// The sequence of a lock node: the ten digits after its last `lock-`.
fn sequence(child: &str) -> Option<&str> {
    let digits = &child[child.rfind(LOCK_NODE)? + LOCK_NODE.len()..];
    (digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
}

/// The protocol half of a ZooKeeper lock client. See the crate docs.
pub struct ZkBackend {
    session: Arc<Session>,
}

/// Opened with one session: fails with [`Error::InvalidConfig`] for a bad configuration
/// and [`Error::Connection`] when no session is established within `connect_timeout`.
#[async_trait]
impl Connect for ZkBackend {
    const SCHEMES: &'static [&'static str] = crate::SCHEMES;
    type Config = ZkConfig;

    fn config_from_url(url: &LockUrl) -> Result<ZkConfig> {
        ZkConfig::from_url(url)
    }

    fn lock_options(config: &ZkConfig) -> &LockOptions {
        &config.options
    }

    async fn open(config: ZkConfig) -> Result<ZkBackend> {
        config.validate()?;
        let session = Session::connect(config).await?;
        Ok(ZkBackend { session })
    }
}

impl ZkBackend {
    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        self.session.config()
    }

    /// The directory of lock `name` (relative to the chroot, if any).
    pub fn lock_dir(&self, name: &LockName) -> String {
        lock_dir(&self.config().base, name)
    }

    /// The id of the live session, `None` while none is established.
    pub fn session_id(&self) -> Option<i64> {
        self.session.live().ok().map(|live| live.session_id())
    }

    /// The negotiated session timeout of the live session.
    pub fn session_timeout(&self) -> Option<Duration> {
        self.session
            .live()
            .ok()
            .map(|live| live.client.session_timeout())
    }

    /// The epoch of the newest session: 1 for the first, +1 for each replacement.
    pub fn session_epoch(&self) -> u64 {
        self.session.epoch()
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
    async fn attempt(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        request: &AcquireRequest<'_>,
        pending: &mut Pending,
    ) -> Result<Option<Acquired<ZkHold>>, Step> {
        let (name, czxid, created_at) = self.create(live, dir, marker, pending).await?;
        let path = format!("{dir}/{name}");
        let mut losses = 0;
        // The create was ordered by the leader after `created_at`: the first look needs no
        // barrier of its own. A grant's validity runs from such a point, never from a
        // read a cut-off follower may answer from its own copy.
        let mut ordered_at = Some(created_at);
        loop {
            let (listed_at, listed) = match ordered_at.take() {
                Some(at) => (
                    at,
                    self.session
                        .call("list lock nodes", live.client.list_children(dir))
                        .await,
                ),
                None => (
                    Instant::now(),
                    ordered_children(&self.session, live, &path, dir).await,
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
                pending.disarm();
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
                    pending.disarm();
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
    /// Returns its name, its czxid and an instant before a point the leader ordered after
    /// the node existed (the create, or the barrier of the search).
    async fn create(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
        pending: &mut Pending,
    ) -> Result<(String, u64, Instant), Step> {
        let prefix = format!("{dir}/{marker}");
        let acls = self.acls();
        let options = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let mut losses = 0;
        for _ in 0..CREATE_ATTEMPTS {
            pending.armed = true;
            let sent_at = Instant::now();
            let created = self
                .session
                .call(
                    "create lock node",
                    live.client.create(&prefix, &[], &options),
                )
                .await;
            let lost = match created {
                Ok(Ok((stat, sequence))) => {
                    let name = format!("{marker}{sequence}");
                    pending.node = Some(format!("{dir}/{name}"));
                    return Ok((name, fencing(stat.czxid)?, sent_at));
                }
                Ok(Err(zk::Error::NoNode)) => {
                    self.make_parents(live, dir).await?;
                    continue;
                }
                Ok(Err(err)) => step(err, "create lock node"),
                Err(err) => Step::Retry(err),
            };
            // The create may or may not have happened: look for our node.
            self.tolerate(live, lost, &mut losses).await?;
            loop {
                let searched_at = Instant::now();
                match self.find_own(live, dir, marker).await {
                    Ok(Some((name, czxid))) => {
                        pending.node = Some(format!("{dir}/{name}"));
                        return Ok((name, czxid, searched_at));
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

    /// Our node in `dir` (by marker), if it exists and belongs to this session. Looked
    /// for after a barrier: the server we talk to now may not have applied yet a create
    /// that another one forwarded before the connection broke.
    async fn find_own(
        &self,
        live: &Live,
        dir: &str,
        marker: &str,
    ) -> Result<Option<(String, u64)>, Step> {
        let children = match ordered_children(&self.session, live, dir, dir).await {
            Ok(Ok(children)) => children,
            Ok(Err(zk::Error::NoNode)) => return Ok(None),
            Ok(Err(err)) => return Err(step(err, "list lock nodes")),
            Err(err) => return Err(Step::Retry(err)),
        };
        let Some(name) = children.into_iter().find(|c| c.starts_with(marker)) else {
            return Ok(None);
        };
        let path = format!("{dir}/{name}");
        match self
            .session
            .call("read lock node", live.client.get_data(&path))
            .await
        {
            Ok(Ok((_, stat))) if stat.ephemeral_owner == live.session_id() => {
                Ok(Some((name, fencing(stat.czxid)?)))
            }
            // Not this session's: never adopt it.
            Ok(Ok(_)) | Ok(Err(zk::Error::NoNode)) => Ok(None),
            Ok(Err(err)) => Err(step(err, "read lock node")),
            Err(err) => Err(Step::Retry(err)),
        }
    }

    /// Creates the missing ancestors of `dir` (the base included) as container nodes,
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

/// How an attempt ends when it does not end with a result.
#[derive(Debug)]
enum Step {
    /// A connection loss or a request deadline: the session may still be fine.
    Retry(Error),
    /// The session is gone (or our node vanished): start over on the next session.
    Restart(Error),
    /// Give up.
    Fail(Error),
}

impl Step {
    fn into_error(self) -> Error {
        match self {
            Step::Retry(err) | Step::Restart(err) | Step::Fail(err) => err,
        }
    }
}

fn step(err: zk::Error, what: &str) -> Step {
    if is_connection_loss(&err) {
        Step::Retry(from_zk(err, what))
    } else if is_session_gone(&err) {
        Step::Restart(from_zk(err, what))
    } else {
        Step::Fail(from_zk(err, what))
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
struct Pending {
    session: Arc<Session>,
    dir: String,
    marker: String,
    epoch: u64,
    /// A create was sent: a node may exist even if its path is unknown.
    armed: bool,
    /// The node's path once known.
    node: Option<String>,
}

impl Pending {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(dir = %self.dir, "acquire dropped outside a runtime; the session timeout removes its node");
            return;
        };
        let session = Arc::clone(&self.session);
        let (dir, marker, node, epoch) = (
            std::mem::take(&mut self.dir),
            std::mem::take(&mut self.marker),
            self.node.take(),
            self.epoch,
        );
        runtime.spawn(async move {
            let path = match node {
                Some(path) => Some(path),
                None => find_by_marker(&session, &dir, &marker, epoch).await,
            };
            if let Some(path) = path {
                delete_in_epoch(&session, &path, epoch).await;
            }
        });
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

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", self.config())
            .field("epoch", &self.session.epoch())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.config().endpoint())
    }
}

#[async_trait]
impl Backend for ZkBackend {
    type Hold = ZkHold;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(BACKEND)
            .fair(true)
            .per_lock_ttl(false)
            .min_ttl(Duration::from_secs(1))
            .durable(true)
            .fencing(FencingSource::CreateRevision)
    }

    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Option<Acquired<ZkHold>>> {
        let dir = self.lock_dir(request.name);
        let marker = format!("{PROTECTED}{}-{LOCK_NODE}", request.token);
        let mut restarts = 0;
        loop {
            let outcome = match self.session.live() {
                Ok(live) => {
                    let mut pending = Pending {
                        session: Arc::clone(&self.session),
                        dir: dir.clone(),
                        marker: marker.clone(),
                        epoch: live.epoch,
                        armed: false,
                        node: None,
                    };
                    self.attempt(&live, &dir, &marker, &request, &mut pending)
                        .await
                }
                Err(err) => Err(Step::Restart(err)),
            };
            match outcome {
                Ok(acquired) => return Ok(acquired),
                Err(Step::Restart(err)) if request.wait && restarts < RESTARTS => {
                    tracing::debug!(lock = %request.name, error = %err, "acquire starts over on a new session");
                    restarts += 1;
                    let epoch = self.session.epoch();
                    self.session
                        .wait_usable(epoch, self.config().connect_timeout)
                        .await;
                }
                Err(step) => return Err(step.into_error()),
            }
        }
    }

    async fn renew(&self, items: &[RenewItem<'_, ZkHold>]) -> Result<Vec<RenewOutcome>> {
        renew(&self.session, items).await
    }

    async fn release(&self, hold: &ZkHold) -> Result<BackendRelease> {
        let live = match self.session.live() {
            Ok(live) => live,
            Err(_) if hold.epoch <= self.session.epoch() => {
                // The hold's session is gone, and its ephemeral node with it.
                return Ok(BackendRelease::NotOwner(LostReason::SessionExpired));
            }
            Err(err) => return Err(err),
        };
        if live.epoch != hold.epoch || live.session_id() != hold.session_id {
            return Ok(BackendRelease::NotOwner(LostReason::SessionExpired));
        }
        match self
            .session
            .call("delete lock node", live.client.delete(&hold.path, None))
            .await?
        {
            Ok(()) => Ok(BackendRelease::Released),
            Err(zk::Error::NoNode) => Ok(BackendRelease::NotOwner(LostReason::Vanished)),
            Err(err) => Err(from_zk(err, "delete lock node")),
        }
    }

    fn session(&self) -> Option<watch::Receiver<SessionStatus>> {
        Some(self.session.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_one_distinct_segment_each() {
        let names = [
            "jobs",
            "jobs/daily",
            "jobs/",
            "jobs//daily",
            "jobs%2Fdaily",
            "jobs%252Fdaily",
            ".",
            "..",
            "%2E",
            "...",
            "a\u{E000}b",
            "a\u{FFF5}b",
            "zookeeper",
            "jöbs",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let segment = escape_segment(name);
            assert!(!segment.contains('/'), "{name} -> {segment}");
            assert!(segment != "." && segment != "..", "{name} -> {segment}");
            assert!(
                !segment.chars().any(forbidden_in_path),
                "{name} -> {segment}"
            );
            assert!(seen.insert(segment.clone()), "{name} collides: {segment}");
        }
        assert_eq!(escape_segment("jobs"), "jobs");
        assert_eq!(escape_segment("jobs/daily"), "jobs%2Fdaily");
        assert_eq!(escape_segment("..."), "...");
        let name = LockName::new("a/b").unwrap();
        assert_eq!(lock_dir("/locks", &name), "/locks/a%2Fb");
    }

    #[test]
    fn nodes_queue_by_sequence_like_curator_and_other_children_not_at_all() {
        let children = [
            "_c_9e1-lock-0000000003",
            "foo",
            "lock-",
            "lock-abc",
            "x-lock-0",
            "0000000000",
            "_c_a22-lock-0000000001",
            "lock-0000000000",
            "_c_0b7-lock-0000000002",
            "_c_0b7-lock-00000000021",
        ]
        .map(String::from);
        assert_eq!(
            queue_order(&children),
            [
                "lock-0000000000",
                "_c_a22-lock-0000000001",
                "_c_0b7-lock-0000000002",
                "_c_9e1-lock-0000000003",
            ]
        );
        assert!(queue_order(&[]).is_empty());
    }
}
