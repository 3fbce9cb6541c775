//! What an operator sees and does: holders and waiters from the records, held names, and
//! breaking a hold by removing its record (its holder gives the `flock` back at its next
//! renewal). Blocking file-system calls: run them off the runtime.

use std::fs::{self, File};

use lock_core::raw::names::unescape;
use lock_core::{Error, FencingToken, LockName, Occupancy, Participant, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::counter;
use crate::error::{from_io, BACKEND};
use crate::layout::{file_stem, Layout, State};

/// Holders and waiters of `stem`; a process outside distlock holding the lock file
/// exclusively (`flock(1)`) shows as a holder without an owner token. A distlock holder
/// also shows so for the moment between taking its flock and writing its record: the
/// caller looks again ([`unrecorded`]).
pub(crate) fn inspect(layout: &Layout, stem: &str) -> Result<Occupancy> {
    let records = layout.records(stem)?;
    let (holders, waiters): (Vec<_>, Vec<_>) = records.iter().partition(|r| r.state == State::Hold);
    let mut holders: Vec<Participant> = holders.iter().map(|r| r.participant()).collect();
    if holders.is_empty() && held_outside(layout, stem) {
        holders.push(Participant::new(None));
    }
    let waiters = waiters.iter().map(|r| r.participant()).collect();
    let floor = counter::current(layout, stem)?.map(FencingToken);
    Ok(Occupancy::shared(holders, waiters).token_floor(floor))
}

/// Whether `occupancy` shows a holder without a record (outside distlock, or being
/// granted).
pub(crate) fn unrecorded(occupancy: &Occupancy) -> bool {
    occupancy
        .holder
        .as_ref()
        .is_some_and(|h| h.owner_token.is_none())
}

/// Whether a process without a record holds `stem`'s lock file exclusively. The probe
/// takes a shared lock for an instant.
fn held_outside(layout: &Layout, stem: &str) -> bool {
    let Ok(file) = File::open(layout.lock_path(stem)) else {
        return false;
    };
    matches!(
        Flock::lock(file, FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    )
}

/// The names under `prefix` with a live holder, sorted.
pub(crate) fn list(layout: &Layout, prefix: &str) -> Result<Vec<LockName>> {
    Ok(layout
        .held_names()?
        .into_iter()
        .filter(|name| name.as_str().starts_with(prefix))
        .collect())
}

/// Removes the records of `stem`'s holders and returns the oldest. Their processes give
/// the `flock`s back as soon as their record goes (each hold watches it), and their next
/// renewal turns them Lost (`Broken`).
///
/// # Errors
/// [`Error::Unsupported`] when only a process outside distlock holds the lock: the
/// kernel lets no other process take its `flock` away.
pub(crate) fn force_release(layout: &Layout, stem: &str) -> Result<Option<Participant>> {
    let holders: Vec<_> = layout
        .records(stem)?
        .into_iter()
        .filter(|r| r.state == State::Hold)
        .collect();
    if holders.is_empty() {
        if held_outside(layout, stem) {
            let name = unescape(stem, file_stem).unwrap_or_else(|| stem.to_owned());
            return Err(Error::unsupported(
                BACKEND,
                format!(
                    "breaking `{name}`: a process outside distlock (such as flock(1)) holds \
                     its lock file, and the kernel lets no other process take an flock away"
                ),
            ));
        }
        return Ok(None);
    }
    for holder in &holders {
        let mark = layout.break_mark_path(stem, &holder.token);
        fs::write(&mark, b"").map_err(|e| from_io("marking a hold broken", e))?;
        if fs::remove_file(layout.record_path(stem, State::Hold, &holder.token)).is_err() {
            // Released meanwhile: nobody will read the mark.
            let _ = fs::remove_file(&mark);
        }
    }
    Ok(holders.first().map(|r| r.participant()))
}
