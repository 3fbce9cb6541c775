//! Running lockctl as its own process, as an operator would.

use std::process::Output;
use std::time::Duration;

/// Bound on one lockctl run.
pub(crate) const LOCKCTL_WAIT: Duration = Duration::from_secs(60);

/// Runs `lockctl --url URL ARGS...` to its end (at most [`LOCKCTL_WAIT`]).
pub(crate) async fn lockctl(url: &str, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.arg("--url").arg(url).args(args).kill_on_drop(true);
    tokio::time::timeout(LOCKCTL_WAIT, command.output())
        .await
        .expect("lockctl ends in time")
        .expect("lockctl runs")
}

pub(crate) use harness::output_text as text;
