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
        let attacks: Vec<Figures> = Attack::ALL
            .into_iter()
            .map(|attack| {
                let rs = of(attack);
                let p99 = med(&rs, &|r| ms(&r.deliveries, 0.99));
                Figures {
                    attack,
                    p50_ms: med(&rs, &|r| ms(&r.deliveries, 0.5)),
                    p99_ms: p99,
                    p99_over_baseline: p99 / baseline_p99,
                    lost: rs.iter().map(|r| r.lost).sum::<usize>(),
                    healthz_p99_ms: med(&rs, &|r| ms(&r.probes, 0.99)),
                    peak_rss_mib: med(&rs, &|r| mib(r.peak_rss)),
                    attempts: med(&rs, &|r| r.attempts as f64),
                    refused: med(&rs, &|r| r.refused as f64),
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
            "| attack (median of {} runs, {} writes each) | bound that holds it | write to reconcile p50 (ms) | p99 (ms) | p99 / baseline | lost | `/healthz` p99 (ms) | dispatcher peak RSS (MiB) | attack calls or connections | refused or closed |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            self.repeats, self.writes
        );
        for f in &self.attacks {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.2} | {:.2}x | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
                f.attack.name(),
                f.attack.bound(),
                f.p50_ms,
                f.p99_ms,
                f.p99_over_baseline,
                f.lost,
                f.healthz_p99_ms,
                f.peak_rss_mib,
                f.attempts,
                f.refused,
            );
        }
        let _ = writeln!(
            out,
            "\n`lost` sums every run; the pod limit in `deploy/` is 512 MiB (this dispatcher's body pool is 32 MiB instead of 256 MiB, so the hog fills it within a run)."
        );
        out
    }
}
