//! Listing a namespace: the names whose lock directory has a lock node.

use futures::future::join_all;
use futures::{stream, StreamExt, TryStreamExt};
use lock_core::{LockName, Result};
use zookeeper_client as zk;

use crate::error::{from_client, read_found};
use crate::layout::{queue_order, unescape_segment, SEMAPHORE_LEASES};
use crate::session::{Live, Session};

const LIST: &str = "list lock directories";
/// Directories read per `multiRead` of a listing.
const LIST_CHUNK: usize = 500;
/// `multiRead` requests of one listing in flight at once.
const CHUNKS_IN_FLIGHT: usize = 4;

/// The names under namespace root `root` that start with `prefix` and whose directory has
/// a lock node, sorted.
///
/// A barrier and the listing of `root`, sent together; then the children of the
/// directories whose names start with `prefix`, [`LIST_CHUNK`] directories per
/// `multiRead`, [`CHUNKS_IN_FLIGHT`] requests in flight, each under the request timeout.
/// Children of `root` that no name escapes to (not a lock directory) are skipped; a
/// missing `root` has no names.
///
/// # Errors
/// [`Error::InvalidConfig`](lock_core::Error::InvalidConfig) when a directory refuses
/// READ; connection errors, or [`Error::Unavailable`](lock_core::Error::Unavailable)
/// while no session is established.
pub(crate) async fn list(session: &Session, root: &str, prefix: &str) -> Result<Vec<LockName>> {
    let live = session.live()?;
    let (barrier, listed) = session
        .call(LIST, async {
            tokio::join!(live.barrier(root), live.client.list_children(root))
        })
        .await?;
    barrier.map_err(|err| from_client(LIST, err))?;
    let segments = match listed {
        Ok(segments) => segments,
        Err(zk::Error::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(from_client(LIST, err)),
    };
    let mut candidates: Vec<(LockName, String)> = segments
        .into_iter()
        .filter_map(|segment| {
            let name = unescape_segment(&segment)?;
            name.as_str()
                .starts_with(prefix)
                .then(|| (name, format!("{root}/{segment}")))
        })
        .collect();
    candidates.sort_unstable();
    // Futures do nothing until polled: at most `CHUNKS_IN_FLIGHT` are sent at once.
    let reads: Vec<_> = candidates
        .chunks(LIST_CHUNK)
        .map(|chunk| {
            let dirs: Vec<&str> = chunk.iter().map(|(_, dir)| dir.as_str()).collect();
            have_lock_nodes(session, &live, dirs)
        })
        .collect();
    let held: Vec<Vec<bool>> = stream::iter(reads)
        .buffered(CHUNKS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(candidates
        .into_iter()
        .zip(held.into_iter().flatten())
        .filter_map(|((name, _), held)| held.then_some(name))
        .collect())
}

/// Whether each of `dirs` has a lock node (a missing directory has none), in one
/// `multiRead`; concurrent listings on servers without `multiRead`.
async fn have_lock_nodes(session: &Session, live: &Live, dirs: Vec<&str>) -> Result<Vec<bool>> {
    // A semaphore's directory counts while its `leases` child lives (until reaped).
    let held = |children: &[String]| {
        !queue_order(children).is_empty() || children.iter().any(|c| c == SEMAPHORE_LEASES)
    };
    let mut reader = live.client.new_multi_reader();
    for dir in &dirs {
        reader
            .add_get_children(dir)
            .map_err(|err| from_client(LIST, err))?;
    }
    match session.call(LIST, reader.commit()).await? {
        Ok(results) => results
            .into_iter()
            .map(|result| {
                let found = read_found(LIST, result, |result| match result {
                    zk::MultiReadResult::Children { children } => Ok(held(&children)),
                    other => Err(other),
                });
                found.map(|held| held.unwrap_or(false))
            })
            .collect(),
        Err(zk::Error::Unimplemented) => {
            let listings = join_all(dirs.iter().map(|dir| live.client.list_children(dir)));
            session
                .call(LIST, listings)
                .await?
                .into_iter()
                .map(|listed| match listed {
                    Ok(children) => Ok(held(&children)),
                    Err(zk::Error::NoNode) => Ok(false),
                    Err(err) => Err(from_client(LIST, err)),
                })
                .collect()
        }
        Err(err) => Err(from_client(LIST, err)),
    }
}
