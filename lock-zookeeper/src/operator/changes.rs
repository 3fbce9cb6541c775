//! The feed of changes under a lock directory: one persistent recursive watch, followed
//! by a task that fires the feed and watches again on a new session.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::{stream, StreamExt};
use lock_core::raw::backend::ChangeFeed;
use lock_core::Result;
use tokio::sync::mpsc;
use tokio::time::sleep;
use zookeeper_client as zk;

use crate::error::from_client;
use crate::session::Session;

const WATCH: &str = "watch lock directory";
/// Pause between attempts to watch a lock directory on a new session.
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

/// A feed of the changes under lock directory `dir`: nodes created and deleted (a grant,
/// a release, an expiry, a waiter), data changed (a proclaim).
///
/// One persistent recursive watch on `dir` (ZooKeeper 3.6+ `addWatch`), added before
/// this returns, so every change after it fires the feed. A task follows it: it fires
/// the feed at each event and at each reconnect (events may be lost while disconnected,
/// ZOOKEEPER-4698), and after a session expiry watches again on the next session. The
/// task ends, its watch removed, when the feed is dropped or the lock client closed.
/// A server without `addWatch` (before 3.6) gives a feed that never fires: readers re-read
/// every `recheck`.
///
/// # Errors
/// Connection errors of adding the watch, [`Error::Unavailable`](lock_core::Error::Unavailable) while no session is
/// established.
pub(crate) async fn changes(session: &Arc<Session>, dir: String) -> Result<ChangeFeed> {
    let live = session.live()?;
    let watcher = match session
        .call(
            WATCH,
            live.client
                .watch(&dir, zk::AddWatchMode::PersistentRecursive),
        )
        .await?
    {
        Ok(watcher) => watcher,
        Err(zk::Error::Unimplemented) => {
            tracing::debug!(%dir, "the server has no persistent watches; the feed never fires");
            return Ok(ChangeFeed::never());
        }
        Err(err) => return Err(from_client(WATCH, err)),
    };
    // One pending fire is enough: the reader re-reads everything.
    let (fire, fired) = mpsc::channel(1);
    let follower = Follower {
        session: Arc::downgrade(session),
        dir,
        epoch: live.epoch,
    };
    drop(live);
    tokio::spawn(async move {
        tokio::select! {
            () = follower.follow(watcher, &fire) => {}
            () = fire.closed() => {}
        }
    });
    let stream = stream::unfold(fired, |mut fired| async move {
        fired.recv().await?;
        Some(((), fired))
    });
    Ok(ChangeFeed::from_stream(stream.boxed()))
}

/// The task behind a change feed: its lock directory and the session epoch it watches on.
struct Follower {
    /// Weak: the feed never keeps a closed lock client's session.
    session: Weak<Session>,
    dir: String,
    epoch: u64,
}

impl Follower {
    /// Fires `fire` at each event of `watcher`, and watches again on each new session.
    /// Returns once the lock client is closed or gone.
    async fn follow(mut self, mut watcher: zk::PersistentWatcher, fire: &mpsc::Sender<()>) {
        loop {
            let event = watcher.changed().await;
            let terminal =
                event.event_type == zk::EventType::Session && event.session_state.is_terminated();
            let disconnected = event.event_type == zk::EventType::Session
                && event.session_state == zk::SessionState::Disconnected;
            if !disconnected {
                // Full: a fire is pending already.
                let _ = fire.try_send(());
            }
            if terminal {
                // The watcher says no more after a terminal event.
                drop(watcher);
                match self.rewatch().await {
                    Some(next) => {
                        watcher = next;
                        let _ = fire.try_send(());
                    }
                    None => return,
                }
            }
        }
    }

    /// Watches the directory on the next session: one try per new session (each request
    /// under the request timeout), [`REWATCH_PAUSE`] apart; `None` once the lock client is
    /// closed or gone.
    async fn rewatch(&mut self) -> Option<zk::PersistentWatcher> {
        loop {
            let session = self.session.upgrade()?;
            if session.is_closed() {
                return None;
            }
            session
                .wait_usable(self.epoch, session.config().connect_timeout)
                .await;
            if let Ok(live) = session.live() {
                if live.epoch > self.epoch {
                    let watched = session
                        .call(
                            WATCH,
                            live.client
                                .watch(&self.dir, zk::AddWatchMode::PersistentRecursive),
                        )
                        .await;
                    match watched {
                        Ok(Ok(watcher)) => {
                            self.epoch = live.epoch;
                            return Some(watcher);
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(dir = %self.dir, error = %err, "watching again failed; retrying");
                        }
                        Err(err) => {
                            tracing::debug!(dir = %self.dir, error = %err, "watching again failed; retrying");
                        }
                    }
                }
            }
            drop(session);
            sleep(REWATCH_PAUSE).await;
        }
    }
}
