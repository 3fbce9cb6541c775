//! The machine-local lock directory `run`, `elect`, `hold`, `try` and the operator
//! commands use when no lock service is named (no `--url`, no `LOCK_URL`): `file://` on
//! a directory private to the user, so that the same user's processes exclude each
//! other as with flock(1).
//!
//! `$XDG_RUNTIME_DIR/distlock`; without `XDG_RUNTIME_DIR` (cron, services) the same
//! directory under `/run/user/UID` when that exists; else `/tmp/distlock-UID`, made
//! private (0700) and refused unless it is a directory of this user that no one else may
//! write (another user could have made it first).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The `file://` URL of the machine-local lock directory.
///
/// # Errors
/// A message saying why the directory cannot be used.
pub(crate) fn default_url() -> Result<String, String> {
    Ok(file_url(&default_dir()?))
}

fn default_dir() -> Result<PathBuf, String> {
    let uid = nix::unistd::getuid().as_raw();
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .or_else(|| Some(PathBuf::from(format!("/run/user/{uid}"))))
        .filter(|dir| dir.is_dir());
    if let Some(runtime) = runtime {
        return Ok(runtime.join("distlock"));
    }
    let dir = PathBuf::from(format!("/tmp/distlock-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(format!("making {}: {err}", dir.display())),
    }
    private(&dir, uid)?;
    Ok(dir)
}

/// Refuses `dir` unless it is a directory (not a link) of `uid` that no one else may
/// write.
fn private(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of this user that only it may write; give --url \
             file:///A/PRIVATE/DIR",
            dir.display()
        ));
    }
    Ok(())
}

/// `file://PATH`, with the characters a lock URL reserves percent-encoded.
fn file_url(dir: &Path) -> String {
    let mut url = String::from("file://");
    for byte in dir.as_os_str().as_encoded_bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' | b'_' | b'-' => {
                url.push(char::from(*byte));
            }
            other => url.push_str(&format!("%{other:02X}")),
        }
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_file_urls() {
        assert_eq!(
            file_url(Path::new("/run/user/1000/distlock")),
            "file:///run/user/1000/distlock"
        );
        assert_eq!(file_url(Path::new("/tmp/a b?")), "file:///tmp/a%20b%3F");
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let scratch = tempfile::tempdir().expect("scratch");
        let uid = nix::unistd::getuid().as_raw();
        let dir = scratch.path().join("open");
        std::fs::DirBuilder::new()
            .mode(0o777)
            .create(&dir)
            .expect("mkdir");
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
        assert!(private(&dir, uid).is_err());
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("chmod");
        assert!(private(&dir, uid).is_ok());
        assert!(private(&dir, uid + 1).is_err());
    }
}
