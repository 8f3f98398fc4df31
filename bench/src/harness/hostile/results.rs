//! The runs' medians per attack, as the Markdown table and the JSON of `hostile --json`.

use super::{Attack, Figures, Plan, Results, Run, median, mib, ms};

impl Results {
    /// Medians over the repeats of each attack's runs.
    pub(super) fn of(plan: &Plan, runs: &[(Attack, Run)]) -> Self {
        let of = |attack: Attack| -> Vec<&Run> {
            runs.iter()
                .filter(|(a, _)| *a == attack)
                .map(|(_, r)| r)
                .collect()
        };
        let med = |rs: &[&Run], f: &dyn Fn(&Run) -> f64| {
            median(rs.iter().map(|r| f(r)).collect()).unwrap_or(f64::NAN)
        };
        let baseline_p99 = med(&of(Attack::None), &|r| ms(&r.deliveries, 0.99));
        let attacks: Vec<Figures> = plan
            .attacks
            .iter()
            .copied()
            .map(|attack| {
                let rs = of(attack);
                let p99 = med(&rs, &|r| ms(&r.deliveries, 0.99));
                let opens = rs.iter().any(|r| !r.opens.is_empty());
                let open = |f: &dyn Fn(&Run) -> f64| opens.then(|| med(&rs, f));
                Figures {
                    attack,
                    p50_ms: med(&rs, &|r| ms(&r.deliveries, 0.5)),
                    p99_ms: p99,
                    p99_over_baseline: p99 / baseline_p99,
                    after_answer_p99_ms: med(&rs, &|r| ms(&r.after_answers, 0.99)),
                    lost: rs.iter().map(|r| r.lost).sum::<usize>(),
                    healthz_p99_ms: med(&rs, &|r| ms(&r.probes, 0.99)),
                    peak_rss_mib: med(&rs, &|r| mib(r.peak_rss)),
                    attempts: med(&rs, &|r| r.attempts as f64),
                    refused: med(&rs, &|r| r.refused as f64),
                    open_p50_ms: open(&|r| ms(&r.opens, 0.5)),
                    open_p99_ms: open(&|r| ms(&r.opens, 0.99)),
                    open_max_ms: opens
                        .then(|| rs.iter().map(|r| ms(&r.opens, 1.0)).fold(0.0, f64::max)),
                    renewals_missed: rs.iter().map(|r| r.renewals_missed).sum(),
                }
            })
            .collect();
        Self {
            repeats: plan.repeats,
            writes: plan.writes,
            attacks,
        }
    }

    /// The results as Markdown: a row per attack.
    pub(crate) fn table(&self) -> String {
        use std::fmt::Write as _;

        let mut out = String::new();
        let _ = writeln!(
            out,
            "| attack (median of {} runs, {} writes each) | bound that holds it | write to reconcile p50 (ms) | p99 (ms) | p99 / baseline | from the write's answer p99 (ms) | lost | `/healthz` p99 (ms) | dispatcher peak RSS (MiB) | attack calls or connections | refused or closed |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            self.repeats, self.writes
        );
        for f in &self.attacks {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.2} | {:.2}x | {:.2} | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
                f.attack.name(),
                f.attack.bound(),
                f.p50_ms,
                f.p99_ms,
                f.p99_over_baseline,
                f.after_answer_p99_ms,
                f.lost,
                f.healthz_p99_ms,
                f.peak_rss_mib,
                f.attempts,
                f.refused,
            );
        }
        for f in &self.attacks {
            if let (Some(p50), Some(p99), Some(max)) = (f.open_p50_ms, f.open_p99_ms, f.open_max_ms)
            {
                let _ = if f.attack == Attack::HandshakeFlood {
                    writeln!(
                        out,
                        "\nUnder the {}: a new replica, on a connection of its own, had its TLS handshake, its session and its first poll answered {p50:.1} ms at p50 and {p99:.1} ms at p99 after it began (medians of the runs), {max:.0} ms at the slowest of every run; {:.0} new replicas a run, {:.0} not done within 1 s.",
                        f.attack.name(),
                        f.attempts,
                        f.refused,
                    )
                } else {
                    writeln!(
                        out,
                        "\nUnder the {}: a replica had its session {p50:.1} ms at p50 and {p99:.1} ms at p99 after it began to reconnect (medians of the runs; retries included), {max:.0} ms at the slowest of every run; {:.0} reconnects a run, {:.0} OpenSessions or connections refused on the way.",
                        f.attack.name(),
                        f.attempts,
                        f.refused,
                    )
                };
            }
        }
        let renewals: Option<u64> = self.attacks.iter().map(|f| f.renewals_missed).sum();
        let _ = writeln!(
            out,
            "\nWrites of the dispatcher's Lease not accepted over every run: {}.",
            renewals.map_or_else(
                || "not counted by this dispatcher".to_owned(),
                |n| n.to_string()
            )
        );
        let _ = writeln!(
            out,
            "\n`lost` sums every run; the pod limit in `deploy/` is 512 MiB (this dispatcher's body pool is 32 MiB instead of 256 MiB, so the hog fills it within a run)."
        );
        out
    }
}
