//! The performance targets lockbench checks (Redis under contention, overhead to the floor,
//! ZooKeeper round trips), each computed within every run and then as the median of the
//! runs, with a pass or miss mark.

use serde::Serialize;

use crate::report::{fmt_ratio, Report, RunReport};
use crate::stats::{fmt_count, fmt_us, median};
use crate::Flavour;

/// One target as measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GoalRow {
    pub(crate) target: String,
    /// Median over the runs of the per-run figure.
    pub(crate) measured: Option<f64>,
    pub(crate) shown: String,
    pub(crate) goal: String,
    /// `None` when a backend or row it needs was not measured.
    pub(crate) pass: Option<bool>,
}

/// Which side of the bound passes.
#[derive(Debug, Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

/// How a figure is printed.
#[derive(Debug, Clone, Copy)]
enum Unit {
    PerSec,
    Micros,
    Ratio,
}

impl Unit {
    fn show(self, value: f64) -> String {
        match self {
            Unit::PerSec => format!("{} cycles/s", fmt_count(value)),
            Unit::Micros => fmt_us(value),
            Unit::Ratio => fmt_ratio(value),
        }
    }
}

/// A figure of run `i` of the whole report.
type PerRun = Box<dyn Fn(&Report, usize) -> Option<f64>>;

/// Run `i` of `backend`.
fn run<'a>(report: &'a Report, backend: &str, i: usize) -> Option<&'a RunReport> {
    report.backend(backend)?.runs.get(i)
}

/// Cycles/s of `clients` on `locks` names in run `i` of `backend`.
fn rate(report: &Report, backend: &str, clients: usize, locks: usize, i: usize) -> Option<f64> {
    Some(
        run(report, backend, i)?
            .contention(clients, locks)?
            .run
            .cycles_per_sec,
    )
}

fn rate_of(backend: &'static str, clients: usize, locks: usize) -> PerRun {
    Box::new(move |r, i| rate(r, backend, clients, locks, i))
}

/// `a` over `b`, both cycles/s of the same run.
fn rate_ratio(a: (&'static str, usize), b: (&'static str, usize)) -> PerRun {
    Box::new(move |r, i| Some(rate(r, a.0, a.1, 1, i)? / rate(r, b.0, b.1, 1, i)?))
}

fn uncontended_ratio(backend: &'static str, runtime: Flavour) -> PerRun {
    Box::new(move |r, i| run(r, backend, i)?.uncontended_ratio(runtime))
}

fn handoff_ratio(backend: &'static str) -> PerRun {
    Box::new(move |r, i| run(r, backend, i)?.handoff_ratio())
}

/// Uncontended library ÷ floor on each runtime flavour.
fn overheads(backend: &'static str, max: f64) -> impl Iterator<Item = Goal> {
    Flavour::ALL.into_iter().map(move |runtime| {
        (
            format!(
                "{backend} uncontended ÷ floor (p50), {} runtime",
                runtime.label()
            ),
            Bound::AtMost(max),
            Unit::Ratio,
            uncontended_ratio(backend, runtime),
        )
    })
}

/// A target: what, its bound, how it prints, and its figure in one run.
type Goal = (String, Bound, Unit, PerRun);

/// The targets, in the order the report lists them.
fn goals() -> Vec<Goal> {
    use Bound::{AtLeast, AtMost};
    use Unit::{Micros, PerSec, Ratio};
    let goal = |what: &str, bound, unit, per_run| (what.to_owned(), bound, unit, per_run);
    let mut goals = vec![
        goal(
            "redis, 64 clients on 1 name: cycles/s",
            AtLeast(5_000.0),
            PerSec,
            rate_of("redis", 64, 1),
        ),
        goal(
            "redis, 64 clients on 1 name: cycle p99",
            AtMost(20_000.0),
            Micros,
            Box::new(|r, i| Some(run(r, "redis", i)?.contention(64, 1)?.run.cycle?.p99_us)),
        ),
        goal(
            "redis 64-on-1 ÷ redis 8-on-1 (cycles/s)",
            AtLeast(0.8),
            Ratio,
            rate_ratio(("redis", 64), ("redis", 8)),
        ),
        goal(
            "redis 64-on-1 ÷ zookeeper 64-on-1 (cycles/s)",
            AtLeast(3.0),
            Ratio,
            rate_ratio(("redis", 64), ("zookeeper", 64)),
        ),
        goal(
            "redlock-5 64-on-1 ÷ redlock-5 8-on-1 (cycles/s)",
            AtLeast(1.0),
            Ratio,
            rate_ratio(("redlock-5", 64), ("redlock-5", 8)),
        ),
        goal(
            "redlock-5, 64 clients on 1 name: cycles/s",
            AtLeast(500.0),
            PerSec,
            rate_of("redlock-5", 64, 1),
        ),
        goal(
            "redlock-5 hand-off ÷ raw acquire + release (p50)",
            AtMost(1.5),
            Ratio,
            handoff_ratio("redlock-5"),
        ),
    ];
    goals.extend(overheads("redis", 1.10));
    goals.extend(overheads("zookeeper", 1.20));
    goals.push(goal(
        "zookeeper hand-off ÷ raw acquire + release (p50)",
        AtMost(1.5),
        Ratio,
        handoff_ratio("zookeeper"),
    ));
    goals.push(goal(
        "redis, 64 clients on 1,024 names: cycles/s",
        AtLeast(30_000.0),
        PerSec,
        rate_of("redis", 64, 1024),
    ));
    goals
}

/// Every target, measured on `report`.
pub(crate) fn evaluate(report: &Report) -> Vec<GoalRow> {
    goals()
        .into_iter()
        .map(|(target, bound, unit, per_run)| {
            let measured = median((0..report.runs).filter_map(|i| per_run(report, i)));
            let (goal, pass) = match bound {
                Bound::AtLeast(min) => {
                    (format!("≥ {}", unit.show(min)), measured.map(|m| m >= min))
                }
                Bound::AtMost(max) => (format!("≤ {}", unit.show(max)), measured.map(|m| m <= max)),
            };
            GoalRow {
                target,
                measured,
                shown: measured.map_or_else(|| "–".into(), |m| unit.show(m)),
                goal,
                pass,
            }
        })
        .collect()
}
