//! The report's charts, as plain SVG: p50 latencies by backend (`latency.svg`, for
//! docs/benchmarks.md) and the queue-length sweep (cycles/s and p99 against contenders).

use std::fmt::Write as _;

use crate::results::{BackendReport, Report};
use crate::stats::{fmt_count, fmt_us};
use crate::Flavour;

/// Line colours, one per backend in report order.
const PALETTE: [&str; 6] = [
    "#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2",
];

/// A bar series: legend, colour, and the median p50 it plots (µs).
type Series = (
    &'static str,
    &'static str,
    fn(&BackendReport) -> Option<f64>,
);

/// A grouped horizontal bar chart of median p50 latencies (uncontended and its floor on the
/// multi-thread runtime, hand-off), on a log scale so memory and networked backends fit one
/// picture.
pub(crate) fn latency(report: &Report) -> String {
    const ROW: f64 = 18.0;
    const LEFT: f64 = 150.0;
    const WIDTH: f64 = 780.0;
    let series: [Series; 3] = [
        ("acquire+release p50", "#4C78A8", |b| {
            b.median_of(|r| Some(r.uncontended_on(Flavour::MultiThread)?.library?.p50_us))
        }),
        ("raw floor p50", "#9ECAE9", |b| {
            b.median_of(|r| Some(r.uncontended_on(Flavour::MultiThread)?.floor_cycle?.p50_us))
        }),
        ("hand-off p50", "#F58518", |b| {
            b.median_of(|r| Some(r.handoff?.p50_us))
        }),
    ];
    let values: Vec<f64> = report
        .backends
        .iter()
        .flat_map(|b| series.iter().filter_map(|(_, _, f)| f(b)))
        .collect();
    let max = values.iter().copied().fold(1.0_f64, f64::max);
    let min = values.iter().copied().fold(max, f64::min).max(0.1);
    let lo = min.log10().floor();
    let hi = max.log10().ceil().max(lo + 1.0);
    // Room on the right for the value printed after the longest bar.
    let scale = |v: f64| (v.max(0.1).log10() - lo) / (hi - lo) * (WIDTH - LEFT - 90.0);
    let group = ROW * series.len() as f64 + 14.0;
    let height = 60.0 + group * report.backends.len() as f64 + 30.0;
    let mut svg = open(WIDTH, height, "lockbench p50 latency, log scale", report);
    for (i, (label, color, _)) in series.iter().enumerate() {
        let x = 10.0 + i as f64 * 200.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="32" width="12" height="12" fill="{color}"/><text x="{}" y="42">{label}</text>"#,
            x + 16.0
        );
    }
    let mut decade = lo;
    while decade <= hi {
        let x = LEFT + scale(10f64.powf(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{x}" y1="52" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle" fill="#666">{}</text>"##,
            height - 25.0,
            height - 10.0,
            fmt_us(10f64.powf(decade))
        );
        decade += 1.0;
    }
    for (gi, b) in report.backends.iter().enumerate() {
        let top = 60.0 + gi as f64 * group;
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
            top + group / 2.0,
            xml_escape(&b.backend)
        );
        for (si, (_, color, pick)) in series.iter().enumerate() {
            let y = top + si as f64 * ROW;
            if let Some(p50) = pick(b) {
                let w = scale(p50).max(1.0);
                let _ = writeln!(
                    svg,
                    r#"<rect x="{LEFT}" y="{y}" width="{w:.1}" height="{}" fill="{color}"/><text x="{:.1}" y="{}">{}</text>"#,
                    ROW - 4.0,
                    LEFT + w + 4.0,
                    y + ROW - 7.0,
                    fmt_us(p50)
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// A line per backend through (contenders, value) points.
struct Line<'a> {
    label: &'a str,
    color: &'static str,
    points: Vec<(f64, f64)>,
}

/// Two panels side by side: median cycles/s and median cycle p99 against the number of
/// contenders on one name, both axes logarithmic, one line per backend.
pub(crate) fn sweep(report: &Report) -> String {
    const PANEL_W: f64 = 380.0;
    const PANEL_H: f64 = 260.0;
    const LEFT: f64 = 80.0;
    const TOP: f64 = 80.0;
    let width = 2.0 * (LEFT + PANEL_W) + 30.0;
    let height = TOP + PANEL_H + 70.0;
    let lines = |pick: fn(&BackendReport, usize) -> Option<f64>| -> Vec<Line<'_>> {
        report
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| Line {
                label: &b.backend,
                color: PALETTE[i % PALETTE.len()],
                points: report
                    .sweep
                    .iter()
                    .filter_map(|&n| Some((n as f64, pick(b, n)?)))
                    .collect(),
            })
            .collect()
    };
    let rates = lines(|b, n| b.median_of(|r| Some(r.contention(n, 1)?.run.cycles_per_sec)));
    let p99s = lines(|b, n| b.median_of(|r| Some(r.contention(n, 1)?.run.cycle?.p99_us)));
    let mut svg = open(
        width,
        height,
        "lockbench: N contenders on one lock name, log scales",
        report,
    );
    for (i, line) in rates.iter().enumerate() {
        let x = 10.0 + i as f64 * 130.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="34" width="12" height="12" fill="{}"/><text x="{}" y="44">{}</text>"#,
            line.color,
            x + 16.0,
            xml_escape(line.label)
        );
    }
    let xs: Vec<f64> = report.sweep.iter().map(|&n| n as f64).collect();
    let frame = |left: f64| Frame {
        left,
        top: TOP,
        width: PANEL_W,
        height: PANEL_H,
    };
    panel(&mut svg, frame(LEFT), "cycles/s", &xs, &rates, fmt_count);
    let _ = writeln!(
        svg,
        r##"<text x="10" y="{}" fill="#666">A backend with no completed cycle at some N has no point there (see report.md).</text>"##,
        height - 8.0
    );
    panel(
        &mut svg,
        frame(2.0 * LEFT + PANEL_W + 30.0),
        "cycle p99",
        &xs,
        &p99s,
        fmt_us,
    );
    svg.push_str("</svg>\n");
    svg
}

/// Where a panel's plot area sits.
struct Frame {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
}

fn panel(
    svg: &mut String,
    at: Frame,
    title: &str,
    xs: &[f64],
    lines: &[Line<'_>],
    fmt: fn(f64) -> String,
) {
    let Frame {
        left,
        top,
        width,
        height,
    } = at;
    let bottom = top + height;
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="{}" font-weight="bold">{title}</text>"#,
        top - 12.0
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>"##
    );
    let values: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| *v > 0.0)
        .collect();
    if values.is_empty() || xs.is_empty() {
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#666">no data</text>"##,
            left + width / 2.0,
            top + height / 2.0
        );
        return;
    }
    let (x_lo, x_hi) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min).log2(),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max).log2(),
    );
    let x_at = |x: f64| {
        if x_hi > x_lo {
            left + 20.0 + (x.log2() - x_lo) / (x_hi - x_lo) * (width - 40.0)
        } else {
            left + width / 2.0
        }
    };
    let y_lo = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor();
    let y_hi = values
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .log10()
        .ceil()
        .max(y_lo + 1.0);
    let y_at = |y: f64| bottom - (y.max(f64::MIN_POSITIVE).log10() - y_lo) / (y_hi - y_lo) * height;
    let mut decade = y_lo;
    while decade <= y_hi {
        let y = y_at(10f64.powf(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end" fill="#666">{}</text>"##,
            left + width,
            left - 6.0,
            y + 4.0,
            fmt(10f64.powf(decade))
        );
        decade += 1.0;
    }
    for &x in xs {
        let px = x_at(x);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{bottom}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle" fill="#666">{x}</text>"##,
            bottom + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#333">contenders (log scale)</text>"##,
        left + width / 2.0,
        bottom + 36.0
    );
    for line in lines {
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .filter(|p| p.1 > 0.0)
            .map(|&(x, y)| (x_at(x), y_at(y)))
            .collect();
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            path.join(" "),
            line.color
        );
        for (x, y) in points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
                line.color
            );
        }
    }
}

/// The opening of a chart: canvas, background, and `title` with the runs and the machine.
fn open(width: f64, height: f64, title: &str, report: &Report) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">{title}, medians of {} runs — {}</text>"#,
        report.runs,
        xml_escape(&report.machine)
    );
    svg
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
