//! A fenced local file: write-then-rename under an exclusive OS lock, guarded by the token
//! stored in the file itself.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tokio::time::Instant;

use super::{admits, FenceOutcome, Fenced, FencedStore};
use crate::options::DEFAULT_REQUEST_TIMEOUT;
use crate::plumbing::Backoff;
use crate::{Error, FencingToken, Result};

const BACKEND: &str = "file";
/// The first line of the file: this text, the token in decimal, a newline; the value
/// follows.
const HEADER: &str = "distlock-fence ";

/// A fenced file at `path`: its first line holds the newest accepted token
/// (`distlock-fence <token>`), the value follows.
///
/// A write takes an exclusive `flock` on the sidecar `<path>.lock` (never on the file
/// itself, which each write replaces), reads the stored token, and only if the new token
/// is at least as high writes `<path>.tmp`, fsyncs it, renames it over `path` and fsyncs
/// the directory; so the token and the value change together, atomically and durably, and
/// readers never see half a write. Writers in every process of the machine that use
/// `FileFence` on the same path exclude each other; the kernel drops the lock of a writer
/// that dies. Local file systems only: `flock` over NFS is not this promise.
///
/// The blocking I/O runs off the async runtime; a writer waits for the sidecar lock at
/// most the timeout (default [`DEFAULT_REQUEST_TIMEOUT`]), polling it with backoff.
#[derive(Debug, Clone)]
pub struct FileFence {
    path: Arc<PathBuf>,
    timeout: Duration,
}

impl FileFence {
    /// The fenced file at `path`, whose directory must exist (nothing is created yet).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `path` names no file (empty, `/`, ending in `..`) or
    /// its directory does not exist.
    pub fn new(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if path.file_name().is_none() {
            return Err(Error::config(format!(
                "a fenced file needs a file name: {}",
                path.display()
            )));
        }
        let dir = directory_of(&path);
        if !dir.is_dir() {
            return Err(Error::config(format!(
                "the directory of the fenced file {} does not exist",
                path.display()
            )));
        }
        Ok(FileFence {
            path: Arc::new(path),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// The same file, with calls bounded by `timeout` instead.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The fenced file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `step` on the blocking pool until it stops reporting a busy sidecar lock or
    /// the timeout passes.
    async fn blocking<T: Send + 'static>(
        &self,
        what: &'static str,
        step: fn(&Path, FencingToken, &[u8]) -> Step<T>,
        token: FencingToken,
        value: &[u8],
    ) -> Result<T> {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
        let value: Arc<[u8]> = value.into();
        loop {
            let (path, value) = (self.path.clone(), value.clone());
            let task = tokio::task::spawn_blocking(move || step(&path, token, &value));
            let outcome = tokio::time::timeout_at(deadline, task)
                .await
                .map_err(|_| Error::no_answer(BACKEND, what, self.timeout))?
                .map_err(|err| io_error(what, &self.path, std::io::Error::other(err)))?;
            match outcome {
                Step::Done(result) => return result.map_err(|err| io_error(what, &self.path, err)),
                Step::Corrupt(message) => return Err(corrupt(&self.path, message)),
                Step::Busy => {}
            }
            let pause = backoff.next_pause();
            if Instant::now() + pause >= deadline {
                return Err(Error::no_answer(BACKEND, what, self.timeout));
            }
            tokio::time::sleep(pause).await;
        }
    }
}

#[async_trait]
impl FencedStore for FileFence {
    async fn write(&self, token: FencingToken, value: &[u8]) -> Result<FenceOutcome> {
        self.blocking("fenced write", write_locked, token, value)
            .await
    }

    async fn read(&self) -> Result<Option<Fenced>> {
        self.blocking(
            "fenced read",
            |path, _, _| read_file(path),
            FencingToken(0),
            &[],
        )
        .await
    }
}

/// One try of a blocking step.
enum Step<T> {
    Done(std::io::Result<T>),
    /// The sidecar lock is taken by another writer.
    Busy,
    /// The file is not a fenced file.
    Corrupt(String),
}

impl<T> From<std::io::Error> for Step<T> {
    fn from(err: std::io::Error) -> Self {
        Step::Done(Err(err))
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The write, under the sidecar lock: compare, then write-then-rename.
fn write_locked(path: &Path, token: FencingToken, value: &[u8]) -> Step<FenceOutcome> {
    let sidecar = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(beside(path, ".lock"))
    {
        Ok(file) => file,
        Err(err) => return err.into(),
    };
    let _locked = match Flock::lock(sidecar, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => locked,
        Err((_, Errno::EWOULDBLOCK)) => return Step::Busy,
        Err((_, errno)) => return std::io::Error::from(errno).into(),
    };
    let newest = match read_file(path) {
        Step::Done(Ok(stored)) => stored.map(|fenced| fenced.token),
        Step::Done(Err(err)) => return err.into(),
        Step::Corrupt(message) => return Step::Corrupt(message),
        Step::Busy => return Step::Busy,
    };
    let outcome = admits(newest, token);
    if outcome.is_written() {
        if let Err(err) = replace(path, token, value) {
            return err.into();
        }
    }
    Step::Done(Ok(outcome))
}

/// Writes `<path>.tmp`, fsyncs it, renames it over `path`, fsyncs the directory.
fn replace(path: &Path, token: FencingToken, value: &[u8]) -> std::io::Result<()> {
    let temp = beside(path, ".tmp");
    let mut file = File::create(&temp)?;
    file.write_all(format!("{HEADER}{token}\n").as_bytes())?;
    file.write_all(value)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, path)?;
    File::open(directory_of(path))?.sync_all()
}

/// The stored token and value, `None` when there is no file yet.
fn read_file(path: &Path) -> Step<Option<Fenced>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == IoKind::NotFound => return Step::Done(Ok(None)),
        Err(err) => return err.into(),
    };
    match parse(&bytes) {
        Some(fenced) => Step::Done(Ok(Some(fenced))),
        None => Step::Corrupt("its first line is not `distlock-fence <token>`".into()),
    }
}

/// A fenced file's content: the header line's token, the value after it.
fn parse(bytes: &[u8]) -> Option<Fenced> {
    let rest = bytes.strip_prefix(HEADER.as_bytes())?;
    let end = rest.iter().position(|&b| b == b'\n')?;
    let token = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some(Fenced {
        token: FencingToken(token),
        value: rest[end + 1..].to_vec(),
    })
}

fn io_error(what: &str, path: &Path, err: std::io::Error) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message: format!("{what} on {}: {err}", path.display()),
        source: Some(Box::new(err)),
    }
}

fn corrupt(path: &Path, message: String) -> Error {
    Error::Protocol {
        backend: BACKEND,
        message: format!("{} is not a fenced file: {message}", path.display()),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_line_carries_the_token() {
        let fenced = parse(
            b"distlock-fence 42
hello
world",
        )
        .expect("parses");
        assert_eq!(fenced.token, FencingToken(42));
        assert_eq!(fenced.value, b"hello\nworld");
        assert!(parse(b"distlock-fence x\n").is_none());
        assert!(parse(b"plain text").is_none());
    }
}
