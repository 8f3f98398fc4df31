//! The `daily` table and figures: medians of the runs, each incumbent set against the tier.

use serde::Serialize;

use super::{Event, Measured, Shape};
use crate::harness::report::median;

/// The figures of every run, for `--json`.
#[derive(Serialize)]
pub(crate) struct Figures<'a> {
    pub(crate) runs: &'a [Measured],
}

/// Figures this small (seconds of CPU above steady, milliseconds of latency) are within the
/// noise of the machine: no ratio is taken of them.
const NOISE: f64 = 0.05;

/// The median of `f` over the runs of `shape`'s `event`.
fn median_of(
    runs: &[Measured],
    shape: Shape,
    event: Event,
    f: fn(&Measured) -> f64,
) -> Option<f64> {
    median(
        runs.iter()
            .filter(|m| m.shape == shape && m.event == event)
            .map(f)
            .collect(),
    )
}

/// The shapes of `runs`, in their order.
fn shapes(runs: &[Measured]) -> Vec<Shape> {
    let mut shapes: Vec<Shape> = runs.iter().map(|m| m.shape).collect();
    shapes.sort_unstable();
    shapes.dedup();
    shapes
}

/// The tables, medians of the runs: each shape's cold start and memory, then a row per event
/// and shape with each incumbent's figure over the tier's for the event's cost and its slowest
/// write.
pub(crate) fn table(runs: &[Measured]) -> String {
    format!("{}\n{}", shapes_table(runs), events_table(runs))
}

/// A row per shape: its cold start, and every process's memory at the end of the steady window.
fn shapes_table(runs: &[Measured]) -> String {
    let mut out = String::from(
        "| shape | start to all reconciled (s) | all processes RSS, steady (MiB) | RSS ÷ the tier's |\n| --- | ---: | ---: | ---: |\n",
    );
    let tier_rss = median_of(runs, Shape::Tier, Event::Steady, |m| m.rss_mib);
    for shape in shapes(runs) {
        let cold = median(
            runs.iter()
                .filter(|m| m.shape == shape)
                .filter_map(|m| m.cold_start_s)
                .collect(),
        );
        let rss = median_of(runs, shape, Event::Steady, |m| m.rss_mib);
        let ratio = match (rss, tier_rss) {
            (Some(rss), Some(tier)) if shape != Shape::Tier && tier > 0.0 => {
                format!("{:.2}×", rss / tier)
            }
            _ => "–".to_owned(),
        };
        out.push_str(&format!(
            "| {shape} | {} | {} | {ratio} |\n",
            cold.map_or("–".to_owned(), |c| format!("{c:.2}")),
            rss.map_or("–".to_owned(), |r| format!("{r:.1}")),
        ));
    }
    out
}

/// A row per event and shape.
fn events_table(runs: &[Measured]) -> String {
    let shapes = shapes(runs);
    let mut events: Vec<Event> = runs.iter().map(|m| m.event).collect();
    events.sort_unstable();
    events.dedup();
    let mut out = String::from(
        "| event | shape | reconciling again after (s) | window (s) | API-server CPU (s) | above steady (s) | LIST / watch-list / GET | writes | write to reconcile p50 / p99 / max (ms) | above steady ÷ the tier's | max ÷ the tier's |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let fmt =
        |v: Option<f64>, digits: usize| v.map_or("–".to_owned(), |v| format!("{v:.digits$}"));
    for event in events {
        let tier_above = median_of(runs, Shape::Tier, event, |m| {
            m.above_steady_s.unwrap_or(0.0)
        });
        let tier_max = median_of(runs, Shape::Tier, event, |m| m.max_ms);
        for &shape in &shapes {
            let get = |f: fn(&Measured) -> f64| median_of(runs, shape, event, f);
            let Some(window) = get(|m| m.window_s) else {
                continue;
            };
            let above = (event != Event::Steady)
                .then(|| get(|m| m.above_steady_s.unwrap_or(0.0)))
                .flatten();
            let ratio = |mine: Option<f64>, tier: Option<f64>| match (mine, tier) {
                (Some(mine), Some(tier)) if shape != Shape::Tier => {
                    if tier > NOISE && mine > NOISE {
                        format!("{:.2}×", mine / tier)
                    } else if mine > NOISE {
                        format!("the tier's ≤ {NOISE}")
                    } else {
                        format!("both ≤ {NOISE}")
                    }
                }
                _ => "–".to_owned(),
            };
            let lists = get(|m| m.lists as f64);
            let watches = get(|m| m.watch_lists as f64);
            let gets = get(|m| m.gets as f64);
            out.push_str(&format!(
                "| {} | {shape} | {} | {} | {} | {} | {} / {} / {} | {} | {} / {} / {} | {} | {} |\n",
                event.name(),
                fmt(get(|m| m.recovered_s), 2),
                fmt(Some(window), 1),
                fmt(get(|m| m.apiserver_cpu_s), 2),
                fmt(above, 2),
                fmt(lists, 0),
                fmt(watches, 0),
                fmt(gets, 0),
                fmt(get(|m| m.writes as f64), 0),
                fmt(get(|m| m.p50_ms), 1),
                fmt(get(|m| m.p99_ms), 1),
                fmt(get(|m| m.max_ms), 1),
                if event == Event::Steady { "–".to_owned() } else { ratio(above, tier_above) },
                ratio(get(|m| m.max_ms), tier_max),
            ));
        }
    }
    // Not a median: one member judged dead is a stall of up to the handover bound.
    let judged: Vec<String> = runs
        .iter()
        .filter(|m| m.judged_dead > 0)
        .map(|m| {
            format!(
                "{} in the {} of run {}",
                m.judged_dead,
                m.event.name(),
                m.run + 1
            )
        })
        .collect();
    if !judged.is_empty() {
        out.push_str(&format!(
            "\nJudgements that a dispatcher died, one per dispatcher that saw it (the keys that move from each wait, up to the handover bound): {}.\n",
            judged.join(", ")
        ));
    }
    out
}
