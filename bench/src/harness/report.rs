//! Medians over the repeated runs, the table with ratios, its Markdown and its JSON.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use serde::{Serialize, Serializer};

use super::{
    objects::{self, Kind},
    run::{RunResult, VERBS, Variant},
};

const MIB: f64 = 1024.0 * 1024.0;

/// One row of the table: how to read the figure from a run.
pub(crate) struct Row {
    /// What the Markdown table calls it.
    pub(crate) label: &'static str,
    /// What the JSON calls it: snake_case, with the unit last; stable across releases.
    pub(crate) key: &'static str,
    decimals: usize,
    read: Read,
}

enum Read {
    /// The median over the runs of this figure (None where it does not apply).
    Median(fn(&RunResult) -> Option<f64>),
    /// A percentile of the write-to-reconcile latencies of all runs pooled, in ms.
    LatencyPercentile(f64),
    /// The median over the runs of the API requests of this verb.
    Requests(&'static str),
    /// The slowest write of all runs, in ms.
    Worst,
}

fn max_of(values: impl Iterator<Item = u64>) -> Option<f64> {
    values.max().map(|v| v as f64 / MIB)
}

/// The rows, in the order printed: memory, times, CPU, API requests.
pub(crate) fn rows() -> Vec<Row> {
    let mut rows = memory_rows();
    rows.extend(time_rows());
    rows.extend(cpu_rows());
    rows.extend(request_rows());
    rows
}

/// A row of the median over the runs of what `read` reads from each.
fn median_row(
    label: &'static str,
    key: &'static str,
    decimals: usize,
    read: fn(&RunResult) -> Option<f64>,
) -> Row {
    Row {
        label,
        key,
        decimals,
        read: Read::Median(read),
    }
}

/// Each process's memory.
fn memory_rows() -> Vec<Row> {
    vec![
        median_row(
            "controller RSS, peak, largest replica (MiB)",
            "controller_rss_peak_mib",
            1,
            |r: &RunResult| max_of(r.replicas.iter().map(|u| u.peak_rss)),
        ),
        median_row(
            "controller RSS, steady, largest replica (MiB)",
            "controller_rss_steady_mib",
            1,
            |r| max_of(r.replicas.iter().map(|u| u.rss)),
        ),
        median_row(
            "dispatcher RSS, peak, largest (MiB)",
            "dispatcher_rss_peak_mib",
            1,
            |r| max_of(r.dispatchers.iter().map(|u| u.peak_rss)),
        ),
        median_row(
            "dispatcher RSS, steady, largest (MiB)",
            "dispatcher_rss_steady_mib",
            1,
            |r| max_of(r.dispatchers.iter().map(|u| u.rss)),
        ),
        median_row(
            "load balancer RSS, peak (MiB)",
            "loadbalancer_rss_peak_mib",
            1,
            |r| r.loadbalancer.map(|u| u.peak_rss as f64 / MIB),
        ),
        median_row(
            "all processes RSS, steady, sum (MiB)",
            "all_processes_rss_steady_mib",
            1,
            |r| {
                let all = r
                    .replicas
                    .iter()
                    .chain(&r.dispatchers)
                    .chain(&r.loadbalancer);
                Some(all.map(|u| u.rss as f64).sum::<f64>() / MIB)
            },
        ),
    ]
}

/// The cold start's times and the timed writes' latencies.
fn time_rows() -> Vec<Row> {
    vec![
        median_row(
            "start to first reconcile (ms)",
            "first_reconcile_ms",
            0,
            |r| Some(r.first_reconcile.as_secs_f64() * 1e3),
        ),
        median_row(
            "start to all objects reconciled (ms)",
            "all_reconciled_ms",
            0,
            |r| Some(r.all_reconciled.as_secs_f64() * 1e3),
        ),
        median_row(
            "all objects reconciled to the API server quiet again (ms)",
            "quiet_after_ms",
            0,
            |r| Some(r.quiet_after.as_secs_f64() * 1e3),
        ),
        Row {
            label: "write to reconcile start, p50 (ms)",
            key: "write_to_reconcile_p50_ms",
            decimals: 1,
            read: Read::LatencyPercentile(0.50),
        },
        Row {
            label: "write to reconcile start, p99 (ms)",
            key: "write_to_reconcile_p99_ms",
            decimals: 1,
            read: Read::LatencyPercentile(0.99),
        },
        median_row(
            "write to reconcile start, p99 of each run, median (ms)",
            "write_to_reconcile_p99_run_median_ms",
            1,
            |r| {
                let mut sorted = r.latencies_us.clone();
                sorted.sort_unstable();
                percentile(&sorted, 0.99).map(|us| us / 1e3)
            },
        ),
        Row {
            label: "write to reconcile start, worst write of all runs (ms)",
            key: "write_to_reconcile_worst_ms",
            decimals: 1,
            read: Read::Worst,
        },
    ]
}

/// The CPU each process used.
fn cpu_rows() -> Vec<Row> {
    vec![
        median_row(
            "CPU, controller replicas (s)",
            "cpu_controllers_s",
            2,
            |r| Some(r.replicas.iter().map(|u| u.cpu_seconds).sum()),
        ),
        median_row(
            "CPU, dispatchers and load balancer (s)",
            "cpu_tier_s",
            2,
            |r| {
                let tier: Vec<f64> = r
                    .dispatchers
                    .iter()
                    .chain(&r.loadbalancer)
                    .map(|u| u.cpu_seconds)
                    .collect();
                (!tier.is_empty()).then(|| tier.iter().sum())
            },
        ),
        median_row("CPU, kube-apiserver (s)", "cpu_apiserver_s", 2, |r| {
            Some(r.apiserver_cpu)
        }),
        median_row(
            "CPU, kube-apiserver, until every object reconciled and the API server quiet (s)",
            "cpu_apiserver_cold_s",
            2,
            |r| Some(r.apiserver_cpu_cold),
        ),
        median_row(
            "CPU, kube-apiserver, the timed writes: from quiet after the cold start until every write's reconcile started (s)",
            "cpu_apiserver_writes_s",
            2,
            |r| Some(r.apiserver_cpu_writes),
        ),
        median_row(
            "CPU, kube-apiserver, stopping every process (s)",
            "cpu_apiserver_stop_s",
            2,
            |r| Some(r.apiserver_cpu - r.apiserver_cpu_cold - r.apiserver_cpu_writes),
        ),
        median_row("CPU, etcd (s)", "cpu_etcd_s", 2, |r| Some(r.etcd_cpu)),
    ]
}

/// The API requests by verb, and the reconciles they served.
fn request_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for verb in VERBS {
        let (label, key) = match verb {
            "LIST" => ("API requests on the resource: LIST", "requests_list"),
            "WATCH" => ("API requests on the resource: WATCH", "requests_watch"),
            "GET" => ("API requests on the resource: GET", "requests_get"),
            "APPLY" => (
                "API requests on the resource: server-side applies by controllers",
                "requests_apply",
            ),
            _ => (
                "API requests on the resource: PATCH by controllers",
                "requests_patch",
            ),
        };
        rows.push(Row {
            label,
            key,
            decimals: 0,
            read: Read::Requests(verb),
        });
    }
    rows.push(median_row("reconciles started", "reconciles", 0, |r| {
        Some(r.reconciles as f64)
    }));
    rows
}

pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        f64::midpoint(values[mid - 1], values[mid])
    })
}

/// The order of the two modes (off, on) in run `repeat` of an A/B benchmark: alternated, so
/// drift on a noisy machine falls on both.
pub(crate) fn alternate(repeat: usize) -> [bool; 2] {
    if repeat.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// Nearest-rank percentile.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64)
}

impl Row {
    /// The figure over every run of one variant.
    pub(crate) fn value(&self, runs: &[&RunResult]) -> Option<f64> {
        match self.read {
            Read::Median(read) => median(runs.iter().filter_map(|r| read(r)).collect()),
            Read::Requests(verb) => median(
                runs.iter()
                    .filter_map(|r| r.requests.get(verb).map(|n| *n as f64))
                    .collect(),
            ),
            Read::Worst => runs
                .iter()
                .flat_map(|r| r.latencies_us.iter().copied())
                .max()
                .map(|us| us as f64 / 1e3),
            Read::LatencyPercentile(p) => {
                let mut all: Vec<u64> = runs
                    .iter()
                    .flat_map(|r| r.latencies_us.iter().copied())
                    .collect();
                all.sort_unstable();
                percentile(&all, p).map(|us| us / 1e3)
            }
        }
    }
}

/// Every run of one scenario: kinds, object count, namespaces, controllers.
pub(crate) struct Scenario {
    /// The kinds of object; several when the controllers are spread over them (`--mix`).
    pub(crate) kinds: Vec<Kind>,
    /// Objects of each kind.
    pub(crate) objects: usize,
    /// Namespaces the objects are spread over (1: all in one).
    pub(crate) namespaces: usize,
    /// Distinct controllers, each reconciling every object.
    pub(crate) groups: usize,
    /// ConfigMaps each object owns (0: none).
    pub(crate) children: usize,
    /// Every run of every variant.
    pub(crate) runs: Vec<RunResult>,
}

/// The JSON of `compare --json`: every scenario's figures.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    /// In the order run.
    scenarios: Vec<ScenarioFigures>,
}

impl Figures {
    /// The figures of `scenarios`.
    pub(crate) fn of(scenarios: &[Scenario]) -> Self {
        Self {
            scenarios: scenarios.iter().map(Scenario::figures).collect(),
        }
    }
}

/// One scenario in the JSON: what it ran on, then the figures of its table (without the
/// ratios), per variant and row key; `null` where the table shows `–`.
#[derive(Debug, Serialize)]
pub(crate) struct ScenarioFigures {
    /// The kinds' `--kinds` values.
    kinds: Vec<&'static str>,
    /// Objects of each kind.
    objects: usize,
    namespaces: usize,
    groups: usize,
    children: usize,
    /// Runs of each variant.
    runs: usize,
    /// Variant (`kube-rs`, `dispatch-1`, ...) to row key ([`Row::key`]) to figure.
    figures: BTreeMap<String, BTreeMap<&'static str, Option<f64>>>,
}

impl Scenario {
    pub(crate) fn variants(&self) -> Vec<Variant> {
        let mut v: Vec<Variant> = self.runs.iter().map(|r| r.variant).collect();
        v.sort();
        v.dedup();
        v
    }

    pub(crate) fn runs_of(&self, variant: Variant) -> Vec<&RunResult> {
        self.runs.iter().filter(|r| r.variant == variant).collect()
    }

    /// A figure of one variant.
    pub(crate) fn value(&self, row: &Row, variant: Variant) -> Option<f64> {
        row.value(&self.runs_of(variant))
    }

    /// What [`Scenario::table`] shows, for the JSON.
    pub(crate) fn figures(&self) -> ScenarioFigures {
        let variants = self.variants();
        let rows = rows();
        ScenarioFigures {
            kinds: self.kinds.iter().map(|k| k.flag()).collect(),
            objects: self.objects,
            namespaces: self.namespaces,
            groups: self.groups,
            children: self.children,
            runs: variants.first().map_or(0, |v| self.runs_of(*v).len()),
            figures: variants
                .iter()
                .map(|v| {
                    let figures: BTreeMap<_, _> =
                        rows.iter().map(|r| (r.key, self.value(r, *v))).collect();
                    (v.to_string(), figures)
                })
                .collect(),
        }
    }

    /// The Markdown table: one column per variant, then each incumbent divided by each variant
    /// of kube-dispatch with one replica (whatever its dispatchers' list mode), and
    /// controller-runtime by its Go SDK port with one replica.
    pub(crate) fn table(&self) -> String {
        let variants = self.variants();
        // Each incumbent against the Rust SDK with one replica, and controller-runtime against
        // its own port to the Go SDK with one replica.
        let mut ratios: Vec<(Variant, Variant)> = Vec::new();
        for sdk in variants.iter().filter(|v| v.is_sdk_alone()) {
            ratios.extend(variants.iter().filter(|v| !v.on_tier()).map(|v| (*v, *sdk)));
        }
        if variants.contains(&Variant::GoDispatch(1))
            && variants.contains(&Variant::ControllerRuntime)
        {
            ratios.push((Variant::ControllerRuntime, Variant::GoDispatch(1)));
        }
        // The same controller finding its children through an index: on its cache, and on the
        // tier (Go), and kube-rs's store against the Rust SDK's reads.
        if variants.contains(&Variant::GoDispatchIndex(1))
            && variants.contains(&Variant::ControllerRuntimeIndex)
        {
            ratios.push((Variant::ControllerRuntimeIndex, Variant::GoDispatchIndex(1)));
        }
        if variants.contains(&Variant::DispatchIndex(1)) && variants.contains(&Variant::KubeRs) {
            ratios.push((Variant::KubeRs, Variant::DispatchIndex(1)));
        }
        let runs = variants.first().map_or(0, |v| self.runs_of(*v).len());
        let mut out = format!(
            "#### {}, {} objects{}{}{}{} ({}; latency percentiles over all runs' writes)\n\n| figure |",
            objects::titles(&self.kinds),
            self.objects,
            if self.children == 0 {
                String::new()
            } else {
                format!(" owning {} ConfigMaps each", self.children)
            },
            if self.kinds.len() == 1 {
                ""
            } else {
                " of each kind"
            },
            if self.namespaces == 1 {
                String::new()
            } else {
                format!(" in {} namespaces", self.namespaces)
            },
            if self.groups == 1 {
                String::new()
            } else {
                format!(", {} controllers", self.groups)
            },
            if runs == 1 {
                "1 run".to_owned()
            } else {
                format!("median of {runs} runs")
            }
        );
        for v in &variants {
            let _ = write!(out, " {v} |");
        }
        for (v, baseline) in &ratios {
            let _ = write!(out, " {v} ÷ {baseline} |");
        }
        out.push_str("\n| --- |");
        for _ in 0..variants.len() + ratios.len() {
            out.push_str(" ---: |");
        }
        out.push('\n');
        for row in rows() {
            let _ = write!(out, "| {} |", row.label);
            for v in &variants {
                match self.value(&row, *v) {
                    Some(x) => {
                        let _ = write!(out, " {x:.*} |", row.decimals);
                    }
                    None => out.push_str(" – |"),
                }
            }
            for (v, baseline) in &ratios {
                match (self.value(&row, *v), self.value(&row, *baseline)) {
                    (Some(a), Some(b)) if b > 0.0 => {
                        let _ = write!(out, " {:.2}× |", a / b);
                    }
                    _ => out.push_str(" – |"),
                }
            }
            out.push('\n');
        }
        out
    }
}

/// What the plots put on their x axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Axis {
    /// The object count, with one controller.
    Objects,
    /// The number of controllers, at this object count.
    Groups(usize),
}

/// Per variant, the figure of a row at each point of `axis`, for the scenarios of `kinds` (for
/// the plots).
pub(crate) fn series(
    scenarios: &[Scenario],
    kinds: &[Kind],
    axis: Axis,
    row: &Row,
) -> BTreeMap<Variant, Vec<(usize, f64)>> {
    let mut out: BTreeMap<Variant, Vec<(usize, f64)>> = BTreeMap::new();
    for s in scenarios.iter().filter(|s| s.kinds == kinds) {
        let x = match axis {
            Axis::Objects if s.groups == 1 => s.objects,
            Axis::Groups(objects) if s.objects == objects => s.groups,
            _ => continue,
        };
        for v in s.variants() {
            if let Some(y) = s.value(row, v) {
                out.entry(v).or_default().push((x, y));
            }
        }
    }
    for points in out.values_mut() {
        points.sort_by_key(|(n, _)| *n);
    }
    out
}

/// Serializes a duration as milliseconds (a number), for the JSON figures.
pub(crate) fn as_millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentile() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
        let sorted: Vec<u64> = (1..=200).collect();
        assert_eq!(percentile(&sorted, 0.5), Some(100.0));
        assert_eq!(percentile(&sorted, 0.99), Some(198.0));
        assert_eq!(percentile(&[7], 0.99), Some(7.0));
    }

    #[test]
    fn every_row_has_a_distinct_snake_case_key() {
        let rows = rows();
        let mut keys: Vec<&str> = rows.iter().map(|r| r.key).collect();
        assert!(keys.iter().all(|k| {
            !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        }));
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), rows.len());
    }
}
