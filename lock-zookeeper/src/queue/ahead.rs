//! What holds a queued node back: the nodes ahead of it that its kind must wait for
//! ([`Queue::blocker`]), the watch on the one that must go first
//! ([`Queue::await_change`]), and the passes beside an upgradeable reader.

use std::pin::pin;

use futures::FutureExt;
use lock_core::raw::backend::HoldKind;
use lock_core::Result;
use tokio::time::sleep;
use zookeeper_client as zk;

use super::{step, vanished, Queue, Step};
use crate::layout::{node_kind, queue_order, NodeKind, BESIDE, DOWNGRADED};
use crate::session::Live;

/// What a queued node finds ahead of it ([`Queue::blocker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ahead {
    /// Granted.
    Granted,
    /// Granted once it passes the upgradeable reader at this index of the nodes ahead.
    Passes(usize),
    /// Waits for the node at this index of the nodes ahead.
    Blocked(usize),
}

impl Queue<'_> {
    /// Watches `blocker` until it changes. `true` once it is gone (its deletion seen, or
    /// found gone); `false` after any other change (data, a session's end) or failure,
    /// after which the caller lists again. With `own` (our node, when the blocker is
    /// the only node ahead that holds it back) that node is watched too, in the same
    /// round trip: the server sends a session's events in order, so our node's deletion
    /// is seen before a later deletion of the blocker, and a grant never rests on a node
    /// that vanished. Every `recheck` the blocker's stat (and our node) are read again,
    /// since a push may be missed.
    pub(super) async fn await_change(
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

    /// What a node of `kind` behind `ahead` (nodes of `dir`, queue order) finds
    /// ([`HoldKind::granted_behind`] over their kinds, a writer's node read by its mark):
    /// granted, granted once it passes the upgradeable reader at an index
    /// ([`Queue::pass_beside`]), or blocked by the node at an index. The last node ahead
    /// blocks an exclusive kind; a reader the first writer ahead (as Curator's reader
    /// watches), else the first upgradeable reader ahead (a second one waits for it); an
    /// upgradeable reader the last node ahead that is no reader.
    pub(super) async fn blocker(
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
    pub(super) async fn pass_beside(
        &self,
        live: &Live,
        beside: &str,
        own: &str,
    ) -> Result<bool, Step> {
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
}

/// Whether `ahead[blocker]` is the only node of `ahead` (queue order) that holds back a
/// node of `kind`, so that its deletion grants it: no node joins the queue ahead of a
/// queued one (sequence numbers only grow while the directory has children), and
/// [`Queue::blocker`] found every node before it not in the way. For an exclusive kind
/// the blocker is the one node ahead; a reader's blocker may have readers around it, and
/// no writer's node (a downgraded or upgradeable one, which a reader passes only after
/// reading it again: an upgradeable one asks for [`Queue::pass_beside`]).
pub(super) fn only_blocker(kind: &HoldKind, ahead: &[&str], blocker: usize) -> bool {
    (blocker == 0 || *kind == HoldKind::Read)
        && ahead
            .iter()
            .enumerate()
            .all(|(i, node)| i == blocker || node_kind(node) == Some(NodeKind::Read))
}
