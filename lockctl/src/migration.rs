//! `lockctl migration check`: whether a step of a migration between backends is safe
//! now, from the library's advance check.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use distlock::migration::{CheckOptions, Step};
use distlock::LockName;

use crate::{parse_duration, BoxError, EXIT_NO};

/// `lockctl migration …`.
#[derive(Debug, Subcommand)]
pub(crate) enum Migration {
    /// Watch NAMES for a while and say whether STEP is safe: exit 0 when clear, 3 when
    /// not (an old-only or new-only client was seen, fencing tokens could go back, or a
    /// look failed), 1 on errors.
    ///
    /// dual-to-new watches the old side for holders and waiters without the dual mark;
    /// dual-to-old watches the new side for them and compares the token spaces;
    /// old-to-dual compares the token spaces; new-to-dual is always safe.
    Check {
        /// The step: old-to-dual, dual-to-new, new-to-dual or dual-to-old.
        #[arg(long, value_parser = parse_step)]
        step: Step,
        /// How long to watch: longer than the longest gap between two acquisitions of
        /// any client that may still run.
        #[arg(long, value_parser = parse_duration, default_value = "60s")]
        watch: Duration,
        /// Pause between two looks at every name.
        #[arg(long, value_parser = parse_duration, default_value = "100ms")]
        interval: Duration,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Lock names to watch.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn parse_step(text: &str) -> Result<Step, String> {
    text.parse().map_err(|err: distlock::Error| err.to_string())
}

/// Runs `command` against the dual lock `url`.
pub(crate) async fn run(url: &str, command: Migration) -> Result<ExitCode, BoxError> {
    let Migration::Check {
        step,
        watch,
        interval,
        json,
        names,
    } = command;
    let names = names
        .into_iter()
        .map(LockName::new)
        .collect::<Result<Vec<_>, _>>()?;
    let options = CheckOptions { watch, interval };
    let report = distlock::raw::driver::registry()
        .migration_check(url, step, &names, &options)
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(if report.is_clear() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NO)
    })
}
