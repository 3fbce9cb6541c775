//! Server child processes: finding the binary, spawning with logs in the temp dir,
//! signals and reaping, reading the log.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::HarnessError;

/// How a finished program ended and what it printed, for a failure message.
pub fn output_text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Lines of log quoted in start-up errors.
pub(crate) const LOG_TAIL_LINES: usize = 30;
/// Bound on reaping a killed process asynchronously.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on the busy reap in `Drop` (SIGKILL takes effect in well under this).
const DROP_REAP_SPIN: Duration = Duration::from_millis(500);
/// Bound on the wait, after a kill, for the killed children of a server to die.
const CHILDREN_EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Finds an executable: `$env_var` if set, else the `PATH` and the usual system directories.
pub(crate) fn find_binary(
    name: &str,
    env_var: &str,
    hint: &'static str,
) -> Result<PathBuf, HarnessError> {
    if let Some(path) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(HarnessError::MissingBinary {
                binary: format!("{} (from ${env_var})", path.display()),
                hint,
            })
        };
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| HarnessError::MissingBinary {
            binary: name.to_owned(),
            hint,
        })
}

/// Whether `path` is an executable file.
pub(crate) fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The last `n` lines of a log file (reads at most its last 256 KiB).
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let text = read_from(path, None, 256 * 1024);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Reads a file from `offset` (or its last `cap` bytes when `offset` is `None`), at most `cap`.
pub(crate) fn read_from(path: &Path, offset: Option<u64>, cap: u64) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = match offset {
        Some(o) => o.min(len),
        None => len.saturating_sub(cap),
    };
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if file.take(cap).read_to_end(&mut buf).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Whether the process `pid` holds the listening TCP socket on `port` (Linux `/proc`);
/// `None` when that cannot be told.
pub(crate) fn listener_owned_by(pid: u32, port: u16) -> Option<bool> {
    let mut inodes = Vec::new();
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && *state == "0A" {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if !readable {
        return None;
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .map(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
            .unwrap_or(false)
    }))
}

/// An unprivileged OS user a server runs as (PostgreSQL refuses to run as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// How to launch one server process.
#[derive(Debug, Clone)]
pub(crate) struct LaunchSpec {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) cwd: PathBuf,
    pub(crate) log: PathBuf,
    /// Run as this user (setgid/setuid in the child before exec); `None`: as we run.
    pub(crate) run_as: Option<RunAs>,
    /// Signal the process's children too: for a server that forks workers (the
    /// PostgreSQL postmaster, whose workers each lead a process group of their own), so
    /// that a kill or a pause reaches them.
    pub(crate) with_children: bool,
}

/// One spawned child. Killed (SIGKILL) and reaped on drop, even when stopped.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    /// `None` once reaped.
    child: Option<Child>,
    pub(crate) pid: u32,
    /// Signals reach the children of `pid` too.
    children: bool,
}

impl ServerProcess {
    pub(crate) fn spawn(label: &str, spec: &LaunchSpec) -> Result<Self, HarnessError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|e| HarnessError::io(label, format!("open {}", spec.log.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| HarnessError::io(label, "clone log handle", e))?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(true);
        if let Some(user) = spec.run_as {
            // std drops the supplementary groups (setgroups) when it runs as root.
            cmd.gid(user.gid).uid(user.uid);
        }
        let child = cmd
            .spawn()
            .map_err(|e| HarnessError::io(label, format!("spawn {}", spec.program.display()), e))?;
        let pid = child.id().ok_or_else(|| {
            HarnessError::io(label, "read pid", std::io::Error::other("child has no pid"))
        })?;
        Ok(Self {
            child: Some(child),
            pid,
            children: spec.with_children,
        })
    }

    /// `kill(2)`s the process and, with `children`, its children (first stopping the
    /// process for SIGKILL and SIGSTOP, so that it forks no new one meanwhile). Returns
    /// the children signalled.
    fn send(&self, sig: Signal) -> nix::Result<Vec<u32>> {
        if !self.children {
            return kill(pid_of(self.pid), sig).map(|()| Vec::new());
        }
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            kill(pid_of(self.pid), Signal::SIGSTOP)?;
        }
        let children = children_of(self.pid);
        for &child in &children {
            let _ = kill(pid_of(child), sig);
        }
        kill(pid_of(self.pid), sig)?;
        Ok(children)
    }

    /// Sends `sig` unless the child has been reaped (so a recycled pid is never signalled).
    pub(crate) fn signal(&self, label: &str, sig: Signal) -> Result<(), HarnessError> {
        if self.child.is_none() {
            return Err(HarnessError::NotRunning {
                server: label.to_owned(),
            });
        }
        self.send(sig)
            .map(drop)
            .map_err(|source| HarnessError::Signal {
                server: label.to_owned(),
                signal: sig.as_str(),
                pid: self.pid,
                source,
            })
    }

    /// Reaps the child if it has exited; returns its status.
    pub(crate) fn try_reap(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Polls `waitpid(WNOHANG)` until the child is reaped or `bound` passes.
    ///
    /// Polling (rather than `Child::wait`) works from any runtime, also when the one that
    /// spawned the child is gone (a server shared between tests).
    async fn reap_within(&mut self, bound: Duration) -> bool {
        let started = Instant::now();
        let mut interval = Duration::from_millis(1);
        loop {
            if self.child.is_none() || self.try_reap().is_some() {
                return true;
            }
            if started.elapsed() >= bound {
                return false;
            }
            tokio::time::sleep(interval).await;
            interval = (interval * 2).min(Duration::from_millis(20));
        }
    }

    /// SIGKILL (plus SIGCONT for a stopped child), then reap, bounded.
    pub(crate) async fn kill_and_reap(&mut self, label: &str) -> Result<(), HarnessError> {
        if self.child.is_none() {
            return Ok(());
        }
        let children = self.send(Signal::SIGKILL).unwrap_or_default();
        let _ = self.send(Signal::SIGCONT);
        if self.reap_within(REAP_TIMEOUT).await {
            // The children are orphans now, which nobody may reap: wait until each is
            // dead (a zombie at worst), so that a restart finds their resources released.
            let started = Instant::now();
            while children.iter().any(|&c| is_alive(c)) && started.elapsed() < CHILDREN_EXIT_TIMEOUT
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(())
        } else {
            Err(HarnessError::io(
                label,
                "reap killed process",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("pid {} still not reaped after {REAP_TIMEOUT:?}", self.pid),
                ),
            ))
        }
    }

    /// SIGTERM (plus SIGCONT), wait up to `grace`, then SIGKILL.
    pub(crate) async fn terminate(
        &mut self,
        label: &str,
        grace: Duration,
    ) -> Result<(), HarnessError> {
        if self.child.is_none() {
            return Ok(());
        }
        let _ = self.send(Signal::SIGTERM);
        let _ = self.send(Signal::SIGCONT);
        if self.reap_within(grace).await {
            return Ok(());
        }
        self.kill_and_reap(label).await
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        let _ = self.send(Signal::SIGKILL);
        let _ = self.send(Signal::SIGCONT);
        // Bounded, non-sleeping reap; if it does not finish, dropping the tokio `Child`
        // (kill_on_drop) hands it to the runtime's orphan reaper.
        let deadline = Instant::now() + DROP_REAP_SPIN;
        while Instant::now() < deadline {
            if self.try_reap().is_some() {
                return;
            }
            std::thread::yield_now();
        }
    }
}

/// State and parent pid of process `pid`, from `/proc/PID/stat`.
fn proc_stat(pid: &str) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, ppid, ...
    let mut fields = stat.rsplit(')').next()?.split_whitespace();
    let state = fields.next()?.to_owned();
    Some((state, fields.next()?.parse().ok()?))
}

/// Whether process `pid` exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    proc_stat(&pid.to_string()).is_some_and(|(state, _)| state != "Z" && state != "X")
}

/// The child processes of `pid`, from `/proc`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let (_, ppid) = proc_stat(&child.to_string())?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}
