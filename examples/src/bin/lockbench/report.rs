//! The report: Markdown for people, JSON for tools, SVG for the README.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::stats::{fmt_us, Summary};
use crate::workloads::{RenewalRow, Takeover, ThroughputRow};

/// Everything measured for one backend.
#[derive(Debug, Default, Serialize)]
pub(crate) struct BackendReport {
    pub(crate) backend: String,
    pub(crate) floor: Option<String>,
    pub(crate) uncontended: Option<Summary>,
    pub(crate) floor_cycle: Option<Summary>,
    pub(crate) floor_acquire: Option<Summary>,
    pub(crate) floor_release: Option<Summary>,
    pub(crate) handoff_waiters: usize,
    pub(crate) handoff: Option<Summary>,
    pub(crate) throughput: Vec<ThroughputRow>,
    pub(crate) takeover: Option<Takeover>,
    pub(crate) renewal: Vec<RenewalRow>,
    pub(crate) notes: Vec<String>,
}

impl BackendReport {
    /// Uncontended p50 against the floor's p50.
    pub(crate) fn uncontended_ratio(&self) -> Option<f64> {
        Some(self.uncontended?.p50_us / self.floor_cycle?.p50_us)
    }

    /// Hand-off p50 against raw release p50 + raw acquire p50.
    pub(crate) fn handoff_ratio(&self) -> Option<f64> {
        Some(self.handoff?.p50_us / (self.floor_acquire?.p50_us + self.floor_release?.p50_us))
    }
}

/// The whole run.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) machine: String,
    pub(crate) started: String,
    pub(crate) warmup_s: f64,
    pub(crate) duration_s: f64,
    pub(crate) backends: Vec<BackendReport>,
    pub(crate) skipped: Vec<(String, String)>,
}

fn cell(summary: Option<Summary>, pick: fn(&Summary) -> f64) -> String {
    summary.map_or_else(|| "–".to_owned(), |s| fmt_us(pick(&s)))
}

fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}x"))
}

impl Report {
    pub(crate) fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# lockbench report\n");
        let _ = writeln!(
            md,
            "Machine: {}. Started {}. Warm-up {:.1} s, then {:.1} s per measurement. \
             Latencies are client-observed on loopback (p50 / p99 / p99.9 / max).\n",
            self.machine, self.started, self.warmup_s, self.duration_s
        );
        for (backend, why) in &self.skipped {
            let _ = writeln!(md, "- **{backend} skipped**: {why}");
        }
        if !self.skipped.is_empty() {
            md.push('\n');
        }
        let _ = writeln!(md, "## Uncontended acquire + release (one client)\n");
        let _ = writeln!(
            md,
            "| backend | p50 | p99 | p99.9 | max | raw floor p50 | ratio (target ≤ 1.15x) | floor |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for b in &self.backends {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                b.backend,
                cell(b.uncontended, |s| s.p50_us),
                cell(b.uncontended, |s| s.p99_us),
                cell(b.uncontended, |s| s.p999_us),
                cell(b.uncontended, |s| s.max_us),
                cell(b.floor_cycle, |s| s.p50_us),
                ratio(b.uncontended_ratio()),
                b.floor.as_deref().unwrap_or("none (baseline)"),
            );
        }
        let _ = writeln!(
            md,
            "\n## Hand-off: release sent → next waiter holds the lock\n"
        );
        let _ = writeln!(
            md,
            "| backend | waiters | p50 | p99 | p99.9 | max | raw acquire + release p50 | ratio (target ≤ 1.5x) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for b in &self.backends {
            let floor = b
                .floor_acquire
                .zip(b.floor_release)
                .map(|(a, r)| fmt_us(a.p50_us + r.p50_us))
                .unwrap_or_else(|| "–".into());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                b.backend,
                b.handoff_waiters,
                cell(b.handoff, |s| s.p50_us),
                cell(b.handoff, |s| s.p99_us),
                cell(b.handoff, |s| s.p999_us),
                cell(b.handoff, |s| s.max_us),
                floor,
                ratio(b.handoff_ratio()),
            );
        }
        let _ = writeln!(md, "\n## Throughput: C clients over L lock names\n");
        let _ = writeln!(md, "| backend | C | L | cycles/s | cycle p50 | cycle p99 |");
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for b in &self.backends {
            for row in &b.throughput {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.0} | {} | {} |",
                    b.backend,
                    row.clients,
                    row.locks,
                    row.cycles_per_sec,
                    cell(row.cycle, |s| s.p50_us),
                    cell(row.cycle, |s| s.p99_us),
                );
            }
        }
        let _ = writeln!(
            md,
            "\n## Takeover after the holder process is killed (SIGKILL)\n"
        );
        let _ = writeln!(md, "| backend | TTL | takeover per round |");
        let _ = writeln!(md, "|---|---|---|");
        for b in &self.backends {
            if let Some(t) = &b.takeover {
                let rounds: Vec<String> = t
                    .takeover_ms
                    .iter()
                    .map(|ms| format!("{ms:.0} ms"))
                    .collect();
                let _ = writeln!(
                    md,
                    "| {} | {:.0} ms | {} |",
                    b.backend,
                    t.ttl_ms,
                    rounds.join(", ")
                );
            }
        }
        let _ = writeln!(md, "\n## Renewal: one client holding K locks\n");
        let _ = writeln!(
            md,
            "| backend | K | TTL | server requests per renewal interval | renewal round trip p50 / max | client bytes per held lock | still held |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.backends {
            for row in &b.renewal {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.0} ms | {} | {} | {} | {}/{} |",
                    b.backend,
                    row.held_locks,
                    row.ttl_ms,
                    row.requests_per_interval
                        .map_or_else(|| "–".into(), |r| format!("{r:.1}")),
                    row.round_trip.map_or_else(
                        || "–".into(),
                        |s| format!("{} / {}", fmt_us(s.p50_us), fmt_us(s.max_us))
                    ),
                    row.bytes_per_lock
                        .map_or_else(|| "–".into(), |r| format!("{r:.0}")),
                    row.still_held,
                    row.held_locks
                );
            }
        }
        let notes: Vec<String> = self
            .backends
            .iter()
            .flat_map(|b| b.notes.iter().map(move |n| format!("- {}: {n}", b.backend)))
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(md, "\n## Notes\n");
            for note in notes {
                let _ = writeln!(md, "{note}");
            }
        }
        md
    }

    /// A grouped horizontal bar chart of p50 latencies (uncontended, its floor, hand-off),
    /// on a log scale so memory and networked backends fit one picture.
    pub(crate) fn svg(&self) -> String {
        const ROW: f64 = 18.0;
        const LEFT: f64 = 150.0;
        const WIDTH: f64 = 720.0;
        let series: [Series; 3] = [
            ("acquire+release p50", "#4C78A8", |b| b.uncontended),
            ("raw floor p50", "#9ECAE9", |b| b.floor_cycle),
            ("hand-off p50", "#F58518", |b| b.handoff),
        ];
        let values: Vec<f64> = self
            .backends
            .iter()
            .flat_map(|b| series.iter().filter_map(|(_, _, f)| f(b).map(|s| s.p50_us)))
            .collect();
        let max = values.iter().copied().fold(1.0_f64, f64::max);
        let min = values.iter().copied().fold(max, f64::min).max(0.1);
        let lo = min.log10().floor();
        let hi = max.log10().ceil().max(lo + 1.0);
        // Room on the right for the value printed after the longest bar.
        let scale = |v: f64| (v.max(0.1).log10() - lo) / (hi - lo) * (WIDTH - LEFT - 90.0);
        let group = ROW * series.len() as f64 + 14.0;
        let height = 60.0 + group * self.backends.len() as f64 + 30.0;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="10" y="20" font-size="14" font-weight="bold">lockbench: p50 latency by backend (log scale, µs) — {}</text>"#,
            xml_escape(&self.machine)
        );
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
        for (gi, b) in self.backends.iter().enumerate() {
            let top = 60.0 + gi as f64 * group;
            let _ = writeln!(
                svg,
                r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
                top + group / 2.0,
                xml_escape(&b.backend)
            );
            for (si, (_, color, pick)) in series.iter().enumerate() {
                let y = top + si as f64 * ROW;
                if let Some(s) = pick(b) {
                    let w = scale(s.p50_us).max(1.0);
                    let _ = writeln!(
                        svg,
                        r#"<rect x="{LEFT}" y="{y}" width="{w:.1}" height="{}" fill="{color}"/><text x="{:.1}" y="{}">{}</text>"#,
                        ROW - 4.0,
                        LEFT + w + 4.0,
                        y + ROW - 7.0,
                        fmt_us(s.p50_us)
                    );
                }
            }
        }
        svg.push_str("</svg>\n");
        svg
    }

    /// Writes `report.md`, `report.json` and `latency.svg` into `dir`.
    pub(crate) fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)?;
        std::fs::write(dir.join("latency.svg"), self.svg())?;
        Ok(())
    }
}

/// A chart series: legend, colour, and the summary it plots.
type Series = (
    &'static str,
    &'static str,
    fn(&BackendReport) -> Option<Summary>,
);

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
