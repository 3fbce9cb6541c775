//! Shared set-up of the distlock examples: the lock URL taken from the environment, and a
//! toy storage that fences its writes.
//!
//! The crate also compiles the Rust blocks of the workspace's markdown as doc tests
//! (`cargo test -p examples --doc`), so the README and docs/ cannot drift from the API:
//! the `distlock` crate is published and cannot include files outside its directory,
//! this one is not. A block that needs a live server is `rust,no_run`; a block that is not
//! Rust says what it is (`toml`, `sh`, `text`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use distlock::FencingToken;

/// The lock URL from `LOCK_URL`, or `memory://examples`.
pub fn lock_url() -> String {
    std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://examples".to_owned())
}

/// A toy storage service that fences its writes: each key keeps the highest fencing token
/// that wrote it and refuses a write with an older one, so a holder that stalled past its
/// lease cannot overwrite what the next holder wrote. Real storage does the same with a
/// conditional write (a version column, a compare-and-set, an etcd transaction).
#[derive(Debug)]
pub struct FencedStore<V> {
    keys: Mutex<HashMap<String, (FencingToken, V)>>,
}

impl<V: Clone> FencedStore<V> {
    /// A store holding `initial`, written by no lock holder yet.
    pub fn new<'a>(initial: impl IntoIterator<Item = (&'a str, V)>) -> Self {
        let keys = initial
            .into_iter()
            .map(|(key, value)| (key.to_owned(), (FencingToken(0), value)))
            .collect();
        FencedStore {
            keys: Mutex::new(keys),
        }
    }

    /// Writes `value` at `key` for the holder of fencing token `token`.
    ///
    /// # Errors
    /// The refusal, when `key` was written with a newer token.
    pub fn write(&self, key: &str, token: FencingToken, value: V) -> Result<(), String> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match keys.get(key) {
            Some((newest, _)) if token < *newest => {
                Err(format!("{key}: refused token {token}, older than {newest}"))
            }
            _ => {
                keys.insert(key.to_owned(), (token, value));
                Ok(())
            }
        }
    }

    /// The value at `key`, if any.
    pub fn read(&self, key: &str) -> Option<V> {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(key).map(|(_, value)| value.clone())
    }
}

/// One module per markdown file, its text as the module's doc: rustdoc runs its blocks. A
/// failing block is reported as `markdown::<file> (line N)`, N being the line of its
/// `#[doc]` attribute here plus the block's line in the file, less one.
#[cfg(doctest)]
mod markdown {
    #[doc = include_str!("../../README.md")]
    mod readme {}
    #[doc = include_str!("../../docs/README.md")]
    mod docs_index {}
    #[doc = include_str!("../../docs/locks.md")]
    mod locks {}
    #[doc = include_str!("../../docs/election.md")]
    mod election {}
    #[doc = include_str!("../../docs/semaphore.md")]
    mod semaphore {}
    #[doc = include_str!("../../docs/rwlock.md")]
    mod rwlock {}
    #[doc = include_str!("../../docs/multilock.md")]
    mod multilock {}
    #[doc = include_str!("../../docs/fencing.md")]
    mod fencing {}
    #[doc = include_str!("../../docs/configuration.md")]
    mod configuration {}
    #[doc = include_str!("../../docs/operations.md")]
    mod operations {}
    #[doc = include_str!("../../docs/metrics.md")]
    mod metrics {}
    #[doc = include_str!("../../docs/migration.md")]
    mod migration {}
    #[doc = include_str!("../../docs/guarantees.md")]
    mod guarantees {}
    #[doc = include_str!("../../docs/reliability.md")]
    mod reliability {}
    #[doc = include_str!("../../docs/benchmarks.md")]
    mod benchmarks {}
    #[doc = include_str!("../../docs/conformance.md")]
    mod conformance {}
    #[doc = include_str!("../../docs/architecture.md")]
    mod architecture {}
    #[doc = include_str!("../../docs/setup.md")]
    mod setup {}
    #[doc = include_str!("../../docs/research/election-interop.md")]
    mod election_interop {}
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Reports written by the tools, whose text is not written by hand (and holds no Rust).
    const GENERATED: &[&str] = &["docs/lockbench-report.md", "docs/reliability-report.md"];

    /// Every markdown file of docs/ (and the README) has a doc-test module above, or is a
    /// generated report.
    #[test]
    fn every_markdown_file_is_doc_tested() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let this = include_str!("lib.rs");
        let mut files = vec!["README.md".to_owned()];
        let mut dirs = vec![root.join("docs")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("docs/ is readable") {
                let path = entry.expect("a docs/ entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|ext| ext == "md") {
                    let relative = path.strip_prefix(&root).expect("under the workspace");
                    files.push(relative.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        for file in files {
            let included = this.contains(&format!("include_str!(\"../../{file}\")"));
            assert!(
                included || GENERATED.contains(&file.as_str()),
                "{file}: add a doc-test module for it to examples/src/lib.rs"
            );
        }
    }
}
