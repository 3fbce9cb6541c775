//! The report's section on leader election: the uncontended campaign, the failover after
//! the leader is killed, how fast a new leader reaches every observer, and two leader
//! services taking turns, a row per backend ("no elections" where its clients grant no candidates).

use std::fmt::Write as _;

use crate::results::{cell, fmt_ratio, Report, RunReport};
use crate::stats::{fmt_count, median};
use crate::Flavour;

impl Report {
    /// The leader-election workloads, a row per backend ("no elections" where its clients
    /// grant no candidates).
    pub(crate) fn election_md(&self, md: &mut String) {
        let _ = writeln!(md, "\n## Leader election\n");
        let _ = writeln!(
            md,
            "### Uncontended campaign (one client campaigns and resigns on one election)\n\n\
             Each campaign is a try, as the lock cycle's acquire is. The lock cycle is the \
             uncontended acquire + release of the same run (multi-thread runtime).\n"
        );
        let _ = writeln!(
            md,
            "| backend | campaign p50 | campaign p99 | campaign + resign p50 | cycles/s (runs) | lock acquire + release p50 | campaign + resign ÷ lock cycle (runs) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.backends {
            if !b.elections {
                let _ = writeln!(md, "| {} | no elections | – | – | – | – | – |", b.backend);
                continue;
            }
            let campaign = b.summary_of(|r| r.campaign.as_ref()?.campaign);
            let cycle = b.summary_of(|r| r.campaign.as_ref()?.cycle);
            let lock = b.summary_of(|r| r.uncontended_on(Flavour::MultiThread)?.library);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                b.backend,
                cell(campaign, |s| s.p50_us),
                cell(campaign, |s| s.p99_us),
                cell(cycle, |s| s.p50_us),
                b.spread(|r| Some(r.campaign.as_ref()?.cycles_per_sec))
                    .show(fmt_count),
                cell(lock, |s| s.p50_us),
                b.spread(RunReport::campaign_ratio).show(fmt_ratio),
            );
        }
        let _ = writeln!(
            md,
            "\n### Failover after the leader is killed\n\n\
             The leader is a holder process killed with SIGKILL (in-process backends: its \
             client cut off from the space), a second candidate waiting; from the kill until \
             that candidate leads. Measured once.\n"
        );
        let _ = writeln!(
            md,
            "| backend | TTL | failover per round | median | max | median ÷ TTL |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for b in &self.backends {
            if !b.elections {
                let _ = writeln!(md, "| {} | no elections | – | – | – | – |", b.backend);
                continue;
            }
            let Some(t) = &b.failover else {
                let _ = writeln!(md, "| {} | – | not measured | – | – | – |", b.backend);
                continue;
            };
            let rounds: Vec<String> = t
                .takeover_ms
                .iter()
                .map(|ms| format!("{ms:.0} ms"))
                .collect();
            let mid = median(t.takeover_ms.iter().copied());
            let max = t.takeover_ms.iter().copied().reduce(f64::max);
            let ms = |v: Option<f64>| v.map_or_else(|| "–".into(), |v| format!("{v:.0} ms"));
            let _ = writeln!(
                md,
                "| {} | {:.0} ms | {} | {} | {} | {} |",
                b.backend,
                t.ttl_ms,
                rounds.join(", "),
                ms(mid),
                ms(max),
                mid.map_or_else(|| "–".into(), |m| fmt_ratio(m / t.ttl_ms)),
            );
        }
        let _ = writeln!(
            md,
            "\n### Observer notification: a new leader reaches every observer\n\n\
             Observers follow one election, each on a client of its own that re-reads only \
             every 60 s, so what they report came by push. A leader resigns once the other \
             candidate is queued; per hand-over, from the new leader's grant (its campaign \
             returned; 0 when every observer was faster) and from the resign sent, until \
             the last observer reported the new term. A hand-over some observer had not \
             reported within 2 s is a missed push.\n"
        );
        let _ = writeln!(
            md,
            "| backend | observers | hand-overs (runs) | grant → all observers p50 | p99 | max | resign → all observers p50 | p99 | missed pushes (all runs) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
        for b in &self.backends {
            if !b.elections {
                let _ = writeln!(
                    md,
                    "| {} | no elections | – | – | – | – | – | – | – |",
                    b.backend
                );
                continue;
            }
            let grant = b.summary_of(|r| r.notify.as_ref()?.from_grant);
            let resign = b.summary_of(|r| r.notify.as_ref()?.from_resign);
            let missed: u64 = b
                .runs
                .iter()
                .filter_map(|r| Some(r.notify.as_ref()?.missed))
                .sum();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {missed} |",
                b.backend,
                b.observers,
                b.spread(|r| Some(r.notify.as_ref()?.rounds as f64))
                    .show(fmt_count),
                cell(grant, |s| s.p50_us),
                cell(grant, |s| s.p99_us),
                cell(grant, |s| s.max_us),
                cell(resign, |s| s.p50_us),
                cell(resign, |s| s.p99_us),
            );
        }
        let _ = writeln!(
            md,
            "\n### Leader service turns (two `LeaderService`s hand leadership back and forth)\n\n\
             Each term's work lasts 25 ms, then the leader resigns and the other service, \
             queued behind it, leads; from the end of the leader's work (as the work notes it) \
             to the other's `Elected`: the resign, the hand-off and the events. \
             The lock hand-off is the same run's (a release to the queued waiter's grant).\n"
        );
        let _ = writeln!(
            md,
            "| backend | hand-overs (runs) | work ended → other elected p50 | p99 | turns/s (runs) | lock hand-off p50 | ÷ lock hand-off (runs) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for b in &self.backends {
            if !b.elections {
                let _ = writeln!(md, "| {} | no elections | – | – | – | – | – |", b.backend);
                continue;
            }
            let handover = b.summary_of(|r| r.service.as_ref()?.handover);
            let handoff = b.summary_of(|r| r.handoff);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                b.backend,
                b.spread(|r| Some(r.service.as_ref()?.turns as f64))
                    .show(fmt_count),
                cell(handover, |s| s.p50_us),
                cell(handover, |s| s.p99_us),
                b.spread(|r| Some(r.service.as_ref()?.turns_per_sec))
                    .show(fmt_count),
                cell(handoff, |s| s.p50_us),
                b.spread(RunReport::service_ratio).show(fmt_ratio),
            );
        }
    }
}
