//! One server's lifecycle ([`Node`]): its launch spec, readiness probe and current
//! process; launch, readiness wait, signals, kill, stop and restart, serialized.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::probe::Probe;
use super::process::{
    listener_owned_by, log_tail, read_from, LaunchSpec, ServerProcess, LOG_TAIL_LINES,
};
use super::HarnessError;

/// Bound on one readiness probe attempt.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts of a same-port restart when the port is briefly taken.
const RESTART_ATTEMPTS: usize = 5;

/// Mutable state of a [`Node`].
#[derive(Debug, Default)]
struct NodeState {
    process: Option<ServerProcess>,
    paused: bool,
}

/// One server: its launch spec, readiness probe and current process.
///
/// Lifecycle operations (kill, stop, restart) are serialized; status queries never wait
/// for them.
#[derive(Debug)]
pub(crate) struct Node {
    label: String,
    spec: LaunchSpec,
    probe: Probe,
    ready_timeout: Duration,
    state: Mutex<NodeState>,
    ops: tokio::sync::Mutex<()>,
}

impl Node {
    pub(crate) fn new(
        label: String,
        spec: LaunchSpec,
        probe: Probe,
        ready_timeout: Duration,
    ) -> Self {
        Self {
            label,
            spec,
            probe,
            ready_timeout,
            state: Mutex::new(NodeState::default()),
            ops: tokio::sync::Mutex::new(()),
        }
    }

    /// Adds `env` to the environment of every start (before the first).
    pub(crate) fn add_env(&mut self, env: Vec<(std::ffi::OsString, std::ffi::OsString)>) {
        self.spec.env.extend(env);
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn ready_timeout(&self) -> Duration {
        self.ready_timeout
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.spec.log
    }

    fn state(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pid of the live (possibly paused) process.
    pub(crate) fn pid(&self) -> Option<u32> {
        let mut state = self.state();
        let process = state.process.as_mut()?;
        if process.try_reap().is_some() {
            return None;
        }
        Some(process.pid)
    }

    /// A process exists and is not paused.
    pub(crate) fn is_running(&self) -> bool {
        self.pid().is_some() && !self.state().paused
    }

    /// Spawns the process and waits for readiness; kills it again on failure.
    pub(crate) async fn launch(&self) -> Result<(), HarnessError> {
        let offset = self.spawn()?;
        let result = self.wait_ready(offset).await;
        if result.is_err() {
            let process = self.state().process.take();
            if let Some(mut process) = process {
                let _ = process.kill_and_reap(&self.label).await;
            }
        }
        result
    }

    /// Spawns the process (replacing none: the caller ensures nothing runs); returns the
    /// log length before the spawn, where this run's output starts.
    pub(crate) fn spawn(&self) -> Result<u64, HarnessError> {
        let offset = std::fs::metadata(&self.spec.log)
            .map(|m| m.len())
            .unwrap_or(0);
        if offset > 0 {
            if let Ok(mut f) = OpenOptions::new().append(true).open(&self.spec.log) {
                let _ = writeln!(f, "\n----- harness: starting {} again -----", self.label);
            }
        }
        let process = ServerProcess::spawn(&self.label, &self.spec)?;
        let mut state = self.state();
        state.process = Some(process);
        state.paused = false;
        Ok(offset)
    }

    /// Polls the readiness probe until it passes, the process exits, the log reports a
    /// port clash, or the ready timeout passes.
    pub(crate) async fn wait_ready(&self, log_offset: u64) -> Result<(), HarnessError> {
        let started = Instant::now();
        let mut interval = Duration::from_millis(20);
        loop {
            let exited = {
                let mut state = self.state();
                match state.process.as_mut() {
                    None => Some("killed".to_owned()),
                    Some(p) => p.try_reap().map(|s| s.to_string()),
                }
            };
            let clash = self.log_reports_addr_in_use(log_offset);
            if clash {
                return Err(HarnessError::AddrInUse {
                    server: self.label.clone(),
                    log: self.spec.log.display().to_string(),
                    log_tail: log_tail(&self.spec.log, LOG_TAIL_LINES),
                });
            }
            if let Some(status) = exited {
                return Err(HarnessError::Exited {
                    server: self.label.clone(),
                    status,
                    log: self.spec.log.display().to_string(),
                    log_tail: log_tail(&self.spec.log, LOG_TAIL_LINES),
                });
            }
            let last = match self.probe.check(PROBE_TIMEOUT).await {
                Ok(()) => {
                    // The answer may come from another process that holds the port while
                    // ours failed to bind it (and has not exited yet).
                    let pid = self.pid();
                    let port = self.probe.port();
                    if pid.and_then(|pid| listener_owned_by(pid, port)) == Some(false) {
                        return Err(HarnessError::AddrInUse {
                            server: self.label.clone(),
                            log: self.spec.log.display().to_string(),
                            log_tail: format!(
                                "(port {port} answers, but not from pid {pid:?})\n{}",
                                log_tail(&self.spec.log, LOG_TAIL_LINES)
                            ),
                        });
                    }
                    return Ok(());
                }
                Err(seen) => seen,
            };
            if started.elapsed() >= self.ready_timeout {
                return Err(HarnessError::NotReady {
                    server: self.label.clone(),
                    waited: started.elapsed(),
                    detail: last,
                    log: self.spec.log.display().to_string(),
                    log_tail: log_tail(&self.spec.log, LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(interval).await;
            interval = (interval * 2).min(Duration::from_millis(250));
        }
    }

    fn log_reports_addr_in_use(&self, offset: u64) -> bool {
        read_from(&self.spec.log, Some(offset), 4 << 20)
            .to_ascii_lowercase()
            .contains("address already in use")
    }

    /// One readiness probe, now.
    pub(crate) async fn probe_once(&self) -> Result<(), String> {
        self.probe.check(PROBE_TIMEOUT).await
    }

    fn signal(&self, sig: Signal) -> Result<(), HarnessError> {
        let state = self.state();
        let process = state
            .process
            .as_ref()
            .ok_or_else(|| HarnessError::NotRunning {
                server: self.label.clone(),
            })?;
        process.signal(&self.label, sig)
    }

    /// SIGKILL (and SIGCONT) without reaping: lets a cluster's members die in parallel
    /// before each one's drop reaps it.
    pub(crate) fn kill_now(&self) {
        let _ = self.signal(Signal::SIGKILL);
        let _ = self.signal(Signal::SIGCONT);
    }

    /// SIGSTOP.
    pub(crate) fn pause(&self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGSTOP)?;
        self.state().paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGCONT)?;
        self.state().paused = false;
        Ok(())
    }

    /// SIGKILL and reap; a no-op when nothing runs.
    pub(crate) async fn kill9(&self) -> Result<(), HarnessError> {
        let _ops = self.ops.lock().await;
        self.kill_locked().await
    }

    async fn kill_locked(&self) -> Result<(), HarnessError> {
        let process = {
            let mut state = self.state();
            state.paused = false;
            state.process.take()
        };
        match process {
            Some(mut p) => p.kill_and_reap(&self.label).await,
            None => Ok(()),
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; a no-op when nothing runs.
    pub(crate) async fn stop(&self, grace: Duration) -> Result<(), HarnessError> {
        let _ops = self.ops.lock().await;
        let process = {
            let mut state = self.state();
            state.paused = false;
            state.process.take()
        };
        match process {
            Some(mut p) => p.terminate(&self.label, grace).await,
            None => Ok(()),
        }
    }

    /// Kills the process if any, runs `between` (e.g. wipe data), starts again on the same
    /// ports and data dir, and waits for readiness. Retries briefly if a port is taken.
    pub(crate) async fn restart(
        &self,
        between: impl FnOnce() -> Result<(), HarnessError>,
    ) -> Result<(), HarnessError> {
        let _ops = self.ops.lock().await;
        self.kill_locked().await?;
        between()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.launch().await {
                Err(e) if e.is_addr_in_use() && attempt < RESTART_ATTEMPTS => {
                    tracing::warn!(server = %self.label, attempt, "port taken on restart, retrying");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                other => return other,
            }
        }
    }
}
