//! What a lock directory shows ([`inspect`]): its lock nodes in queue order (the first
//! holds, the rest wait), their owner tokens, the holder's fencing token, and the token
//! floor.
//!
//! Two round trips at most, each under the request timeout: a barrier, the listing
//! of the directory (with its stat) and the stats of its ancestors, sent together; then
//! the stats of the lock nodes listed, sent together (`exists` needs no READ on the node,
//! so nodes with a creator-only ACL are read as well). An empty or missing directory
//! costs the first round trip only.
//!
//! # Token floor
//! The directory's `pzxid` (the zxid of its last child change, its own create at the
//! least), lowered below the second lock node's czxid when there is one: every lock node
//! created later has a greater czxid, and every waiter already queued is granted a token
//! above the floor as well. Without a directory, the `pzxid` of its deepest existing
//! ancestor (the root at the least): the directory's delete, if it ever existed, changed
//! that ancestor's children (or a deeper one's, since deleted), so the floor is also at
//! least every token the name was ever granted.

use futures::future::join_all;
use lock_core::{FencingToken, Occupancy, Participant, Result};
use zookeeper_client as zk;

use crate::connection::Session;
use crate::error::from_client;
use crate::layout::{owner_token, queue_order};
use crate::queue::{fencing, Step};

const WHAT: &str = "inspect lock directory";

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
    let queue = queue_order(&children);
    let nodes: Vec<String> = queue.iter().map(|node| format!("{dir}/{node}")).collect();
    let stats = session
        .call(
            WHAT,
            join_all(nodes.iter().map(|path| live.client.check_stat(path))),
        )
        .await?;
    // A node gone since the listing left the queue; the first one left holds.
    let mut present = Vec::with_capacity(queue.len());
    for (node, stat) in queue.into_iter().zip(stats) {
        if let Some(stat) = stat.map_err(|err| from_client(WHAT, err))? {
            present.push((node, token(stat.czxid)?, stat.ephemeral_owner));
        }
    }
    let mut floor = token(stat.pzxid)?;
    if let Some((_, second, _)) = present.get(1) {
        floor = floor.min(FencingToken(second.0.saturating_sub(1)));
    }
    let mut participants = present.into_iter().map(|(node, czxid, owner)| {
        // ZooKeeper writes session ids in hex; 0 is no session (a persistent node).
        let session = (owner != 0).then(|| format!("0x{owner:x}"));
        (
            Participant::new(owner_token(node).map(str::to_owned)).session(session),
            czxid,
        )
    });
    let holder = participants
        .next()
        .map(|(holder, czxid)| holder.fencing_token(Some(czxid)));
    let waiters = participants.map(|(waiter, _)| waiter).collect();
    Ok(Occupancy::new(holder, waiters).token_floor(Some(floor)))
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
