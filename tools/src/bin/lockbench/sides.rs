//! The dual (migration) lock against the two backends it spans: each figure of the `dual`
//! target divided, within each run, by the same figure of its old side (ZooKeeper) and of
//! its new side (Redis) alone, and by its own raw floor.

use std::fmt::Write as _;

use crate::report::{fmt_ratio, BackendReport, Report, RunReport, Spread};
use crate::stats::{fmt_count, fmt_us, median};
use crate::targets::DUAL_SIDES;
use crate::Flavour;

/// A figure of one run, and how it is printed.
struct Figure {
    what: &'static str,
    of: fn(&RunReport) -> Option<f64>,
    show: fn(f64) -> String,
    /// The same figure of the raw floor of that run, where there is one.
    floor: Option<fn(&RunReport) -> Option<f64>>,
}

const FIGURES: &[Figure] = &[
    Figure {
        what: "uncontended acquire + release p50, multi-thread runtime",
        of: |r| Some(r.uncontended_on(Flavour::MultiThread)?.library?.p50_us),
        show: fmt_us,
        floor: Some(|r| Some(r.uncontended_on(Flavour::MultiThread)?.floor_cycle?.p50_us)),
    },
    Figure {
        what: "uncontended acquire + release p50, current-thread runtime",
        of: |r| Some(r.uncontended_on(Flavour::CurrentThread)?.library?.p50_us),
        show: fmt_us,
        floor: Some(|r| {
            Some(
                r.uncontended_on(Flavour::CurrentThread)?
                    .floor_cycle?
                    .p50_us,
            )
        }),
    },
    Figure {
        what: "hand-off p50 (release sent → next waiter holds)",
        of: |r| Some(r.handoff?.p50_us),
        show: fmt_us,
        floor: Some(|r| {
            let u = r.uncontended_on(Flavour::MultiThread)?;
            Some(u.floor_acquire?.p50_us + u.floor_release?.p50_us)
        }),
    },
    Figure {
        what: "64 clients on 1 name: cycles/s",
        of: |r| Some(r.contention(64, 1)?.run.cycles_per_sec),
        show: |v| format!("{}/s", fmt_count(v)),
        floor: None,
    },
    Figure {
        what: "64 clients on 1 name: cycle p99",
        of: |r| Some(r.contention(64, 1)?.run.cycle?.p99_us),
        show: fmt_us,
        floor: None,
    },
];

/// `figure` of `a` over the same of `b`, run by run.
fn ratios(
    a: &BackendReport,
    b: &BackendReport,
    of: fn(&RunReport) -> Option<f64>,
    b_of: fn(&RunReport) -> Option<f64>,
) -> Spread {
    Spread(
        a.runs
            .iter()
            .zip(&b.runs)
            .filter_map(|(a, b)| Some(of(a)? / b_of(b)?))
            .collect(),
    )
}

impl Report {
    /// The section on the dual lock, when it and both of its sides were measured.
    pub(crate) fn dual_md(&self, md: &mut String) {
        let [old_label, new_label] = DUAL_SIDES;
        let (Some(dual), Some(old), Some(new)) = (
            self.backend("dual"),
            self.backend(old_label),
            self.backend(new_label),
        ) else {
            return;
        };
        let _ = writeln!(
            md,
            "\n## The dual (migration) lock against its sides\n\n\
             `dual` is `dual:zk://…|redis://…` on servers of its own: a {old_label} lock, \
             then a {new_label} lock with a fencing floor. Ratios are taken within each run \
             (the three targets are measured in the same pass), then their median (min–max \
             of the runs). The floor is the raw {old_label} acquire, then the raw \
             {new_label} acquire, released in parallel.\n"
        );
        let _ = writeln!(
            md,
            "| figure | dual | {old_label} | {new_label} | dual ÷ {old_label} | dual ÷ {new_label} | dual ÷ its floor |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for figure in FIGURES {
            let value = |b: &BackendReport| {
                median(b.runs.iter().filter_map(figure.of)).map_or_else(|| "–".into(), figure.show)
            };
            let floor = figure.floor.map_or_else(
                || "–".into(),
                |floor| ratios(dual, dual, figure.of, floor).show(fmt_ratio),
            );
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {floor} |",
                figure.what,
                value(dual),
                value(old),
                value(new),
                ratios(dual, old, figure.of, figure.of).show(fmt_ratio),
                ratios(dual, new, figure.of, figure.of).show(fmt_ratio),
            );
        }
    }
}
