//! The report's section on semaphores, read-write locks and multi-locks: a row per
//! backend ("not offered" where its clients grant no semaphores, several permits in one
//! hold or read-write locks), each figure the median over the runs, each ratio computed
//! within a run against the mutex (or the single-permit semaphore) of that run.
//! Information, not targets: none of it is in the Targets table.

use std::fmt::Write as _;

use crate::contention::LoopRun;
use crate::gauge::SEMAPHORE_CLIENTS;
use crate::primitives::{
    rw_clients, MultiContendedRun, MultiRun, Primitive, RwLockRun, SemaphoreRun, MANY_PERMITS,
    MOST_AT_ONCE, MULTI_CLIENTS, MULTI_NAMES, MULTI_PARTS, PERMITS, WRITE_SHARE,
};
use crate::results::{cell, fmt_ratio, Report, RunReport};
use crate::semaphore_many::SemaphoreManyRun;
use crate::stats::{fmt_count, Summary};

/// The cells of a row with nothing measured: the first says why, the rest are blank.
fn blank_row(md: &mut String, backend: &str, why: &str, columns: usize) {
    let rest = " – |".repeat(columns.saturating_sub(2));
    let _ = writeln!(md, "| {backend} | {why} |{rest}");
}

/// Cycles/s of a contended row of run `r` against the mutex row of as many clients on
/// one name of the same run.
fn to_mutex(r: &RunReport, row: &LoopRun) -> Option<f64> {
    Some(row.cycles_per_sec / r.contention(row.clients, 1)?.run.cycles_per_sec)
}

/// p50 and p99 cells of a summary.
fn p50_p99(summary: Option<Summary>) -> String {
    format!(
        "{} | {}",
        cell(summary, |s| s.p50_us),
        cell(summary, |s| s.p99_us)
    )
}

fn semaphore_of(r: &RunReport) -> Option<&SemaphoreRun> {
    r.primitives.semaphore.as_ref()
}

fn semaphore_many_of(r: &RunReport) -> Option<&SemaphoreManyRun> {
    r.primitives.semaphore_many.as_ref()
}

/// Cycles/s of the semaphore-many row of run `r` against the single-permit semaphore of
/// the same run.
fn to_semaphore(r: &RunReport, row: &SemaphoreManyRun) -> Option<f64> {
    Some(row.run.cycles_per_sec / semaphore_of(r)?.run.cycles_per_sec)
}

fn rwlock_of(r: &RunReport) -> Option<&RwLockRun> {
    r.primitives.rwlock.as_ref()
}

fn multi_of(r: &RunReport) -> Option<&MultiRun> {
    r.primitives.multi.as_ref()
}

fn contended_of(r: &RunReport) -> Option<&MultiContendedRun> {
    r.primitives.multi_contended.as_ref()
}

/// Appends the section to `md` (nothing when no primitive workload ran).
pub(crate) fn markdown(report: &Report, md: &mut String) {
    if report.primitives.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Semaphores, read-write locks and multi-locks\n");
    let _ = writeln!(
        md,
        "Each ratio is computed within a run against the mutex of the same run on the same \
         backend, then its median taken; these rows are information, not targets. Every \
         hold is short (one yield to the scheduler), and the clients count inside their \
         holds who holds what: a workload that saw more holders than allowed fails.\n"
    );
    let mut failures = Vec::new();
    if report.primitives.contains(&Primitive::Semaphore) {
        semaphore_md(report, md, &mut failures);
    }
    if report.primitives.contains(&Primitive::SemaphoreMany) {
        semaphore_many_md(report, md, &mut failures);
    }
    if report.primitives.contains(&Primitive::Rwlock) {
        rwlock_md(report, md, &mut failures);
    }
    if report.primitives.contains(&Primitive::Multi) {
        multi_md(report, md, &mut failures);
    }
    if !failures.is_empty() {
        let _ = writeln!(
            md,
            "\nErrors in these workloads (counted; the workload carried on):\n"
        );
        for line in failures {
            let _ = writeln!(md, "{line}");
        }
    }
}

/// Adds a line to `failures` for a row that saw errors.
fn note_errors(failures: &mut Vec<String>, what: &str, (count, first): (u64, Option<&str>)) {
    if count > 0 {
        failures.push(format!(
            "- {what}: {count} errors over the runs; first: {}",
            first.unwrap_or("?")
        ));
    }
}

fn semaphore_md(report: &Report, md: &mut String, failures: &mut Vec<String>) {
    let _ = writeln!(
        md,
        "### Semaphore: {PERMITS} permits, {SEMAPHORE_CLIENTS} contenders\n\n\
         {SEMAPHORE_CLIENTS} clients (a connection each) take a permit and give it back in \
         a loop. The mutex row is {SEMAPHORE_CLIENTS} clients on one lock name of the same \
         run. Holds are one yield long, so fewer permits in use at once than there are \
         says that grants arrived one at a time, not that permits stood idle.\n"
    );
    let _ = writeln!(
        md,
        "| backend | cycles/s (runs) | acquire p50 | acquire p99 | cycle p50 | cycle p99 | ÷ mutex {SEMAPHORE_CLIENTS}-on-1 cycles/s (runs) | most permits in use | errors (all runs) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for b in &report.backends {
        if !b.semaphores {
            blank_row(md, &b.backend, "not offered", 9);
            continue;
        }
        let row = semaphore_of;
        let most = b.runs.iter().filter_map(|r| Some(row(r)?.max_in_use)).max();
        let errs = b.loop_errors(|r| Some(&semaphore_of(r)?.run));
        note_errors(failures, &format!("{}, semaphore", b.backend), errs);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {}/{PERMITS} | {} |",
            b.backend,
            b.spread(|r| Some(row(r)?.run.cycles_per_sec))
                .show(fmt_count),
            p50_p99(b.summary_of(|r| row(r)?.acquire)),
            p50_p99(b.summary_of(|r| row(r)?.run.cycle)),
            b.spread(|r| to_mutex(r, &row(r)?.run)).show(fmt_ratio),
            most.map_or_else(|| "–".into(), |m| m.to_string()),
            errs.0,
        );
    }
}

fn semaphore_many_md(report: &Report, md: &mut String, failures: &mut Vec<String>) {
    let _ = writeln!(
        md,
        "\n### Semaphore, several permits a hold: {MANY_PERMITS} permits, \
         {SEMAPHORE_CLIENTS} contenders\n\n\
         {SEMAPHORE_CLIENTS} clients (a connection each) on one semaphore of {MANY_PERMITS} \
         permits; each iteration takes k permits in one hold (`acquire_many`), k from 1 to \
         {MOST_AT_ONCE} chosen by a seeded generator (`--seed`), and gives them back. \
         Requests keep their place in the queue: a big one at the head holds back the \
         smaller ones behind it even where they would fit, so the acquire columns of k = 1 \
         and k = {MOST_AT_ONCE} show whether big requests starve or hold back small ones. \
         The ratio is to the single-permit semaphore above, of the same run.\n"
    );
    let _ = writeln!(
        md,
        "| backend | cycles/s (runs) | permits/s (runs) | acquire p50 | acquire p99 | k=1 acquire p50 | k=1 acquire p99 | k={MOST_AT_ONCE} acquire p50 | k={MOST_AT_ONCE} acquire p99 | ÷ semaphore cycles/s (runs) | most permits in use | errors (all runs) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in &report.backends {
        if !b.semaphores_many {
            blank_row(md, &b.backend, "not offered", 12);
            continue;
        }
        let row = semaphore_many_of;
        let most = b.runs.iter().filter_map(|r| Some(row(r)?.max_in_use)).max();
        let errs = b.loop_errors(|r| Some(&semaphore_many_of(r)?.run));
        note_errors(
            failures,
            &format!("{}, semaphore of several permits a hold", b.backend),
            errs,
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {}/{MANY_PERMITS} | {} |",
            b.backend,
            b.spread(|r| Some(row(r)?.run.cycles_per_sec))
                .show(fmt_count),
            b.spread(|r| Some(row(r)?.permits_per_sec)).show(fmt_count),
            p50_p99(b.summary_of(|r| row(r)?.acquire)),
            p50_p99(b.summary_of(|r| row(r)?.acquire_of(1))),
            p50_p99(b.summary_of(|r| row(r)?.acquire_of(MOST_AT_ONCE))),
            b.spread(|r| to_semaphore(r, row(r)?)).show(fmt_ratio),
            most.map_or_else(|| "–".into(), |m| m.to_string()),
            errs.0,
        );
    }
}

fn rwlock_md(report: &Report, md: &mut String, failures: &mut Vec<String>) {
    let clients = rw_clients(&report.throughput_clients);
    let _ = writeln!(
        md,
        "\n### Read-write lock: {clients} clients, {:.0}% writes\n\n\
         {clients} clients (a connection each) on one read-write lock, as many as the \
         largest throughput row; each iteration reads or writes, chosen by a seeded \
         generator. The mutex row is {clients} clients on one lock name of the same run.\n",
        WRITE_SHARE * 100.0
    );
    let _ = writeln!(
        md,
        "| backend | cycles/s (runs) | reads / writes | read acquire p50 | read acquire p99 | write acquire p50 | write acquire p99 | ÷ mutex {clients}-on-1 cycles/s (runs) | most readers at once | errors (all runs) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for b in &report.backends {
        if !b.rwlocks {
            blank_row(md, &b.backend, "not offered", 10);
            continue;
        }
        let row = rwlock_of;
        let read = b.summary_of(|r| row(r)?.read_acquire);
        let write = b.summary_of(|r| row(r)?.write_acquire);
        let most = b
            .runs
            .iter()
            .filter_map(|r| Some(row(r)?.max_readers))
            .max();
        let errs = b.loop_errors(|r| Some(&rwlock_of(r)?.run));
        note_errors(failures, &format!("{}, read-write lock", b.backend), errs);
        let _ = writeln!(
            md,
            "| {} | {} | {} / {} | {} | {} | {} | {} | {} |",
            b.backend,
            b.spread(|r| Some(row(r)?.run.cycles_per_sec))
                .show(fmt_count),
            read.map_or_else(|| "0".into(), |s| fmt_count(s.count as f64)),
            write.map_or_else(|| "0".into(), |s| fmt_count(s.count as f64)),
            p50_p99(read),
            p50_p99(write),
            b.spread(|r| to_mutex(r, &row(r)?.run)).show(fmt_ratio),
            most.map_or_else(|| "–".into(), |m| m.to_string()),
            errs.0,
        );
    }
}

fn multi_md(report: &Report, md: &mut String, failures: &mut Vec<String>) {
    let _ = writeln!(
        md,
        "\n### Multi-lock of {MULTI_PARTS} names\n\n\
         Uncontended: one client takes {MULTI_PARTS} free names together (a try) and \
         releases them, taking turns with {MULTI_PARTS} sequential lock cycles (try + \
         release) of the same names. Contended: {MULTI_CLIENTS} clients (a connection \
         each), each iteration a multi-lock of {MULTI_PARTS} names drawn at random among \
         {MULTI_NAMES}; the names are taken in one order, so overlapping sets never wait \
         for each other in a cycle, and every wait is bounded.\n"
    );
    let _ = writeln!(
        md,
        "| backend | multi-lock cycle p50 | p99 | {MULTI_PARTS} sequential lock cycles p50 | multi ÷ sequential (runs) | contended cycles/s (runs) | contended acquire p50 | contended acquire p99 | contended cycle p99 | errors (all runs) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for b in &report.backends {
        let together = b.summary_of(|r| multi_of(r)?.multi_cycle);
        let sequential = b.summary_of(|r| multi_of(r)?.sequential_cycle);
        let contended = contended_of;
        if together.is_none() && b.runs.iter().all(|r| contended(r).is_none()) {
            blank_row(md, &b.backend, "not measured", 10);
            continue;
        }
        let errs = b.loop_errors(|r| Some(&contended_of(r)?.run));
        note_errors(
            failures,
            &format!("{}, contended multi-lock", b.backend),
            errs,
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            b.backend,
            p50_p99(together),
            cell(sequential, |s| s.p50_us),
            b.spread(|r| multi_of(r)?.ratio()).show(fmt_ratio),
            b.spread(|r| Some(contended(r)?.run.cycles_per_sec))
                .show(fmt_count),
            p50_p99(b.summary_of(|r| contended(r)?.acquire)),
            cell(b.summary_of(|r| contended(r)?.run.cycle), |s| s.p99_us),
            errs.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::contention::LoopRun;
    use crate::primitives::{Primitive, SemaphoreRun};
    use crate::results::{BackendReport, Report, RunReport};
    use crate::semaphore_many::SemaphoreManyRun;

    /// A report of one run with nothing but `primitives` and `backends`.
    fn report(primitives: Vec<Primitive>, backends: Vec<BackendReport>) -> Report {
        Report {
            machine: String::new(),
            started: String::new(),
            runs: 1,
            warmup_s: 0.0,
            duration_s: 1.0,
            elapsed_s: 1.0,
            throughput_clients: vec![64],
            throughput_locks: vec![1],
            sweep: Vec::new(),
            primitives,
            backends,
            skipped: Vec::new(),
            goals: Vec::new(),
        }
    }

    /// A backend without semaphores (of one permit a hold or several) or read-write locks
    /// gets a "not offered" row in those tables, and one that measured no multi-lock a
    /// "not measured" row, each with as many cells as its table has columns.
    #[test]
    fn backends_without_the_primitive_say_not_offered() {
        let plain = BackendReport {
            backend: "plain".into(),
            ..BackendReport::default()
        };
        let all = vec![
            Primitive::Semaphore,
            Primitive::SemaphoreMany,
            Primitive::Rwlock,
            Primitive::Multi,
        ];
        let mut md = String::new();
        super::markdown(&report(all, vec![plain]), &mut md);
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| plain |")).collect();
        assert_eq!(rows.len(), 4, "{md}");
        assert!(rows[0].contains("not offered"), "{md}");
        assert!(rows[1].contains("not offered"), "{md}");
        assert!(rows[2].contains("not offered"), "{md}");
        assert!(rows[3].contains("not measured"), "{md}");
        for row in rows {
            assert_cells_match_header(&md, row);
        }
    }

    /// `row` has as many cells as the header above it.
    fn assert_cells_match_header(md: &str, row: &str) {
        let header = md
            .lines()
            .take_while(|l| *l != row)
            .filter(|l| l.starts_with("| backend |"))
            .last()
            .expect("a header above the row");
        assert_eq!(
            row.matches('|').count(),
            header.matches('|').count(),
            "{row}"
        );
    }

    /// A row of 64 clients that counted `cycles` in one second.
    fn loop_run(cycles: u64) -> LoopRun {
        LoopRun {
            clients: 64,
            connected: 64,
            cycles,
            cycles_per_sec: cycles as f64,
            cycle: None,
            errors: 0,
            first_error: None,
        }
    }

    /// The semaphore-many row shows its permits/s, the most permits in use and its
    /// cycles/s against the single-permit semaphore of the same run.
    #[test]
    fn semaphore_many_row_against_the_semaphore() {
        let mut run = RunReport::default();
        run.primitives.semaphore = Some(SemaphoreRun {
            permits: 4,
            run: loop_run(1000),
            acquire: None,
            max_in_use: 4,
        });
        run.primitives.semaphore_many = Some(SemaphoreManyRun {
            permits: 8,
            most_at_once: 4,
            seed: 26,
            run: loop_run(500),
            permits_per_sec: 1250.0,
            acquire: None,
            acquire_by_count: vec![None; 4],
            max_in_use: 7,
        });
        let many = BackendReport {
            backend: "many".into(),
            semaphores: true,
            semaphores_many: true,
            runs: vec![run],
            ..BackendReport::default()
        };
        let asked = vec![Primitive::Semaphore, Primitive::SemaphoreMany];
        let mut md = String::new();
        super::markdown(&report(asked, vec![many]), &mut md);
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| many |")).collect();
        assert_eq!(rows.len(), 2, "{md}");
        let row = rows[1];
        assert!(row.contains("| 1,250 |"), "{row}");
        assert!(row.contains("| 0.50x |"), "{row}");
        assert!(row.contains("| 7/8 |"), "{row}");
        assert_cells_match_header(&md, row);
    }

    /// No primitive workload asked for: no section.
    #[test]
    fn no_section_without_primitive_workloads() {
        let mut md = String::new();
        super::markdown(&report(Vec::new(), Vec::new()), &mut md);
        assert!(md.is_empty(), "{md}");
    }
}
