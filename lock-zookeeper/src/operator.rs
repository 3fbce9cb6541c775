//! What an operator asks and does: what a lock directory shows ([`inspect`]: its lock
//! nodes in queue order (those granted by [`HoldKind::granted_behind`] hold or lead, the
//! rest wait; a semaphore's lease nodes up to its permits hold), their owner tokens,
//! sessions, creation times, kinds and, for election candidates (`latch-` nodes), values,
//! the holders' fencing tokens (a leader's term), and the token floor), a feed of its changes
//! ([`changes()`]), which directories of a namespace have a holder ([`list()`]), and breaking
//! a hold ([`force_release()`]).
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
//!
//! The feed of changes is in `operator/changes.rs`, the listing in `operator/list.rs`,
//! the break in `operator/force_release.rs`.

mod changes;
mod force_release;
mod list;

pub(crate) use changes::changes;
pub(crate) use force_release::force_release;
pub(crate) use list::list;

use std::time::{Duration, UNIX_EPOCH};

use futures::future::join_all;
use lock_core::raw::backend::HoldKind;
use lock_core::{FencingToken, Occupancy, Participant, Result};
use zookeeper_client as zk;

use crate::error::from_client;
use crate::layout::{
    node_kind, owner_token, permits_in, queue_order, semaphore_dirs, NodeKind, SEMAPHORE_LEASES,
};
use crate::queue::{fencing, Step};
use crate::session::{Live, Session};

const WHAT: &str = "inspect lock directory";

/// The occupancy of lock directory `dir`.
///
/// # Errors
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) when the directory refuses READ (`NoAuth`); connection
/// errors, or [`Error::Unavailable`](lock_core::Error::Unavailable) while no session is established.
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
        let shown = kind.shown();
        let candidate = matches!(kind, HoldKind::Candidate { .. });
        let value = candidate.then_some(value).flatten();
        // Each proclaim is one `setData` of the node: its data version counts them.
        let version = candidate.then(|| u64::try_from(stat.version).unwrap_or(0));
        kinds.push(kind);
        let shown_as = |entry: Participant| entry.value(value).value_version(version).kind(shown);
        if granted {
            holders.push(shown_as(holder(node, &stat)?));
        } else {
            if waiters.is_empty() {
                floor = floor.min(FencingToken(token(stat.czxid)?.0.saturating_sub(1)));
            }
            waiters.push(shown_as(participant(node, &stat)));
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
        .map(|(node, stat, _)| participant(node, &stat).kind(Some(HoldKind::permit(permits))))
        .collect();
    occupancy(present, waiting, pzxid, |_| HoldKind::permit(permits))
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
