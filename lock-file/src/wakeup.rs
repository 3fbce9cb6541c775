//! Push wake-ups: one inotify watch on the directory per client. Every close of a lock
//! or slot file (a holder's release, or the kernel closing a dead process's files) and
//! every record removed or replaced is announced to the client's waiters and change
//! feeds, which re-try or re-read; they also re-check every `recheck`, in case.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use lock_core::Result;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::error::from_errno;

/// How many announcements a slow reader may miss before it is told it lagged (and
/// re-tries anyway).
const BACKLOG: usize = 1024;

/// One change in the directory: the file name, and whether a file was closed (rather
/// than removed or renamed into place).
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) file: Arc<str>,
    pub(crate) closed: bool,
}

impl Change {
    /// Whether this change may let a waiter of `stem` in: its lock file or a slot
    /// closed, or one of its records removed or replaced.
    pub(crate) fn concerns(&self, stem: &str) -> bool {
        let Some(rest) = self.file.strip_prefix(stem) else {
            return false;
        };
        if self.closed {
            rest.is_empty() || rest.starts_with("~slot~")
        } else {
            rest.starts_with("~hold~") || rest.starts_with("~wait~")
        }
    }
}

/// The watch and the task that reads it; the task ends when this is dropped.
#[derive(Debug)]
pub(crate) struct Wakeup {
    changes: broadcast::Sender<Change>,
    task: JoinHandle<()>,
}

struct Watch(Inotify);

impl AsRawFd for Watch {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl Wakeup {
    /// Watches `dir` (on the current runtime).
    pub(crate) fn start(dir: &Path) -> Result<Self> {
        let what = "watching the lock directory (inotify)";
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| from_errno(what, e))?;
        inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_CLOSE_NOWRITE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_TO,
            )
            .map_err(|e| from_errno(what, e))?;
        // `Watch` owns the inotify descriptor for as long as the `AsyncFd` lives, which is
        // the I/O safety `AsyncFd::register` asks its caller to promise.
        #[allow(deprecated)]
        let watch = AsyncFd::new(Watch(inotify)).map_err(|e| crate::error::from_io(what, e))?;
        let (changes, _) = broadcast::channel(BACKLOG);
        let task = tokio::spawn(read(watch, changes.clone()));
        Ok(Wakeup { changes, task })
    }

    /// Announcements from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read(watch: AsyncFd<Watch>, changes: broadcast::Sender<Change>) {
    loop {
        let Ok(mut ready) = watch.readable().await else {
            tracing::warn!("the lock directory's inotify watch failed; waiters re-check only");
            return;
        };
        match ready.get_inner().0.read_events() {
            Ok(events) => {
                for event in events {
                    let Some(file) = event.name.as_ref().and_then(|n| n.to_str()) else {
                        continue;
                    };
                    let closed = event.mask.intersects(
                        AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_CLOSE_NOWRITE,
                    );
                    let _ = changes.send(Change {
                        file: Arc::from(file),
                        closed,
                    });
                }
            }
            Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
            Err(err) => {
                tracing::warn!(%err, "reading the lock directory's inotify watch failed");
                return;
            }
        }
    }
}

/// Waits until a change in `changes` concerns `stem` (or some were missed).
pub(crate) async fn next_for(changes: &mut broadcast::Receiver<Change>, stem: &str) {
    loop {
        match changes.recv().await {
            Ok(change) if change.concerns(stem) => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
