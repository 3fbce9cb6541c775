//! The per-name fencing counter, `S~fence`: a fixed-width decimal number, read and
//! rewritten in place under a short `LOCK_EX` on the file itself, then `fdatasync`ed
//! before the token is handed out (and the directory synced when the file is new), so
//! tokens strictly increase across processes and restarts of the machine.
//!
//! Each grant's token is `max(counter + 1, floor, microseconds since the epoch)`: a
//! counter lost with its directory (a `tmpfs` emptied at boot) or restored from an older
//! backup does not take tokens back while the wall clock does not go back.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use lock_core::Result;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{from_errno, from_io};
use crate::layout::Layout;

/// Width of the stored number: every `u64` fits, so a rewrite never shortens the file.
const WIDTH: usize = 20;

/// Takes the next fencing token of `stem`, at least `floor` (blocking).
pub(crate) fn next(layout: &Layout, stem: &str, floor: Option<u64>) -> Result<u64> {
    let what = "advancing the fencing counter";
    let path = layout.counter_path(stem);
    let file = Layout::open_shared(&path).map_err(|e| from_io(what, e))?;
    let mut file =
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| from_errno(what, errno))?;
    let stored = read_locked(&mut file).map_err(|e| from_io(what, e))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let token = stored
        .map_or(1, |c| c.saturating_add(1))
        .max(floor.unwrap_or(0))
        .max(now);
    let write = |file: &mut File| -> std::io::Result<()> {
        file.seek(SeekFrom::Start(0))?;
        file.write_all(format!("{token:0WIDTH$}\n").as_bytes())?;
        file.sync_data()
    };
    write(&mut file).map_err(|e| from_io(what, e))?;
    if stored.is_none() {
        sync_dir(&layout.dir).map_err(|e| from_io(what, e))?;
    }
    Ok(token)
}

/// The counter of `stem` as stored (`None` before the first grant); every later token
/// is above it.
pub(crate) fn current(layout: &Layout, stem: &str) -> Result<Option<u64>> {
    let what = "reading the fencing counter";
    match File::open(layout.counter_path(stem)) {
        Ok(mut file) => read_locked(&mut file).map_err(|e| from_io(what, e)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(from_io(what, err)),
    }
}

fn read_locked(file: &mut File) -> std::io::Result<Option<u64>> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut text)?;
    Ok(text.trim().parse().ok())
}

/// Makes a new entry of `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
