//! The advance check, as an operator runs it before each step: the library call behind
//! `lockctl migration check`, on the fleet's lock names.

use std::time::Duration;

use distlock::migration::{CheckOptions, CheckReport, Step};
use distlock::LockName;

use crate::fleet::{Phase, Urls};
use crate::BoxError;

/// How often the check looks at the names while it watches.
const INTERVAL: Duration = Duration::from_millis(20);

/// The step that moves a process from `from` to `to` (adjacent phases).
pub(crate) fn step(from: Phase, to: Phase) -> Step {
    match (from, to) {
        (Phase::Old, _) => Step::OldToDual,
        (Phase::New, _) => Step::NewToDual,
        (Phase::Dual, Phase::New) => Step::DualToNew,
        (Phase::Dual, _) => Step::DualToOld,
    }
}

/// Watches `name` for `watch` and reports whether `step` is safe.
pub(crate) async fn run(
    urls: &Urls,
    name: &str,
    step: Step,
    watch: Duration,
) -> Result<CheckReport, BoxError> {
    let options = CheckOptions {
        watch,
        interval: INTERVAL,
    };
    let names = [LockName::new(name)?];
    let report = distlock::raw::driver::registry()
        .migration_check(&urls.of(Phase::Dual), step, &names, &options)
        .await?;
    Ok(report)
}
