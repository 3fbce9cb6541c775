//! Breaking a hold: the delete of a lock directory's first lock node together with the
//! mark of its owner token as broken, started over while the holder or the marks change.

use std::time::Duration;

use lock_core::raw::plumbing::Backoff;
use lock_core::{Error, Participant, Result};
use tokio::time::{sleep, timeout};
use zookeeper_client as zk;

use super::holder;
use crate::error::{from_client, BACKEND};
use crate::layout::{broken_node, mark_broken, owner_token, parent, queue_order, semaphore_dirs};
use crate::session::Session;

const BREAK: &str = "break lock";
/// Attempts of a break whose holder or marks changed under it.
const BREAK_ATTEMPTS: usize = 8;
/// Request timeouts a whole break may take, its attempts together.
const BREAK_TIMEOUTS: u32 = 8;
/// First pause before such an attempt.
const BREAK_PAUSE: Duration = Duration::from_millis(10);

/// Breaks the hold of lock directory `dir`: deletes its first lock node (at the version
/// read) and marks its owner token broken in the marks node beside the directory (see
/// [`crate::layout`]; created if missing, else written at the version read), in one
/// transaction; returns the holder removed, `None` if the directory has no lock node.
/// Starts over, at most [`BREAK_ATTEMPTS`] times after a short pause, when the holder or
/// the marks changed in between (the holder left by itself and the next one holds now;
/// another break wrote its mark): what it removes is the holder at the moment of the
/// transaction. Where the namespace refuses to let the marks be read or written
/// (`NoAuth`), the node is deleted without a mark.
///
/// Each attempt takes three round trips under the request timeout each: a barrier with
/// the listing of `dir` and the read of the marks; the stat of the holder's node; the
/// transaction. The whole break takes [`BREAK_TIMEOUTS`] request timeouts at most.
///
/// # Errors
/// [`Error::InvalidConfig`] when the directory refuses the delete (`NoAuth`); connection
/// errors (the hold may or may not be removed), also when the break ran out of time;
/// [`Error::Unavailable`] while no session is established or when the holder kept
/// changing.
pub(crate) async fn force_release(session: &Session, dir: &str) -> Result<Option<Participant>> {
    let limit = session.config().options.request_timeout * BREAK_TIMEOUTS;
    let broken = async {
        // A semaphore's holders are its lease nodes: the oldest is broken.
        let (_, leases) = semaphore_dirs(dir);
        let live = session.live()?;
        let is_semaphore = session
            .call(BREAK, live.client.check_stat(&leases))
            .await?
            .map_err(|err| from_client(BREAK, err))?
            .is_some();
        let queue = if is_semaphore { leases.as_str() } else { dir };
        break_hold(session, queue, parent(dir)).await
    };
    timeout(limit, broken)
        .await
        .unwrap_or_else(|_| Err(Error::no_answer(BACKEND, BREAK, limit)))
}

/// The attempts of [`force_release`] on the queue `dir` of a lock directory in `root`.
async fn break_hold(session: &Session, dir: &str, root: &str) -> Result<Option<Participant>> {
    let live = session.live()?;
    let marks_node = broken_node(root);
    let failed = |err| from_client(BREAK, err);
    let mut backoff = Backoff::new(BREAK_PAUSE, BREAK_PAUSE * 16);
    for _ in 0..BREAK_ATTEMPTS {
        let (barrier, listed, read) = session
            .call(BREAK, async {
                tokio::join!(
                    live.barrier(dir),
                    live.client.list_children(dir),
                    live.client.get_data(&marks_node)
                )
            })
            .await?;
        barrier.map_err(failed)?;
        let children = match listed {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(err) => return Err(failed(err)),
        };
        // `Some(marks)`: the marks and their version, `None` while the node does not
        // exist yet; `None` where reading them is refused (the break leaves no mark).
        let marks = match read {
            Ok((data, stat)) => Some(Some((data, stat.version))),
            Err(zk::Error::NoNode) => Some(None),
            Err(zk::Error::NoAuth) => None,
            Err(err) => return Err(failed(err)),
        };
        let Some(node) = queue_order(&children).first().map(|node| node.to_string()) else {
            return Ok(None);
        };
        let path = format!("{dir}/{node}");
        let Some(stat) = session
            .call(BREAK, live.client.check_stat(&path))
            .await?
            .map_err(failed)?
        else {
            continue;
        };
        let holder = holder(&node, &stat)?;
        let mut writer = live.client.new_multi_writer();
        writer
            .add_delete(&path, Some(stat.version))
            .map_err(failed)?;
        let mark = owner_token(&node).zip(marks);
        match &mark {
            Some((token, Some((data, version)))) => writer
                .add_set_data(&marks_node, &mark_broken(data, token), Some(*version))
                .map_err(failed)?,
            Some((token, None)) => {
                let persistent = zk::CreateMode::Persistent.with_acls(session.config().acl.acls());
                writer
                    .add_create(&marks_node, &mark_broken(&[], token), &persistent)
                    .map_err(failed)?;
            }
            None => {}
        }
        match session.call(BREAK, writer.commit()).await? {
            Ok(_) => return Ok(Some(holder)),
            Err(zk::MultiWriteError::OperationFailed {
                index: 0 | 1,
                source: zk::Error::NoNode | zk::Error::BadVersion | zk::Error::NodeExists,
            }) => {}
            Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoAuth,
            }) => {
                tracing::debug!(%marks_node, "the namespace refuses the broken marks; breaking without a mark");
                match session
                    .call(BREAK, live.client.delete(&path, Some(stat.version)))
                    .await?
                {
                    Ok(()) => return Ok(Some(holder)),
                    Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                    Err(err) => return Err(failed(err)),
                }
            }
            Err(err) => return Err(failed(err.into())),
        }
        sleep(backoff.next_pause()).await;
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        message: format!("the holder of {dir} kept changing while it was being broken"),
        source: None,
    })
}
