//! The fleet: `fleet_member` processes (the examples' fleet process, built next to this
//! program) started with the lock URL of their phase, each taking the lock over and over
//! and writing the fenced counter. A member is stopped gracefully (its stop file appears,
//! it finishes the cycle in hand, releases and prints its summary); a member that does not
//! stop in time is killed by its pid.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::BoxError;

/// Bound on a member's start (connect) and on its stop (last cycle, release, exit).
const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// Bound on a member's whole run, whatever happens.
const RUN_LIMIT: &str = "10m";
/// A member's pause after each release, so that the others get their turns.
const PAUSE: &str = "2ms";

/// The three phases of a migration, each one lock URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Old,
    Dual,
    New,
}

impl Phase {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::Old => "old only",
            Phase::Dual => "dual",
            Phase::New => "new only",
        }
    }
}

/// The lock URLs of the three phases.
#[derive(Debug, Clone)]
pub(crate) struct Urls {
    pub(crate) old: String,
    pub(crate) new: String,
}

impl Urls {
    /// The URL a process of `phase` is configured with.
    pub(crate) fn of(&self, phase: Phase) -> String {
        match phase {
            Phase::Old => self.old.clone(),
            Phase::Dual => distlock::migration::DualConfig::new(&self.old, &self.new).url(),
            Phase::New => self.new.clone(),
        }
    }
}

/// What a member did: the fields of its `SUMMARY <json>` line that the walk shows.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Done {
    pub(crate) cycles: u64,
    pub(crate) first_token: Option<u64>,
    pub(crate) last_token: Option<u64>,
    pub(crate) tokens_backwards: u64,
    pub(crate) error: Option<String>,
}

/// One running member.
#[derive(Debug)]
struct Member {
    phase: Phase,
    child: Child,
    stop_file: PathBuf,
    /// Reads the member's output to its end; yields its summary.
    output: JoinHandle<Option<Done>>,
}

/// The members, one per slot, and the directory of their stop files.
#[derive(Debug)]
pub(crate) struct Fleet {
    program: PathBuf,
    urls: Urls,
    name: String,
    fence: SocketAddr,
    dir: PathBuf,
    spawned: usize,
    members: Vec<Member>,
}

impl Fleet {
    /// `size` members of `phase` on lock `name`, each writing the counter at `fence`.
    pub(crate) async fn start(
        urls: Urls,
        name: &str,
        fence: SocketAddr,
        size: usize,
        phase: Phase,
    ) -> Result<Self, BoxError> {
        let program = std::env::current_exe()?.with_file_name("fleet_member");
        if !program.exists() {
            return Err(format!(
                "{} is missing: build it with `cargo build --release -p examples --bin fleet_member`",
                program.display()
            )
            .into());
        }
        let dir = std::env::temp_dir().join(format!("distlock-migration-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        let mut fleet = Fleet {
            program,
            urls,
            name: name.to_owned(),
            fence,
            dir,
            spawned: 0,
            members: Vec::new(),
        };
        for _ in 0..size {
            let member = fleet.spawn(phase).await?;
            fleet.members.push(member);
        }
        Ok(fleet)
    }

    /// The phase of each member, in slot order.
    pub(crate) fn phases(&self) -> Vec<Phase> {
        self.members.iter().map(|m| m.phase).collect()
    }

    /// Stops the member in `slot` and starts it again in `phase` (a rolling restart with
    /// a new configuration); returns what the stopped process did.
    pub(crate) async fn restart(&mut self, slot: usize, phase: Phase) -> Result<Done, BoxError> {
        let done = stop(self.members.remove(slot)).await?;
        let next = self.spawn(phase).await?;
        self.members.insert(slot, next);
        Ok(done)
    }

    /// Stops every member; returns what each did, in slot order.
    pub(crate) async fn stop(mut self) -> Result<Vec<(Phase, Done)>, BoxError> {
        let mut done = Vec::new();
        for member in std::mem::take(&mut self.members) {
            let phase = member.phase;
            done.push((phase, stop(member).await?));
        }
        Ok(done)
    }

    async fn spawn(&mut self, phase: Phase) -> Result<Member, BoxError> {
        self.spawned += 1;
        let stop_file = self.dir.join(format!("stop-{}", self.spawned));
        let mut child = Command::new(&self.program)
            .args(["--url", &self.urls.of(phase), "--name", &self.name])
            .args(["--fence", &self.fence.to_string()])
            .args(["--cycles", &u64::MAX.to_string(), "--duration", RUN_LIMIT])
            .args(["--pause", PAUSE, "--stop-file"])
            .arg(&stop_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("member without stdout")?;
        let (ready_tx, ready) = oneshot::channel();
        let output = tokio::spawn(read_output(stdout, ready_tx));
        if timeout(WAIT_LIMIT, ready).await.is_err() {
            let _ = child.start_kill();
            return Err(format!("a member was not ready within {WAIT_LIMIT:?}").into());
        }
        Ok(Member {
            phase,
            child,
            stop_file,
            output,
        })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Members still running are killed by their handles (kill_on_drop).
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads a member's output to its end (so that it never blocks on a full pipe): says when
/// it is `READY`, and returns its `SUMMARY`.
async fn read_output(stdout: ChildStdout, ready: oneshot::Sender<()>) -> Option<Done> {
    let mut ready = Some(ready);
    let mut lines = BufReader::new(stdout).lines();
    let mut done = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if line == "READY" {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        } else if let Some(json) = line.strip_prefix("SUMMARY ") {
            done = serde_json::from_str(json).ok();
        }
    }
    done
}

/// Creates the member's stop file and waits for its summary and its exit; kills it (by
/// its pid, through its handle) if that takes longer than [`WAIT_LIMIT`].
async fn stop(mut member: Member) -> Result<Done, BoxError> {
    std::fs::write(&member.stop_file, b"")?;
    let ended = timeout(WAIT_LIMIT, async {
        let status = member.child.wait().await?;
        let done = (&mut member.output).await?;
        Ok::<_, BoxError>((status, done))
    })
    .await;
    let (status, done) = match ended {
        Ok(ended) => ended?,
        Err(_) => {
            member.child.kill().await?;
            return Err(format!("a member did not stop within {WAIT_LIMIT:?}").into());
        }
    };
    let done = done.ok_or("a member ended without its summary")?;
    if !status.success() || done.error.is_some() || done.tokens_backwards > 0 {
        return Err(format!("a member ended with {status}: {done:?}").into());
    }
    Ok(done)
}
