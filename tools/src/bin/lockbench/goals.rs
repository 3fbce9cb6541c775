//! The performance targets lockbench checks (contention against one client alone, the
//! hand-off and the uncontended cycle against the raw protocol, flat queue sweeps), each a
//! ratio computed within every run and then as the median of the runs, with a pass or
//! miss mark.

use crate::results::{fmt_ratio, GoalRow, Report, RunReport};
use crate::stats::median;
use crate::Flavour;

/// Which side of the bound passes.
#[derive(Debug, Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
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

/// `a` over `b`, both cycles/s on one name of the same run: (backend, clients) each.
fn rate_ratio(a: (&str, usize), b: (&str, usize)) -> PerRun {
    let (a_backend, b_backend) = (a.0.to_owned(), b.0.to_owned());
    Box::new(move |r, i| Some(rate(r, &a_backend, a.1, 1, i)? / rate(r, &b_backend, b.1, 1, i)?))
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
            uncontended_ratio(backend, runtime),
        )
    })
}

/// 64 clients on one name against one client alone on it.
fn contention_cost(backend: &str, min: f64) -> Goal {
    (
        format!("{backend} 64-on-1 ÷ {backend} alone (cycles/s)"),
        Bound::AtLeast(min),
        rate_ratio((backend, 64), (backend, 1)),
    )
}

/// A target: what, its bound, how it prints, and its figure in one run.
type Goal = (String, Bound, PerRun);

/// The longest queue of the sweep against a short one (8 contenders, or the shortest
/// above one), on every backend measured: a queue that grows must not slow the hand-off.
fn flat_sweeps(report: &Report) -> Vec<Goal> {
    let longest = report.sweep.iter().copied().max().unwrap_or(0);
    let short = if report.sweep.contains(&8) {
        8
    } else {
        report
            .sweep
            .iter()
            .copied()
            .filter(|&n| n > 1)
            .min()
            .unwrap_or(0)
    };
    if short == 0 || longest <= short {
        return Vec::new();
    }
    report
        .backends
        .iter()
        .map(|b| {
            (
                format!(
                    "{} queue of {longest} ÷ queue of {short} (cycles/s)",
                    b.backend
                ),
                Bound::AtLeast(0.8),
                rate_ratio((&b.backend, longest), (&b.backend, short)),
            )
        })
        .collect()
}

/// The targets, in the order the report lists them: ratios within each run, so that they
/// hold on any machine (absolute figures are in the report's tables).
fn goals(report: &Report) -> Vec<Goal> {
    use Bound::{AtLeast, AtMost};
    let goal = |what: &str, bound, per_run| (what.to_owned(), bound, per_run);
    let mut goals = vec![
        contention_cost("redis", 0.9),
        goal(
            "redis hand-off ÷ raw acquire + release (p50)",
            AtMost(1.0),
            handoff_ratio("redis"),
        ),
    ];
    goals.extend(overheads("redis", 1.10));
    goals.push(contention_cost("zookeeper", 0.8));
    goals.push(contention_cost("etcd", 0.8));
    goals.push(contention_cost("postgres", 0.8));
    goals.push(goal(
        "redis-cluster hand-off ÷ raw acquire + release (p50)",
        AtMost(1.5),
        handoff_ratio("redis-cluster"),
    ));
    goals.push(goal(
        "redlock-5 hand-off ÷ raw acquire + release (p50)",
        AtMost(2.0),
        handoff_ratio("redlock-5"),
    ));
    goals.extend(flat_sweeps(report));
    goals.extend(overheads("zookeeper", 1.20));
    goals.push(goal(
        "zookeeper hand-off ÷ raw acquire + release (p50)",
        AtMost(1.5),
        handoff_ratio("zookeeper"),
    ));
    goals.push(goal(
        "redis 64-on-1 ÷ zookeeper 64-on-1 (cycles/s)",
        AtLeast(3.0),
        rate_ratio(("redis", 64), ("zookeeper", 64)),
    ));
    goals.push(goal(
        "redlock-5 64-on-1 ÷ redlock-5 8-on-1 (cycles/s)",
        AtLeast(1.0),
        rate_ratio(("redlock-5", 64), ("redlock-5", 8)),
    ));
    goals
}

/// Every target, measured on `report`.
pub(crate) fn evaluate(report: &Report) -> Vec<GoalRow> {
    goals(report)
        .into_iter()
        .map(|(target, bound, per_run)| {
            let measured = median((0..report.runs).filter_map(|i| per_run(report, i)));
            let (goal, pass) = match bound {
                Bound::AtLeast(min) => {
                    (format!("≥ {}", fmt_ratio(min)), measured.map(|m| m >= min))
                }
                Bound::AtMost(max) => (format!("≤ {}", fmt_ratio(max)), measured.map(|m| m <= max)),
            };
            GoalRow {
                target,
                measured,
                shown: measured.map_or_else(|| "–".into(), fmt_ratio),
                goal,
                pass,
            }
        })
        .collect()
}
