//! Where each name lives in the directory, and the holder and waiter records beside it.
//!
//! For a lock name whose file name (its *stem*) is `S`:
//! - `S`: the lock file. Mutexes, candidates and writers hold `LOCK_EX` on it, readers
//!   `LOCK_SH`, as `flock(1)` does on the same path. It persists (empty), as `flock(1)`'s
//!   do: removing a lock file while another process waits on it would let two holders
//!   in (one on the removed file, one on its replacement).
//! - `S~fence`: the fencing counter (see [`crate::counter`]). Persists.
//! - `S~slot~N~I`: permit `I` of a semaphore of `N`; a permit is `LOCK_EX` on a free slot.
//!   Persist, as the lock file does.
//! - `.records/S~hold~T` / `.records/S~wait~T`: the record of the hold or the waiter of
//!   owner token `T`: its kind, process id, fencing token, value. Its owner keeps
//!   `LOCK_EX` on it while it lives, so a record whose lock can be taken is a dead
//!   process's and is removed by whoever finds it. Removed at release, cancellation and
//!   close. Records have a directory of their own because attempts list them:
//!   the listing counts the live holders and waiters, not every name the lock directory
//!   ever held (their lock and counter files persist).
//! - `S~broken~T`: left by `force_release` for the broken holder of `T`, which removes it
//!   at its next renewal.
//! - `.records/.S~…~tmp`: a record being written (locked, then renamed into place).
//!
//! The stem of a plain name is the name itself, so `flock DIR/NAME` and a distlock
//! mutex on `NAME` exclude each other. `%`, `/` and `~` are percent-escaped, and so is a
//! leading `.`, so no name reaches another's files, a record or a temporary.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::raw::backend::HoldKind;
use lock_core::raw::names::{escape_where, unescape};
use lock_core::{Error, FencingToken, LockName, Participant, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::from_io;

/// The longest stem accepted, in bytes, so that the stem and its longest suffix (a record
/// of an escaped owner token) stay within a file name's 255 bytes.
pub const MAX_STEM_BYTES: usize = 150;

/// The file name of `name`'s lock file: the name itself when it is a plain file name,
/// else escaped reversibly (`%`, `/`, `~` and a leading `.` percent-encoded).
pub fn file_stem(name: &str) -> String {
    let escaped = escape_where(name, |c| matches!(c, '/' | '~'));
    match escaped.strip_prefix('.') {
        Some(rest) => format!("%2E{rest}"),
        None => escaped,
    }
}

/// The stem of `name`.
///
/// # Errors
/// [`Error::InvalidName`] when it is longer than [`MAX_STEM_BYTES`].
pub(crate) fn stem_of(name: &LockName) -> Result<String> {
    let stem = file_stem(name.as_str());
    if stem.len() > MAX_STEM_BYTES {
        return Err(Error::invalid_name(
            name.as_str(),
            format!(
                "a file:// lock name is at most {MAX_STEM_BYTES} bytes once escaped, this one \
                 has {}",
                stem.len()
            ),
        ));
    }
    Ok(stem)
}

/// Whether a record is a hold or a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Hold,
    Wait,
}

impl State {
    fn tag(self) -> &'static str {
        match self {
            State::Hold => "hold",
            State::Wait => "wait",
        }
    }
}

/// The directory of the records, in the lock directory: no lock name's file can be
/// called this (a stem never starts with a dot).
pub(crate) const RECORDS: &str = ".records";

/// The directory and the paths of its names.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) dir: PathBuf,
}

impl Layout {
    pub(crate) fn lock_path(&self, stem: &str) -> PathBuf {
        self.dir.join(stem)
    }

    pub(crate) fn counter_path(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}~fence"))
    }

    pub(crate) fn slot_path(&self, stem: &str, permits: u32, slot: u32) -> PathBuf {
        self.dir.join(format!("{stem}~slot~{permits}~{slot}"))
    }

    /// Where the records live: a directory of their own, so that listing them counts live
    /// holders and waiters, not every name the lock directory ever held.
    pub(crate) fn records_dir(&self) -> PathBuf {
        self.dir.join(RECORDS)
    }

    pub(crate) fn record_path(&self, stem: &str, state: State, token: &str) -> PathBuf {
        self.records_dir()
            .join(format!("{stem}~{}~{}", state.tag(), file_stem(token)))
    }

    /// The mark `force_release` leaves for the holder of `token`, so that its renewal
    /// tells a broken hold from one whose record vanished.
    pub(crate) fn break_mark_path(&self, stem: &str, token: &str) -> PathBuf {
        self.dir.join(format!("{stem}~broken~{}", file_stem(token)))
    }

    /// Opens (creating) a file every participant locks: read-write, close-on-exec.
    pub(crate) fn open_shared(path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
    }

    /// Writes `record` for `token` and returns its file, locked: written to a locked
    /// temporary, then renamed into place (over an older record of the same token), so
    /// readers see a whole record and never an unlocked one of a live holder.
    pub(crate) fn write_record(
        &self,
        stem: &str,
        state: State,
        token: &str,
        record: &Record,
    ) -> Result<Flock<File>> {
        let path = self.record_path(stem, state, token);
        let temporary =
            self.records_dir()
                .join(format!(".{stem}~{}~{}~tmp", state.tag(), file_stem(token)));
        let what = "writing a lock record";
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&temporary)
            .map_err(|e| from_io(what, e))?;
        let mut file = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| crate::error::from_errno(what, errno))?;
        let written = file
            .write_all(record.encode().as_bytes())
            .and_then(|()| fs::rename(&temporary, &path));
        if let Err(err) = written {
            let _ = fs::remove_file(&temporary);
            return Err(from_io(what, err));
        }
        Ok(file)
    }

    /// The records in the directory: stem, state, owner token and path of each.
    fn record_files(&self) -> Result<Vec<(String, State, String, PathBuf)>> {
        let entries =
            fs::read_dir(self.records_dir()).map_err(|e| from_io("listing the lock records", e))?;
        Ok(entries
            .flatten()
            .filter_map(|entry| {
                let file_name = entry.file_name();
                let (stem, rest) = file_name.to_str()?.split_once('~')?;
                let (state, token) = rest.split_once('~')?;
                let state = match state {
                    "hold" => State::Hold,
                    "wait" => State::Wait,
                    _ => return None,
                };
                let token = unescape(token, file_stem)?;
                Some((stem.to_owned(), state, token, entry.path()))
            })
            .collect())
    }

    /// The live records of `stem` (a dead process's are removed on the way), oldest
    /// first.
    pub(crate) fn records(&self, stem: &str) -> Result<Vec<Record>> {
        let mut found: Vec<Record> = self
            .record_files()?
            .into_iter()
            .filter(|(of, ..)| of == stem)
            .filter_map(|(_, state, token, path)| read_live(&path, state, token))
            .collect();
        found.sort_by_key(|r| (r.since, r.fence));
        Ok(found)
    }

    /// The names that have a live hold record, sorted.
    pub(crate) fn held_names(&self) -> Result<Vec<LockName>> {
        let mut names: Vec<LockName> = self
            .record_files()?
            .into_iter()
            .filter(|(_, state, ..)| *state == State::Hold)
            .filter_map(|(stem, state, token, path)| {
                let name = LockName::new(unescape(&stem, file_stem)?).ok()?;
                read_live(&path, state, token).map(|_| name)
            })
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// The record at `path` if its owner still locks it; a dead owner's is removed.
fn read_live(path: &Path, state: State, token: String) -> Option<Record> {
    // A record replaced (a proclaim) between our open and our probe looks dead: read the
    // replacement instead, once.
    for _ in 0..2 {
        let mut file = File::open(path).ok()?;
        match Flock::lock(file.try_clone().ok()?, FlockArg::LockSharedNonblock) {
            Ok(_dead) => {
                let replaced = fs::symlink_metadata(path)
                    .ok()
                    .zip(file.metadata().ok())
                    .is_none_or(|(now, probed)| now.ino() != probed.ino());
                if replaced {
                    continue;
                }
                // Nobody locks it: its process is gone. Removing it while we hold the
                // lock cannot race with its owner, which never locks it again.
                let _ = fs::remove_file(path);
                return None;
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                let mut text = String::new();
                file.read_to_string(&mut text).ok()?;
                return Record::decode(&text, state, token);
            }
            Err(_) => return None,
        }
    }
    None
}

/// What a record says of its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) state: State,
    pub(crate) token: String,
    pub(crate) kind: HoldKind,
    pub(crate) pid: u32,
    pub(crate) fence: Option<u64>,
    pub(crate) since: u64,
    pub(crate) version: u64,
}

impl Record {
    pub(crate) fn new(state: State, token: &str, kind: HoldKind, fence: Option<u64>) -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Record {
            state,
            token: token.to_owned(),
            kind,
            pid: std::process::id(),
            fence,
            since,
            version: 0,
        }
    }

    fn encode(&self) -> String {
        let (label, permits, count, value) = match &self.kind {
            HoldKind::Permit { permits, count } => ("permit", *permits, *count, String::new()),
            HoldKind::Candidate { value } => ("candidate", 0, 0, hex(value)),
            other => (other.label(), 0, 0, String::new()),
        };
        format!(
            "kind={label}\npermits={permits}\ncount={count}\npid={}\nfence={}\nsince={}\n\
             version={}\nvalue={value}\n",
            self.pid,
            self.fence.unwrap_or(0),
            self.since,
            self.version
        )
    }

    fn decode(text: &str, state: State, token: String) -> Option<Self> {
        let field = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        };
        let number = |key: &str| field(key)?.parse::<u64>().ok();
        let small = |key: &str| field(key)?.parse::<u32>().ok();
        let kind = match field("kind")? {
            "mutex" => HoldKind::Mutex,
            "candidate" => HoldKind::Candidate {
                value: unhex(field("value")?)?,
            },
            "permit" => HoldKind::Permit {
                permits: small("permits")?,
                count: small("count")?,
            },
            "read" => HoldKind::Read,
            "write" => HoldKind::Write,
            "upgradeable" => HoldKind::Upgradeable,
            _ => return None,
        };
        Some(Record {
            state,
            token,
            kind,
            pid: small("pid")?,
            fence: number("fence").filter(|f| *f > 0),
            since: number("since")?,
            version: number("version")?,
        })
    }

    /// The record as inspections show it.
    pub(crate) fn participant(&self) -> Participant {
        let value = match &self.kind {
            HoldKind::Candidate { value } => Some(value.clone()),
            _ => None,
        };
        Participant::new(Some(self.token.clone()))
            .kind(self.kind.shown())
            .fencing_token(self.fence.map(FencingToken))
            .session(Some(format!("pid {}", self.pid)))
            .since(Some(UNIX_EPOCH + Duration::from_micros(self.since)))
            .value(value)
            .value_version(Some(self.version))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_their_own_file_names_and_others_escape_reversibly() {
        assert_eq!(file_stem("nightly"), "nightly");
        assert_eq!(file_stem("nightly.lock"), "nightly.lock");
        for (name, stem) in [
            ("jobs/daily", "jobs%2Fdaily"),
            (".hidden", "%2Ehidden"),
            ("..", "%2E."),
            ("a~hold~b", "a%7Ehold%7Eb"),
            ("100%", "100%25"),
        ] {
            assert_eq!(file_stem(name), stem);
            assert_eq!(unescape(stem, file_stem).as_deref(), Some(name));
        }
    }

    #[test]
    fn records_round_trip() {
        for kind in [
            HoldKind::Mutex,
            HoldKind::Candidate {
                value: b"node-1:80".to_vec(),
            },
            HoldKind::Permit {
                permits: 4,
                count: 2,
            },
            HoldKind::Read,
            HoldKind::Write,
        ] {
            let record = Record::new(State::Hold, "t", kind, Some(7));
            let back = Record::decode(&record.encode(), State::Hold, "t".into());
            assert_eq!(back, Some(record));
        }
    }
}
