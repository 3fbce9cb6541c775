//! A permit of a semaphore, in Curator's `InterProcessSemaphoreV2` protocol: take the
//! mutex `<dir>/locks` (a queue of its own: FIFO among acquirers), create a lease node in
//! `<dir>/leases` (refused beside lock nodes of another kind in `<dir>`), hold it once the
//! leases are no more than the permits (else wait for a change of the leases' children),
//! then release the mutex.

use std::collections::HashSet;

use futures::future::join_all;
use lock_core::raw::{
    backend::{AcquireRequest, Acquired, HoldKind},
    plumbing::CleanupOnDrop,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use super::create::Queued;
use super::{check_kinds, step, Ask, Granted, Queue, QueuedNode, Step};
use crate::hold::ZkHold;
use crate::layout::{permit_data, permits_in, queue_order, semaphore_dirs, SEMAPHORE_LEASES};
use crate::session::Live;

/// The two nodes one permit acquisition may leave behind if dropped.
#[derive(Debug)]
pub(crate) struct PermitNodes {
    /// Its node in the `locks` mutex's queue.
    pub(crate) lock: CleanupOnDrop<QueuedNode>,
    /// Its lease node.
    pub(crate) lease: CleanupOnDrop<QueuedNode>,
}

impl Queue<'_> {
    /// One attempt at a permit of `permits` of the semaphore in `dir` on session `live`:
    /// the mutex node is `<dir>/locks/<lock_marker><seq>`, the lease node
    /// `<dir>/leases/<lease_marker><seq>`.
    pub(crate) async fn permit(
        &self,
        live: &Live,
        dir: &str,
        (lock_marker, lease_marker): (&str, &str),
        permits: u32,
        request: &AcquireRequest<'_>,
        nodes: &mut PermitNodes,
    ) -> Result<Option<Acquired<ZkHold>>, Step> {
        let (locks, leases) = semaphore_dirs(dir);
        let mutex = Ask {
            kind: &HoldKind::Mutex,
            data: &[],
            wait: request.wait,
            name: request.name,
            ordered: false,
        };
        let Some(taken) = self
            .queue_and_wait(live, &locks, lock_marker, &mutex, &mut nodes.lock)
            .await?
        else {
            return Ok(None);
        };
        // Our mutex node stays until the lease is decided: removed if we are dropped.
        nodes.lock.state_mut().armed = true;
        // Listed right behind the create: the names decide and are checked at once.
        let data = permit_data(permits);
        let Queued {
            name,
            czxid,
            ordered_at,
            children,
        } = self
            .create_node(live, &leases, lease_marker, &data, true, &mut nodes.lease)
            .await?;
        let path = format!("{leases}/{name}");
        let queued = (name.as_str(), ordered_at, children);
        let decided = match self.check_directory(live, dir, &name, request).await {
            Ok(()) => {
                self.wait_for_lease(live, &leases, queued, permits, request, nodes)
                    .await
            }
            Err(step) => Err(step),
        };
        if matches!(decided, Err(Step::Fail(_))) {
            // A refusal (another kind, another number of permits) takes nothing: the
            // lease node goes before the error is returned, not later in the background.
            self.withdraw(live, &path, &mut nodes.lease).await;
        }
        if matches!(decided, Ok(_) | Err(Step::Fail(_))) {
            // Release the `locks` mutex: at once when possible, else by the cleanup.
            if let Ok(Ok(()) | Err(zk::Error::NoNode)) = self
                .session
                .call(
                    "release semaphore mutex",
                    live.client.delete(&taken.path, None),
                )
                .await
            {
                nodes.lock.state_mut().armed = false;
            }
        }
        let Some(at) = decided? else {
            return Ok(None);
        };
        nodes.lease.state_mut().armed = false;
        Ok(Some(Granted { path, czxid, at }.acquired(live, request)))
    }

    /// Refuses a permit on a name held or queued for as another kind: the lock nodes of
    /// `dir` ([`check_kinds`]), listed after our lease node `lease` was created, so that an
    /// acquire of another kind queued before it shows here, and one queued later finds
    /// our lease node ([`Queue::leased`]) and refuses itself.
    async fn check_directory(
        &self,
        live: &Live,
        dir: &str,
        lease: &str,
        request: &AcquireRequest<'_>,
    ) -> Result<(), Step> {
        let mut losses = 0;
        loop {
            let step = match self.list(live, dir).await {
                Ok(Ok(children)) => {
                    let queue = queue_order(&children);
                    let kind = (request.kind, request.name);
                    return check_kinds(kind, false, &queue, lease);
                }
                Ok(Err(err)) => step(err, "list lock nodes"),
                Err(err) => Step::Retry(err),
            };
            self.tolerate(live, step, &mut losses).await?;
        }
    }

    /// Whether a semaphore holds or waits for permits in `dir`, for an acquire of `kind`
    /// that listed `dir`'s `children` after it queued: lease nodes in its `leases` child
    /// (an empty one is a container the server has not reaped yet, left by a semaphore
    /// that was, or by a permit refused beside a lock). A permit is never refused here.
    pub(super) async fn leased(
        &self,
        live: &Live,
        dir: &str,
        kind: &HoldKind,
        children: &[String],
    ) -> Result<bool, Step> {
        let permit = matches!(kind, HoldKind::Permit { .. });
        if permit || !children.iter().any(|child| child == SEMAPHORE_LEASES) {
            return Ok(false);
        }
        let (_, leases) = semaphore_dirs(dir);
        let read = live.client.check_stat(&leases);
        match self.session.call("read lease directory", read).await {
            Ok(Ok(stat)) => Ok(stat.is_some_and(|stat| stat.num_children > 0)),
            Ok(Err(err)) => Err(step(err, "read lease directory")),
            Err(err) => Err(Step::Retry(err)),
        }
    }

    /// Waits (holding the `locks` mutex) until the children of `leases` (`first`: as
    /// listed behind the create, if they were) are no more than `permits`, our lease node
    /// `name` among them, and returns the grant's instant: before a point the leader
    /// ordered, the create at `ordered_at` or, once that is no longer fresh
    /// ([`Queue::fresh`]), the barrier of a listing that confirms the grant. `None`: not
    /// granted and not to wait (the lease node is deleted). Every other lease node is read
    /// once for its number of permits: ours disagreeing is [`lock_core::Error::Conflict`].
    async fn wait_for_lease(
        &self,
        live: &Live,
        leases: &str,
        (name, ordered_at, mut first): (&str, Instant, Option<Vec<String>>),
        permits: u32,
        request: &AcquireRequest<'_>,
        nodes: &mut PermitNodes,
    ) -> Result<Option<Instant>, Step> {
        let ours = HoldKind::permit(permits);
        let path = format!("{leases}/{name}");
        let mut checked: HashSet<String> = HashSet::new();
        let mut losses = 0;
        let mut grant_at = ordered_at;
        // The next listing goes behind a barrier, to confirm a grant.
        let mut confirm = false;
        loop {
            // Past the listing, `confirming` means it went behind a barrier at `grant_at`.
            let confirming = std::mem::take(&mut confirm);
            // The listing behind the create first (no watch: the next listing sets one
            // if this one does not grant).
            let listed = match first.take() {
                Some(children) => Ok(Ok((children, None))),
                None => {
                    let at = Instant::now();
                    let listed = if confirming {
                        let listed = live
                            .behind_barrier(&path, |client| client.list_and_watch_children(leases));
                        self.session.call("list lease nodes", listed).await
                    } else {
                        let listed = live.client.list_and_watch_children(leases);
                        self.session.call("list lease nodes", listed).await
                    };
                    if confirming && matches!(listed, Ok(Ok(_))) {
                        grant_at = at;
                    }
                    listed.map(|listed| listed.map(|(children, watcher)| (children, Some(watcher))))
                }
            };
            let (children, watcher) = match listed {
                Ok(Ok(listed)) => listed,
                Ok(Err(err)) => {
                    self.tolerate(live, step(err, "list lease nodes"), &mut losses)
                        .await?;
                    continue;
                }
                Err(err) => {
                    self.tolerate(live, Step::Retry(err), &mut losses).await?;
                    continue;
                }
            };
            if !children.iter().any(|child| child == name) {
                return Err(Step::Restart(lock_core::Error::Unavailable {
                    backend: crate::error::BACKEND,
                    message: format!("lease node {leases}/{name} vanished while queued"),
                    source: None,
                }));
            }
            let unread: Vec<&String> = children
                .iter()
                .filter(|child| *child != name && !checked.contains(*child))
                .collect();
            let reads = join_all(unread.iter().map(|child| {
                let path = format!("{leases}/{child}");
                async move { live.client.get_data(&path).await }
            }));
            let read = match self.session.call("read lease nodes", reads).await {
                Ok(read) => read,
                Err(err) => {
                    self.tolerate(live, Step::Retry(err), &mut losses).await?;
                    continue;
                }
            };
            for (child, data) in unread.into_iter().zip(read) {
                let theirs = match data {
                    Ok((data, _)) => permits_in(&data),
                    // Gone, or unreadable (a foreign ACL): nothing to compare.
                    Err(_) => None,
                };
                if let Some(theirs) = theirs {
                    ours.check_beside(&HoldKind::permit(theirs), request.name)
                        .map_err(Step::Fail)?;
                }
                checked.insert(child.clone());
            }
            // Curator's rule: every child of `leases` counts, ours included.
            if children.len() <= usize::try_from(permits).unwrap_or(usize::MAX) {
                if confirming || self.fresh(live, grant_at) {
                    return Ok(Some(grant_at));
                }
                // Granted after a long wait: confirmed at once by a listing behind a
                // barrier (only then, not every recheck of the wait: a quorum write).
                confirm = true;
                continue;
            }
            if !request.wait {
                // Left to the cleanup if this delete fails.
                self.withdraw(live, &path, &mut nodes.lease).await;
                return Ok(None);
            }
            if let Some(watcher) = watcher {
                tokio::select! {
                    _ = watcher.changed() => {}
                    () = tokio::time::sleep(self.recheck()) => {}
                }
            }
        }
    }
}
