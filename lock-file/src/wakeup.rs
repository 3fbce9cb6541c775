//! Push wake-ups: one inotify watch per directory per process, shared by the process's
//! clients of that directory (inotify instances are few: 128 per user by default). Every
//! close of a lock or slot file (a holder's release, or the kernel closing a dead
//! process's files) and every record removed or replaced is announced to the clients'
//! waiters and change feeds, which re-try or re-read; they also re-check every
//! `recheck`, in case. Each announcement is a tick of the directory's clock, which the
//! names' turnstiles ([`crate::turnstile`]) use to tell which attempt answered which
//! wake-up.
//!
//! A thread of its own reads each watch (a blocking read, on no runtime, so that clients
//! on any runtime share it); it ends when the last client of the directory lets go, which
//! removes the watch and so wakes it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use lock_core::raw::plumbing::lock_unpoisoned;
use lock_core::Result;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::broadcast;

use crate::error::{from_errno, from_io};
use crate::layout::RECORDS;
use crate::turnstile::{Turnstile, Turnstiles};

/// How many announcements a slow reader may miss before it is told it lagged (and
/// re-tries anyway).
const BACKLOG: usize = 1024;

/// The watches of this process, by canonical directory.
static WATCHES: Mutex<Option<HashMap<PathBuf, Weak<Wakeup>>>> = Mutex::new(None);

/// One change in the directory: the file name, whether a file was closed (rather than
/// removed or renamed into place), and its tick of the directory's clock.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) file: Arc<str>,
    pub(crate) closed: bool,
    pub(crate) tick: u64,
}

/// Which changes of a name a reader of the announcements wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interest {
    /// Its lock or slot files closed: all that can free a `flock`.
    Closes,
    /// Those, and its records removed or replaced (a reader gives way to a waiting
    /// writer; feeds and broken holds read the records).
    ClosesAndRecords,
}

impl Change {
    /// Whether this change is of `interest` for `stem`: its lock file or a slot closed,
    /// or one of its records removed or replaced.
    pub(crate) fn concerns(&self, stem: &str, interest: Interest) -> bool {
        let Some(rest) = self.file.strip_prefix(stem) else {
            return false;
        };
        if self.closed {
            rest.is_empty() || rest.starts_with("~slot~")
        } else {
            interest == Interest::ClosesAndRecords
                && (rest.starts_with("~hold~") || rest.starts_with("~wait~"))
        }
    }
}

/// A directory's watch; its thread ends when the last client drops it.
#[derive(Debug)]
pub(crate) struct Wakeup {
    changes: broadcast::Sender<Change>,
    inotify: Arc<Inotify>,
    watches: [WatchDescriptor; 2],
    clock: Arc<AtomicU64>,
    turnstiles: Mutex<Turnstiles>,
}

impl Wakeup {
    /// The watch of `dir` (a canonical path), shared with this process's other clients of
    /// it.
    pub(crate) fn of(dir: &Path) -> Result<Arc<Self>> {
        let mut watches = lock_unpoisoned(&WATCHES);
        let watches = watches.get_or_insert_with(HashMap::new);
        watches.retain(|_, watch| watch.strong_count() > 0);
        if let Some(shared) = watches.get(dir).and_then(Weak::upgrade) {
            return Ok(shared);
        }
        let started = Arc::new(Self::start(dir)?);
        watches.insert(dir.to_owned(), Arc::downgrade(&started));
        Ok(started)
    }

    fn start(dir: &Path) -> Result<Self> {
        let what = "watching the lock directory (inotify)";
        let inotify =
            Arc::new(Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| from_errno(what, e))?);
        let watch = inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_CLOSE_NOWRITE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_TO,
            )
            .map_err(|e| from_errno(what, e))?;
        // Records removed or renamed into place, in their directory of their own.
        let records = inotify
            .add_watch(
                &dir.join(RECORDS),
                AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_TO,
            )
            .map_err(|e| from_errno(what, e))?;
        let (changes, _) = broadcast::channel(BACKLOG);
        let clock = Arc::new(AtomicU64::new(0));
        let reader = (Arc::clone(&inotify), changes.clone(), Arc::clone(&clock));
        std::thread::Builder::new()
            .name("distlock-file-watch".into())
            .spawn(move || read(&reader.0, &reader.1, &reader.2))
            .map_err(|e| from_io(what, e))?;
        Ok(Wakeup {
            changes,
            inotify,
            watches: [watch, records],
            clock,
            turnstiles: Mutex::default(),
        })
    }

    /// Announcements from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// The clock's tick now: every change announced so far happened before.
    pub(crate) fn now(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// A tick of its own, for a re-check: no attempt begun before it answers it.
    pub(crate) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The turnstile of `stem`'s waiters in this process.
    pub(crate) fn turnstile(&self, stem: &str) -> Arc<Turnstile> {
        lock_unpoisoned(&self.turnstiles).of(stem, &self.clock)
    }
}

impl Drop for Wakeup {
    /// Removing the watch queues its last event, which ends the reading thread.
    fn drop(&mut self) {
        for watch in self.watches {
            let _ = self.inotify.rm_watch(watch);
        }
    }
}

/// Reads `inotify` until its watch is removed, announcing each change.
fn read(inotify: &Inotify, changes: &broadcast::Sender<Change>, clock: &AtomicU64) {
    loop {
        let events = match inotify.read_events() {
            Ok(events) => events,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => {
                tracing::warn!(%err, "reading the lock directory's inotify watch failed; waiters re-check only");
                return;
            }
        };
        for event in events {
            if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                return;
            }
            let Some(file) = event.name.as_ref().and_then(|n| n.to_str()) else {
                continue;
            };
            let closed = event
                .mask
                .intersects(AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_CLOSE_NOWRITE);
            let _ = changes.send(Change {
                file: Arc::from(file),
                closed,
                tick: clock.fetch_add(1, Ordering::SeqCst) + 1,
            });
        }
    }
}

/// Waits until a change in `changes` is of `interest` for `stem`, and returns its tick;
/// `None` when some were missed.
pub(crate) async fn next_for(
    changes: &mut broadcast::Receiver<Change>,
    stem: &str,
    interest: Interest,
) -> Option<u64> {
    loop {
        match changes.recv().await {
            Ok(change) if change.concerns(stem, interest) => return Some(change.tick),
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return None,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}
