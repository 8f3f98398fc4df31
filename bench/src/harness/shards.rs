//! `make bench-shards` (`kube-dispatch-bench shards`): the ring keyed by namespace, which asks
//! the API server for each dispatcher's own namespaces only (`shardSelector`), against the ring
//! keyed by name, on many namespaces of few objects.
//!
//! `--namespaces` namespaces (`kd-<i>-bench-shard-<objects>`) of `--objects` labelled ConfigMaps
//! each. For each ring key, a tier of `--dispatchers` dispatchers and the load balancer, and one
//! SDK replica subscribed to every namespace with the label selector:
//!
//! 1. **cold start**: from the replica's start until every object has been reconciled;
//! 2. **writes**: `--writes` patches spread over the namespaces, `--write-interval` apart,
//!    until each has been reconciled.
//!
//! For each phase and each dispatcher: CPU seconds, objects its watches decoded and how many of
//! them another dispatcher owns (`kube_dispatch_watch_events_total`,
//! `kube_dispatch_watch_elsewhere_total`); the controller's CPU; the API server's and etcd's CPU,
//! its LIST requests, and the bytes it sent in LIST responses and watch events
//! (`apiserver_response_sizes_sum`, `apiserver_watch_events_sizes_sum`, ConfigMaps).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use kube_dispatch_bench::{ReconcileStart, now_micros};
use serde::{Serialize, Serializer};
use tokio::sync::{mpsc, watch};

use super::{
    admin::{counter_sum, scrape},
    apiserver::{RequestCounts, sum_where},
    ceiling::{Starts, await_reconciled},
    objects::{Kind, change_value},
    process::Component,
    report::{as_millis, percentile},
    run::{SECURITY_OFF, Setup},
};

/// What one process did in one phase.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Process {
    /// CPU seconds.
    cpu_seconds: f64,
    /// Objects its watches decoded (applied and deleted); dispatchers only.
    events: f64,
    /// Of those, objects whose keys another dispatcher owns; dispatchers only.
    elsewhere: f64,
}

impl std::ops::Sub for Process {
    type Output = Self;
    fn sub(self, earlier: Self) -> Self {
        Self {
            cpu_seconds: self.cpu_seconds - earlier.cpu_seconds,
            events: self.events - earlier.events,
            elsewhere: self.elsewhere - earlier.elsewhere,
        }
    }
}

/// One phase of one variant (in the JSON, under the names given).
#[derive(Clone, Debug, Default, Serialize)]
struct Phase {
    /// How long the phase took.
    #[serde(rename = "took_ms", serialize_with = "as_millis")]
    took: Duration,
    /// Each dispatcher, in the order of the ring members (none for kube-rs).
    dispatchers: Vec<Process>,
    /// The controller replica (its CPU only).
    #[serde(rename = "controller_cpu_seconds", serialize_with = "cpu_seconds")]
    controller: Process,
    #[serde(rename = "apiserver_cpu_seconds")]
    apiserver_cpu: f64,
    #[serde(rename = "etcd_cpu_seconds")]
    etcd_cpu: f64,
    /// Bytes of LIST responses and of watch events the API server sent.
    list_bytes: f64,
    watch_bytes: f64,
    /// LIST requests on ConfigMaps (a WATCH is counted only when it ends, after the run).
    lists: u64,
    /// Write to reconcile start, ms (writes only: `None` for the cold start).
    #[serde(rename = "p50_ms")]
    p50: Option<f64>,
    #[serde(rename = "p99_ms")]
    p99: Option<f64>,
}

/// Serializes a process's figures as its CPU seconds alone.
fn cpu_seconds<S: Serializer>(p: &Process, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(p.cpu_seconds)
}

/// What runs the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// A kube-rs `Controller` over every namespace, with the label selector.
    KubeRs,
    /// One SDK replica on a tier whose ring is keyed by `name` or `namespace`.
    Tier(&'static str),
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::KubeRs => f.write_str("kube-rs"),
            Self::Tier(key) => write!(f, "ring keyed by {key}"),
        }
    }
}

/// As the table's column names it: `kube-rs`, `ring keyed by name`, `ring keyed by namespace`.
impl Serialize for Variant {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The JSON of `shards --json`: every variant's outcome, in the order run.
#[derive(Debug, Serialize)]
pub(crate) struct Figures<'a> {
    /// kube-rs, then the ring keyed by name, then by namespace.
    pub(crate) outcomes: &'a [Outcome],
}

/// Both phases of one variant.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Outcome {
    variant: Variant,
    /// From the replica's start until every object has been reconciled.
    cold: Phase,
    /// The timed writes, until each has been reconciled.
    writes: Phase,
}

/// What the processes and the control plane had used at one moment.
struct Snapshot {
    dispatchers: Vec<Process>,
    controller: Process,
    plane: (f64, f64),
    requests: super::apiserver::RequestCounts,
    /// Bytes the API server sent in LIST responses and in watch events, for ConfigMaps.
    sent: (f64, f64),
    at: Instant,
}

impl Setup<'_> {
    /// Runs both phases of `variant` on the setup's objects, spread over its namespaces (the
    /// tier's ring key is the setup's).
    pub(crate) async fn shards(&self, variant: Variant) -> anyhow::Result<Outcome> {
        let log_dir = self.log_dir.join(match variant {
            Variant::KubeRs => "shards-kube-rs".to_owned(),
            Variant::Tier(key) => format!("shards-{key}"),
        });
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create {}", log_dir.display()))?;
        let (mut components, admins, lb_port) = match variant {
            Variant::KubeRs => (Vec::new(), Vec::new(), None),
            Variant::Tier(_) => {
                let tier = self.start_tier(&log_dir, None).await?;
                (tier.components, tier.dispatcher_admin, Some(tier.lb_port))
            }
        };
        let (starts_tx, mut starts) = watch::channel(Starts::new());
        let (tx, mut rx) = mpsc::channel::<ReconcileStart>(4096);
        let observer = tokio::spawn(async move {
            while let Some(start) = rx.recv().await {
                starts_tx.send_modify(|s| {
                    s.entry(start.key)
                        .or_default()
                        .push((start.at_micros, start.resource_version));
                });
            }
        });
        let result = async {
            let before = self.snapshot(&mut components, &admins, None).await?;
            let mut replica = self.start_replica(lb_port, &log_dir, tx)?;
            let dispatchers = &mut components[..admins.len()];
            let phases = self
                .phases(
                    variant,
                    &before,
                    dispatchers,
                    &admins,
                    &mut replica,
                    &mut starts,
                )
                .await;
            replica.kill().await;
            phases
        }
        .await;
        observer.abort();
        futures::future::join_all(components.into_iter().map(Component::kill)).await;
        result
    }

    /// Starts the one controller replica: on the tier when it has a load balancer (on
    /// `lb_port`), on kube-rs otherwise; its reconcile starts go to `tx`.
    fn start_replica(
        &self,
        lb_port: Option<u16>,
        log_dir: &Path,
        tx: mpsc::Sender<ReconcileStart>,
    ) -> anyhow::Result<Component> {
        let selector = self
            .selector()
            .context("the sharding benchmark spreads its objects over namespaces")?;
        let runtime = if lb_port.is_some() {
            "dispatch"
        } else {
            "kube-rs"
        };
        let args: Vec<String> = [
            "--kind",
            "config-map",
            "--runtime",
            runtime,
            "--namespace",
            "",
            "--selector",
            &selector,
        ]
        .map(str::to_owned)
        .into();
        let mut env = vec![
            ("KUBECONFIG", self.kubeconfig.display().to_string()),
            ("POD_NAME", "bench-controller-0".to_owned()),
            ("KD_INSECURE", SECURITY_OFF.to_owned()),
            ("KD_ALLOW_ANONYMOUS", SECURITY_OFF.to_owned()),
        ];
        if let Some(port) = lb_port {
            env.push(("KD_LOADBALANCER", format!("127.0.0.1:{port}")));
        }
        Component::spawn(
            "bench-controller-0",
            &self.binaries.controller,
            &args,
            &env,
            log_dir,
            Some(tx),
        )
    }

    /// The two phases from `before` (the replica's start): every object's first reconcile,
    /// then the timed writes.
    async fn phases(
        &self,
        variant: Variant,
        before: &Snapshot,
        dispatchers: &mut [Component],
        admins: &[u16],
        replica: &mut Component,
        starts: &mut watch::Receiver<Starts>,
    ) -> anyhow::Result<Outcome> {
        let total = self.objects;
        tokio::time::timeout(
            Duration::from_secs(600),
            starts.wait_for(|s| s.len() >= total),
        )
        .await
        .context("not every object was reconciled within 600 s of the start")??;
        let cold_end = self.snapshot(dispatchers, admins, Some(replica)).await?;
        let cold = phase(before, &cold_end);
        println!(
            "bench-shards: {variant}: {total} objects reconciled {:.0} ms after the start",
            cold.took.as_secs_f64() * 1e3
        );
        let latencies = self.shard_writes(variant, starts).await?;
        let writes_end = self.snapshot(dispatchers, admins, Some(replica)).await?;
        let mut writes = phase(&cold_end, &writes_end);
        let p50 = percentile(&latencies, 0.50).unwrap_or(0.0) / 1e3;
        let p99 = percentile(&latencies, 0.99).unwrap_or(0.0) / 1e3;
        (writes.p50, writes.p99) = (Some(p50), Some(p99));
        println!(
            "bench-shards: {variant}: {} writes, p50 {p50:.1} ms, p99 {p99:.1} ms",
            latencies.len(),
        );
        Ok(Outcome {
            variant,
            cold,
            writes,
        })
    }

    /// Writes `self.writes` changes spread over the namespaces, `self.write_interval` apart,
    /// and waits until each has been reconciled. Returns each one's write-to-reconcile latency,
    /// sorted, in microseconds.
    async fn shard_writes(
        &self,
        variant: Variant,
        starts: &mut watch::Receiver<Starts>,
    ) -> anyhow::Result<Vec<u64>> {
        let mut sent = Vec::with_capacity(self.writes);
        let mut ticks = tokio::time::interval(self.write_interval);
        let tag = variant.to_string().replace(' ', "-");
        for w in 0..self.writes {
            ticks.tick().await;
            // Round the namespaces: the first object of each, then the second, and so on.
            let (namespaces, per) = (self.namespaces, self.objects / self.namespaces);
            let object = (w % namespaces) * per + (w / namespaces) % per;
            let (ns, i) = self.place(object);
            let at = now_micros();
            let rv = change_value(
                self.client,
                Kind::ConfigMap,
                &ns,
                i,
                &format!("{}-shards-{tag}-{w}", self.nonce),
            )
            .await?;
            sent.push((self.key(object), at, rv));
        }
        await_reconciled(starts, &sent).await
    }

    /// Figures of the dispatchers (`tier`, one admin port each), the controller (once it runs)
    /// and the control plane.
    async fn snapshot(
        &self,
        tier: &mut [Component],
        admins: &[u16],
        controller: Option<&mut Component>,
    ) -> anyhow::Result<Snapshot> {
        let mut dispatchers = Vec::new();
        for (component, admin) in tier.iter_mut().zip(admins) {
            let body = scrape(([127, 0, 0, 1], *admin).into())
                .await
                .context("cannot scrape a dispatcher's /metrics")?;
            let text = String::from_utf8_lossy(&body);
            dispatchers.push(Process {
                cpu_seconds: component.usage()?.cpu_seconds,
                events: counter_sum(&text, "kube_dispatch_watch_events_total"),
                elsewhere: counter_sum(&text, "kube_dispatch_watch_elsewhere_total"),
            });
        }
        let controller = match controller {
            Some(c) => Process {
                cpu_seconds: c.usage()?.cpu_seconds,
                ..Process::default()
            },
            None => Process::default(),
        };
        // The counters with what of the audit log they hold ([`super::apiserver::request_counts`]).
        let (metrics, own) = super::apiserver::metrics_and_own(self.client).await?;
        Ok(Snapshot {
            dispatchers,
            controller,
            plane: self.control_plane.cpu_seconds(),
            requests: RequestCounts::parse(&metrics).less(own.as_ref()),
            sent: (
                sum_where(
                    &metrics,
                    "apiserver_response_sizes_sum",
                    &[CONFIGMAPS, "verb=\"LIST\""],
                ),
                sum_where(&metrics, "apiserver_watch_events_sizes_sum", &[CONFIGMAPS]),
            ),
            at: Instant::now(),
        })
    }
}

fn phase(before: &Snapshot, after: &Snapshot) -> Phase {
    Phase {
        took: after.at - before.at,
        dispatchers: after
            .dispatchers
            .iter()
            .zip(&before.dispatchers)
            .map(|(a, b)| *a - *b)
            .collect(),
        controller: after.controller - before.controller,
        apiserver_cpu: after.plane.0 - before.plane.0,
        etcd_cpu: after.plane.1 - before.plane.1,
        list_bytes: after.sent.0 - before.sent.0,
        watch_bytes: after.sent.1 - before.sent.1,
        lists: after.requests.since(&before.requests, "configmaps", "LIST"),
        p50: None,
        p99: None,
    }
}

/// A figure of a phase; `None` where it does not apply (dispatchers of kube-rs).
type Figure = fn(&Phase) -> Option<f64>;

/// The largest of a dispatcher figure over the dispatchers.
fn most(p: &Phase, f: fn(&Process) -> f64) -> Option<f64> {
    p.dispatchers.iter().map(f).reduce(f64::max)
}

/// The sum of a dispatcher figure over the dispatchers.
fn all(p: &Phase, f: fn(&Process) -> f64) -> Option<f64> {
    (!p.dispatchers.is_empty()).then(|| p.dispatchers.iter().map(f).sum())
}

const MIB: f64 = 1_048_576.0;

/// The label of the API server's ConfigMap series.
const CONFIGMAPS: &str = "resource=\"configmaps\"";

/// The rows of each phase.
const ROWS: [(&str, Figure, usize); 12] = [
    (
        "until every object reconciled (ms)",
        |p| Some(p.took.as_secs_f64() * 1e3),
        0,
    ),
    ("controller CPU (s)", |p| Some(p.controller.cpu_seconds), 2),
    (
        "dispatcher CPU, busiest (s)",
        |p| most(p, |d| d.cpu_seconds),
        2,
    ),
    ("dispatcher CPU, all (s)", |p| all(p, |d| d.cpu_seconds), 2),
    (
        "bytes the API server sent in LIST responses (MiB)",
        |p| Some(p.list_bytes / MIB),
        1,
    ),
    (
        "bytes the API server sent in watch events (MiB)",
        |p| Some(p.watch_bytes / MIB),
        1,
    ),
    (
        "objects decoded by all dispatchers",
        |p| all(p, |d| d.events),
        0,
    ),
    (
        "objects decoded by a dispatcher, most",
        |p| most(p, |d| d.events),
        0,
    ),
    (
        "of them owned by another dispatcher",
        |p| all(p, |d| d.elsewhere),
        0,
    ),
    ("CPU, kube-apiserver (s)", |p| Some(p.apiserver_cpu), 2),
    ("CPU, etcd (s)", |p| Some(p.etcd_cpu), 2),
    ("API requests: LIST", |p| Some(p.lists as f64), 0),
];

/// The results as Markdown: a row per figure, a column per variant, and each variant's figure
/// divided by the last one's (the ring keyed by namespace).
pub(crate) fn table(outcomes: &[Outcome]) -> String {
    let Some(last) = outcomes.last() else {
        return String::new();
    };
    let mut out = String::from("| figure |");
    let mut rule = String::from("| --- |");
    for o in outcomes {
        out.push_str(&format!(" {} |", o.variant));
        rule.push_str(" ---: |");
    }
    for o in &outcomes[..outcomes.len() - 1] {
        out.push_str(&format!(" {} ÷ {} |", o.variant, last.variant));
        rule.push_str(" ---: |");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let mut line = |label: String, values: Vec<Option<f64>>, digits: usize| {
        out.push_str(&format!("| {label} |"));
        for v in &values {
            match v {
                Some(v) => out.push_str(&format!(" {v:.digits$} |")),
                None => out.push_str(" – |"),
            }
        }
        let reference = values.last().copied().flatten();
        for v in &values[..values.len() - 1] {
            match (v, reference) {
                (Some(v), Some(r)) if r > 0.0 => out.push_str(&format!(" {:.2}× |", v / r)),
                _ => out.push_str(" – |"),
            }
        }
        out.push('\n');
    };
    let phases = [("cold start", false), ("writes", true)];
    for (name, writes) in phases {
        let pick = |o: &Outcome| {
            if writes {
                o.writes.clone()
            } else {
                o.cold.clone()
            }
        };
        for (label, figure, digits) in ROWS {
            let label = if name == "writes" && label.starts_with("until") {
                "until every write reconciled (ms)"
            } else {
                label
            };
            line(
                format!("{name}: {label}"),
                outcomes.iter().map(|o| figure(&pick(o))).collect(),
                digits,
            );
        }
    }
    let latencies: [(&str, Figure); 2] = [
        ("writes: write to reconcile start, p50 (ms)", |p| p.p50),
        ("writes: write to reconcile start, p99 (ms)", |p| p.p99),
    ];
    for (label, figure) in latencies {
        line(
            label.to_owned(),
            outcomes.iter().map(|o| figure(&o.writes)).collect(),
            1,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_serializes_with_its_dispatchers_and_no_latency_for_the_cold_start() {
        let dispatcher = Process {
            cpu_seconds: 1.5,
            events: 36.0,
            elsewhere: 24.0,
        };
        let outcome = Outcome {
            variant: Variant::Tier("namespace"),
            cold: Phase {
                took: Duration::from_millis(250),
                dispatchers: vec![dispatcher; 3],
                controller: Process {
                    cpu_seconds: 0.5,
                    ..Process::default()
                },
                ..Phase::default()
            },
            writes: Phase {
                p50: Some(1.0),
                p99: Some(2.0),
                ..Phase::default()
            },
        };
        let json = serde_json::to_value(Figures {
            outcomes: &[outcome],
        })
        .expect("serializes");
        let outcome = &json["outcomes"][0];
        assert_eq!(outcome["variant"], "ring keyed by namespace");
        assert_eq!(outcome["cold"]["took_ms"], 250.0);
        assert_eq!(outcome["cold"]["controller_cpu_seconds"], 0.5);
        assert_eq!(outcome["cold"]["dispatchers"][2]["events"], 36.0);
        assert_eq!(outcome["cold"]["dispatchers"][2]["elsewhere"], 24.0);
        assert!(outcome["cold"]["p50_ms"].is_null());
        assert_eq!(outcome["writes"]["p99_ms"], 2.0);
    }
}
