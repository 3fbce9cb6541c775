//! Running an example binary to its end, as a user runs it.

use std::process::Output;
use std::time::Duration;

/// Bound on one example's run.
const EXAMPLE_WAIT: Duration = Duration::from_secs(60);

/// Runs the example at `binary` with `LOCK_URL=url` to its end (at most
/// [`EXAMPLE_WAIT`]) and returns its output; fails unless it exits 0.
pub(crate) async fn example(binary: &str, url: &str) -> Output {
    let mut command = tokio::process::Command::new(binary);
    command.env("LOCK_URL", url).kill_on_drop(true);
    let output = tokio::time::timeout(EXAMPLE_WAIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{binary} ends within {EXAMPLE_WAIT:?}"))
        .expect("the example runs");
    assert!(output.status.success(), "{binary}: {}", text(&output));
    output
}

pub(crate) use harness::output_text as text;

/// What `output` printed on stdout.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}
