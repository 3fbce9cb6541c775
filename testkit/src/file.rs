//! The conformance factory for `file://`: each factory a temporary directory of its own,
//! removed when it drops, and what a test reads behind the library there (records,
//! `flock`s held on lock and slot files).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use conformance::{Crash, Factory};
use lock_core::{DistributedLock, LockName, LockOptions};
use lock_file::{file_stem, FileConfig, FileLock};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Clients of one lock directory.
#[derive(Debug)]
pub struct FileFactory {
    dir: tempfile::TempDir,
}

impl FileFactory {
    /// A factory on a fresh temporary directory.
    pub fn new() -> Self {
        lock_core::raw::driver::register::<lock_file::FileBackend>();
        FileFactory {
            dir: tempfile::Builder::new()
                .prefix("distlock-file-")
                .tempdir()
                .expect("a temporary directory"),
        }
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client of the directory.
    pub async fn file_client(&self, options: LockOptions) -> FileLock {
        FileLock::connect(FileConfig::new(self.dir()).with_options(options))
            .await
            .expect("a file:// client opens")
    }
}

impl Default for FileFactory {
    fn default() -> Self {
        FileFactory::new()
    }
}

/// The directory's files of `name`: its lock file, slots, records and temporaries.
pub fn files_of(dir: &Path, name: &LockName) -> Vec<PathBuf> {
    let stem = file_stem(name.as_str());
    let related = |file: &str| {
        file == stem
            || file
                .strip_prefix(&stem)
                .is_some_and(|rest| rest.starts_with('~'))
            || file
                .strip_prefix('.')
                .and_then(|f| f.strip_prefix(&stem))
                .is_some_and(|rest| rest.starts_with('~'))
    };
    // The lock directory's own files, and the records in their directory.
    let records = dir.join(".records");
    let listed = [dir, records.as_path()].map(|dir| std::fs::read_dir(dir).ok());
    let mut files: Vec<PathBuf> = listed
        .into_iter()
        .flatten()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(related))
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// Whether some process holds an `flock` on `path` (probed with a shared lock, then an
/// exclusive one, each given back at once).
pub fn locked(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(_) => false,
        Err((_, errno)) => errno == Errno::EWOULDBLOCK,
    }
}

/// A client of this process cannot be cut off alive from its `flock`s: `file://` holds
/// live as long as their process (`Capabilities::lease` is false, so the suite never
/// asks). lock-file's own tests kill holder processes instead.
struct NoCutOff;

#[async_trait]
impl Crash for NoCutOff {
    async fn crash(&self) {
        panic!(
            "file:// holds cannot be cut off from a live process; see lock-file's process tests"
        );
    }
}

#[async_trait]
impl Factory for FileFactory {
    fn label(&self) -> String {
        format!("file {}", self.dir().display())
    }

    fn url(&self) -> String {
        format!("file://{}", self.dir().display())
    }

    async fn client(&self, options: LockOptions) -> Arc<dyn DistributedLock> {
        Arc::new(self.file_client(options).await)
    }

    async fn crashable_client(
        &self,
        options: LockOptions,
    ) -> (Arc<dyn DistributedLock>, Box<dyn Crash>) {
        (self.client(options).await, Box::new(NoCutOff))
    }

    /// Removes the holder records of `name`: their clients find them gone at the next
    /// renewal and give the `flock`s back.
    async fn steal(&self, name: &LockName) {
        for path in files_of(self.dir(), name) {
            let is_hold = path
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.contains("~hold~") && !f.starts_with('.'));
            if is_hold {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Records, marks and temporaries of `names`, and lock or slot files someone holds.
    async fn leftovers(&self, names: &[LockName]) -> Vec<String> {
        let mut left = Vec::new();
        for name in names {
            for path in files_of(self.dir(), name) {
                let file = path
                    .file_name()
                    .and_then(|f| f.to_str())
                    .unwrap_or_default()
                    .to_owned();
                let persistent =
                    !file.contains('~') || file.ends_with("~fence") || file.contains("~slot~");
                if !persistent {
                    left.push(format!("{file} (a record, mark or temporary)"));
                } else if !file.ends_with("~fence") && locked(&path) {
                    left.push(format!("{file} (locked)"));
                }
            }
        }
        left
    }
}
