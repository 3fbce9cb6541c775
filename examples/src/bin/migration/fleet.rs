//! The fleet: worker processes (this program, `migration worker …`) started with the URL
//! of their phase, and stopped gracefully (their standard input is closed, they finish
//! the cycle in hand, release and exit). Every child is killed by its pid if it does not
//! stop in time.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::timeout;

use crate::worker::{DONE, READY};
use crate::BoxError;

/// Bound on a worker's start (connect) and on its stop (last cycle, release, exit).
const WAIT_LIMIT: Duration = Duration::from_secs(30);

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
            Phase::Dual => format!("dual:{}|{}", self.old, self.new),
            Phase::New => self.new.clone(),
        }
    }
}

/// What a worker process did, from its last line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub(crate) sections: u64,
    pub(crate) stale: u64,
    pub(crate) first_token: u64,
    pub(crate) last_token: u64,
}

/// One running worker process.
#[derive(Debug)]
struct Member {
    phase: Phase,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

/// The worker processes, one per slot.
#[derive(Debug)]
pub(crate) struct Fleet {
    urls: Urls,
    name: String,
    fence: SocketAddr,
    members: Vec<Member>,
}

impl Fleet {
    /// `size` workers of `phase` on lock `name`, each writing the counter at `fence`.
    pub(crate) async fn start(
        urls: Urls,
        name: &str,
        fence: SocketAddr,
        size: usize,
        phase: Phase,
    ) -> Result<Self, BoxError> {
        let mut fleet = Fleet {
            urls,
            name: name.to_owned(),
            fence,
            members: Vec::new(),
        };
        for _ in 0..size {
            let member = fleet.spawn(phase).await?;
            fleet.members.push(member);
        }
        Ok(fleet)
    }

    /// The phase of each worker, in slot order.
    pub(crate) fn phases(&self) -> Vec<Phase> {
        self.members.iter().map(|m| m.phase).collect()
    }

    /// Stops worker `slot` and starts it again in `phase` (a rolling restart with a new
    /// configuration); returns what the stopped process did.
    pub(crate) async fn restart(&mut self, slot: usize, phase: Phase) -> Result<Done, BoxError> {
        let done = stop(self.members.remove(slot)).await?;
        let next = self.spawn(phase).await?;
        self.members.insert(slot, next);
        Ok(done)
    }

    /// Stops every worker; returns what each did, in slot order.
    pub(crate) async fn stop(self) -> Result<Vec<(Phase, Done)>, BoxError> {
        let mut done = Vec::new();
        for member in self.members {
            let phase = member.phase;
            done.push((phase, stop(member).await?));
        }
        Ok(done)
    }

    async fn spawn(&self, phase: Phase) -> Result<Member, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "worker",
                "--url",
                &self.urls.of(phase),
                "--name",
                &self.name,
            ])
            .args(["--fence", &self.fence.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("worker without stdout")?;
        let mut stdout = BufReader::new(stdout).lines();
        let line = timeout(WAIT_LIMIT, stdout.next_line()).await??;
        if line.as_deref() != Some(READY) {
            return Err(format!("worker said {line:?} instead of {READY}").into());
        }
        Ok(Member {
            phase,
            child,
            stdin,
            stdout,
        })
    }
}

/// Closes the worker's standard input and waits for its summary and its exit; kills it
/// (by its pid, through its handle) if either takes longer than [`WAIT_LIMIT`].
async fn stop(mut member: Member) -> Result<Done, BoxError> {
    drop(member.stdin.take());
    let ended = timeout(WAIT_LIMIT, async {
        let mut done = None;
        while let Some(line) = member.stdout.next_line().await? {
            done = done.or_else(|| parse_done(&line));
        }
        let status = member.child.wait().await?;
        Ok::<_, BoxError>((done, status))
    })
    .await;
    let (done, status) = match ended {
        Ok(ended) => ended?,
        Err(_) => {
            member.child.kill().await?;
            return Err(format!("a worker did not stop within {WAIT_LIMIT:?}").into());
        }
    };
    if !status.success() {
        return Err(format!("a worker ended with {status}").into());
    }
    done.ok_or_else(|| "a worker ended without its summary".into())
}

fn parse_done(line: &str) -> Option<Done> {
    let mut words = line.strip_prefix(DONE)?.split_whitespace();
    let mut next = || words.next()?.parse::<u64>().ok();
    Some(Done {
        sections: next()?,
        stale: next()?,
        first_token: next()?,
        last_token: next()?,
    })
}
