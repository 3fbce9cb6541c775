//! A hold: the `flock`s that make it, its record, and how one attempt takes them.

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use lock_core::raw::backend::HoldKind;
use lock_core::raw::plumbing::lock_unpoisoned;
use lock_core::{LockName, LostReason, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::counter;
use crate::error::{from_errno, from_io};
use crate::layout::{Layout, Record, State};

/// A hold on a `file://` directory: the `flock`s it holds (on the lock file, or on its
/// permits' slot files) and its record. Dropping it gives everything back.
#[derive(Debug)]
pub struct FileHold {
    pub(crate) name: LockName,
    pub(crate) stem: String,
    pub(crate) token: String,
    pub(crate) fence: u64,
    pub(crate) locks: Arc<Mutex<Vec<Flock<File>>>>,
    pub(crate) record: Mutex<RecordFile>,
    pub(crate) released: AtomicBool,
    pub(crate) layout: Arc<Layout>,
}

/// A hold's record as written, and its locked file.
#[derive(Debug)]
pub(crate) struct RecordFile {
    pub(crate) record: Record,
    pub(crate) file: Flock<File>,
}

impl FileHold {
    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The path of the record.
    pub(crate) fn record_path(&self) -> PathBuf {
        self.layout
            .record_path(&self.stem, State::Hold, &self.token)
    }

    /// Whether the hold is still this client's: not released, its record not removed
    /// (`Broken` when an operator's `force_release` did, `Vanished` otherwise).
    pub(crate) fn still_ours(&self) -> std::result::Result<(), LostReason> {
        if self.released.load(Ordering::Acquire) {
            return Err(LostReason::Vanished);
        }
        let record = lock_unpoisoned(&self.record);
        match record.file.metadata() {
            Ok(meta) if meta.nlink() > 0 => Ok(()),
            // An operator leaves a mark before removing the record.
            _ => match fs::remove_file(self.layout.break_mark_path(&self.stem, &self.token)) {
                Ok(()) => Err(LostReason::Broken),
                Err(_) => Err(LostReason::Vanished),
            },
        }
    }

    /// Gives back the `flock`s and removes the record; whether the record was still
    /// there (not broken by an operator).
    pub(crate) fn give_back(&self) -> bool {
        if self.released.swap(true, Ordering::AcqRel) {
            return false;
        }
        let removed = fs::remove_file(self.record_path()).is_ok();
        lock_unpoisoned(&self.locks).clear();
        removed
    }

    /// Rewrites the record of this hold as `change` says (a proclaim, a downgrade).
    pub(crate) fn rewrite(&self, change: impl FnOnce(&mut Record)) -> Result<()> {
        let mut current = lock_unpoisoned(&self.record);
        let mut record = current.record.clone();
        change(&mut record);
        record.version += 1;
        let file = self
            .layout
            .write_record(&self.stem, State::Hold, &self.token, &record)?;
        *current = RecordFile { record, file };
        Ok(())
    }
}

impl Drop for FileHold {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// The files a waiter keeps open between attempts, so that a failed attempt closes
/// nothing (each close wakes every waiter of the directory).
#[derive(Debug, Default)]
pub(crate) struct OpenFiles {
    lock: Option<File>,
    slots: Vec<Option<File>>,
}

/// What one attempt asks for.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    pub(crate) name: LockName,
    pub(crate) stem: String,
    pub(crate) token: String,
    pub(crate) kind: HoldKind,
    pub(crate) floor: Option<u64>,
}

/// What one attempt came to.
#[derive(Debug)]
pub(crate) enum Attempt {
    Granted(FileHold),
    /// The kernel refused the `flock`s: the name is taken.
    Refused,
    /// A reader gave way to a writer that waited before it.
    GaveWay,
}

/// One non-blocking attempt (blocking file-system calls: run it off the runtime).
///
/// A reader reads the name's records before it takes its `flock` (it gives way to an
/// earlier writer). Every other kind takes its `flock`s first: a refusal costs one system
/// call, and only a `first` attempt then reads the records (to find the name used as
/// another kind rather than wait for it); a grant reads them once, after its record is
/// written.
///
/// # Errors
/// [`lock_core::Error::Conflict`] when the name's live participants use it as another
/// kind; file-system errors.
pub(crate) fn attempt(
    layout: &Arc<Layout>,
    ask: &Ask,
    files: &mut OpenFiles,
    first: bool,
) -> Result<Attempt> {
    let others = |records: Vec<Record>| {
        records
            .into_iter()
            .filter(|r| r.token != ask.token)
            .collect::<Vec<_>>()
    };
    let beside = |records: &[Record], waiters_too: bool| {
        records
            .iter()
            .filter(|r| waiters_too || r.state == State::Hold)
            .try_for_each(|r| ask.kind.check_beside(&r.kind, &ask.name))
    };
    let reader = matches!(ask.kind, HoldKind::Read | HoldKind::Upgradeable);
    if reader {
        let all = layout.records(&ask.stem)?;
        let waiting_since = all
            .iter()
            .find(|r| r.token == ask.token && r.state == State::Wait)
            .map(|r| r.since);
        let records = others(all);
        beside(&records, true)?;
        if records.iter().any(|r| {
            r.state == State::Wait
                && r.kind == HoldKind::Write
                && waiting_since.is_none_or(|since| r.since < since)
        }) {
            // A reader never overtakes a writer that waited before it.
            return Ok(Attempt::GaveWay);
        }
    }
    let Some(locks) = take_locks(layout, ask, files)? else {
        if first && !reader {
            beside(&others(layout.records(&ask.stem)?), true)?;
        }
        return Ok(Attempt::Refused);
    };
    let fence = counter::next(layout, &ask.stem, ask.floor)?;
    let record = Record::new(State::Hold, &ask.token, ask.kind.clone(), Some(fence));
    let file = layout.write_record(&ask.stem, State::Hold, &ask.token, &record)?;
    let hold = FileHold {
        name: ask.name.clone(),
        stem: ask.stem.clone(),
        token: ask.token.clone(),
        fence,
        locks: Arc::new(Mutex::new(locks)),
        record: Mutex::new(RecordFile { record, file }),
        released: AtomicBool::new(false),
        layout: Arc::clone(layout),
    };
    // Two kinds that take different files (a semaphore's slots, a mutex's lock file) may
    // both get their `flock`s at once: each sees the other's record here and gives way
    // (dropping the hold gives its `flock`s back). A first attempt also finds waiters of
    // another kind.
    beside(&others(layout.records(&ask.stem)?), first && !reader)?;
    Ok(Attempt::Granted(hold))
}

/// The `flock`s of `ask`, all or none.
fn take_locks(
    layout: &Layout,
    ask: &Ask,
    files: &mut OpenFiles,
) -> Result<Option<Vec<Flock<File>>>> {
    let what = "taking a file lock";
    match ask.kind {
        HoldKind::Permit { permits, count } => {
            files.slots.resize_with(permits as usize, || None);
            let mut taken = Vec::new();
            for (slot, open) in (0..permits).zip(files.slots.iter_mut()) {
                if taken.len() == count as usize {
                    break;
                }
                if let Some(lock) = try_lock(
                    open,
                    &layout.slot_path(&ask.stem, permits, slot),
                    FlockArg::LockExclusiveNonblock,
                    what,
                )? {
                    taken.push(lock);
                }
            }
            if taken.len() < count as usize {
                // Give the slots back but keep them open for the next attempt.
                for (lock, open) in taken
                    .into_iter()
                    .zip(files.slots.iter_mut().filter(|s| s.is_none()))
                {
                    *open = lock.unlock().ok();
                }
                return Ok(None);
            }
            Ok(Some(taken))
        }
        HoldKind::Read | HoldKind::Upgradeable => Ok(try_lock(
            &mut files.lock,
            &layout.lock_path(&ask.stem),
            FlockArg::LockSharedNonblock,
            what,
        )?
        .map(|l| vec![l])),
        _ => Ok(try_lock(
            &mut files.lock,
            &layout.lock_path(&ask.stem),
            FlockArg::LockExclusiveNonblock,
            what,
        )?
        .map(|l| vec![l])),
    }
}

/// Locks the file at `path` (opened into `open` if it is not yet) without blocking;
/// `None`, the file kept open in `open`, when someone else holds it.
fn try_lock(
    open: &mut Option<File>,
    path: &std::path::Path,
    arg: FlockArg,
    what: &str,
) -> Result<Option<Flock<File>>> {
    let file = match open.take() {
        Some(file) => file,
        None => Layout::open_shared(path).map_err(|e| from_io(what, e))?,
    };
    match Flock::lock(file, arg) {
        Ok(lock) => Ok(Some(lock)),
        Err((file, Errno::EWOULDBLOCK)) => {
            *open = Some(file);
            Ok(None)
        }
        Err((_, errno)) => Err(from_errno(what, errno)),
    }
}

/// A waiter's record, removed when the wait ends (granted, given up or cancelled).
#[derive(Debug)]
pub(crate) struct WaitRecord {
    path: PathBuf,
    _file: Flock<File>,
}

impl WaitRecord {
    /// Writes the record of `ask` waiting.
    pub(crate) fn write(layout: &Layout, ask: &Ask) -> Result<Self> {
        let record = Record::new(State::Wait, &ask.token, ask.kind.clone(), None);
        let file = layout.write_record(&ask.stem, State::Wait, &ask.token, &record)?;
        Ok(WaitRecord {
            path: layout.record_path(&ask.stem, State::Wait, &ask.token),
            _file: file,
        })
    }
}

impl Drop for WaitRecord {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
