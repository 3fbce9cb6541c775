//! The raw floor of a `file://` directory: `flock(2)` on the name's file, taken without
//! blocking and given back by closing it, off the runtime as the library does it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use nix::fcntl::{Flock, FlockArg};

use super::{RawFloor, RawHold};
use crate::error::BoxError;

pub(super) struct FileFloor {
    dir: PathBuf,
    /// The open, locked file of each raw hold, by its token.
    held: Arc<Mutex<HashMap<String, Flock<File>>>>,
}

impl FileFloor {
    pub(super) fn new(dir: PathBuf) -> Self {
        FileFloor {
            dir,
            held: Arc::default(),
        }
    }
}

#[async_trait]
impl RawFloor for FileFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        // Bench names have slashes: one flat file per name is enough for the floor.
        let path = self.dir.join(name.replace('/', "_"));
        let token = uuid::Uuid::new_v4().simple().to_string();
        let held = Arc::clone(&self.held);
        let key = token.clone();
        tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| format!("raw open of {}: {e}", path.display()))?;
            let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
                .map_err(|(_, errno)| format!("raw flock of {}: {errno}", path.display()))?;
            held.lock()
                .map_err(|_| "raw floor poisoned")?
                .insert(key, lock);
            Ok(())
        })
        .await??;
        Ok(RawHold::new(name.to_owned(), token))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let held = Arc::clone(&self.held);
        tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
            let lock = held
                .lock()
                .map_err(|_| "raw floor poisoned")?
                .remove(&hold.token);
            // Closing the file gives the lock back.
            drop(lock.ok_or("raw release of a hold the floor does not know")?);
            Ok(())
        })
        .await?
    }
}
