//! `make bench-metrics` (`kube-dispatch-bench metrics`): what recording and serving metrics
//! costs a reconcile.
//!
//! One dispatcher and one controller replica in this process (each on a runtime of its own),
//! against the local control plane, with the controller's metrics off
//! (`Controller::metrics(false)`, nothing scraped) and on (recorded, and both processes'
//! `/metrics` scraped every 100 ms, ten times as often as a usual Prometheus), in alternating
//! order `--repeats` times each. Each run starts a fresh controller group on `--objects`
//! ConfigMaps, waits until every one is reconciled, then patches all of them at once (32
//! patches in flight) and times:
//!
//! - **throughput**: from the first patch sent to the last change reconciled, in reconciles/s;
//! - **write to reconcile**: from sending each patch to the start of the reconcile that saw it,
//!   p50 and p99.
//!
//! The reconcile does nothing, so what the tier costs per reconcile is as large a share as it
//! can be. The dispatcher's own metrics (the work queue's counters and histograms) are recorded
//! in both modes: they are part of its queue, and cost a few atomic adds per delivery.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    ResourceExt as _,
    api::{Api, Patch, PatchParams, PostParams},
};
use kube_dispatch_controller::{Action, Controller};
use kube_dispatch_dispatcher::config::SecurityConfig;
use kube_dispatch_telemetry::metrics::Metrics;
use kube_dispatch_tests::{
    TestNamespace,
    dispatcher::{TestDispatcher, test_config},
};
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    admin::scrape,
    report::{alternate, median, percentile},
};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Runs of each mode.
    pub repeats: usize,
    /// ConfigMaps, each patched once per run.
    pub objects: usize,
}

/// Patches in flight at once.
const WRITERS: usize = 32;
/// How often /metrics is scraped with metrics on.
const SCRAPE_EVERY: Duration = Duration::from_millis(100);

/// One run's figures.
#[derive(Debug)]
struct Run {
    /// Reconciles per second over the burst.
    throughput: f64,
    /// Write to reconcile start, µs.
    latencies: Vec<u64>,
    /// Scrapes made.
    scrapes: usize,
}

/// What the reconciles saw: the resourceVersion each name was last reconciled at, and when
/// each reconcile started.
#[derive(Default)]
struct Seen {
    started: Mutex<HashMap<(String, String), Instant>>,
    changed: Notify,
}

/// What both modes measured: the Markdown table, and the JSON of `metrics --json`.
#[derive(Debug, Serialize)]
pub(crate) struct Results {
    /// ConfigMaps patched at once per run.
    objects: usize,
    /// Runs of each mode.
    repeats: usize,
    /// Metrics off.
    off: Mode,
    /// Metrics on, and scraped.
    on: Mode,
}

/// The figures of one mode over its runs.
#[derive(Debug, Serialize)]
struct Mode {
    /// Reconciles per second over the burst, median of the runs.
    throughput: Option<f64>,
    /// Write to reconcile start, p50 of each run, median of the runs, ms.
    p50_ms: Option<f64>,
    /// Write to reconcile start, p99 of each run, median of the runs, ms.
    p99_ms: Option<f64>,
    /// Each run's throughput, reconciles per second, in the order run.
    throughput_per_run: Vec<f64>,
    /// Each run's scrapes of both processes' `/metrics` (none with metrics off).
    scrapes_per_run: Vec<usize>,
}

impl Mode {
    fn of(runs: &[Run]) -> Self {
        let latency = |p: f64| {
            median(
                runs.iter()
                    .filter_map(|r| {
                        let mut sorted = r.latencies.clone();
                        sorted.sort_unstable();
                        percentile(&sorted, p)
                    })
                    .map(|us| us / 1000.0)
                    .collect(),
            )
        };
        Self {
            throughput: median(runs.iter().map(|r| r.throughput).collect()),
            p50_ms: latency(0.5),
            p99_ms: latency(0.99),
            throughput_per_run: runs.iter().map(|r| r.throughput).collect(),
            scrapes_per_run: runs.iter().map(|r| r.scrapes).collect(),
        }
    }
}

/// Runs the plan and returns what it measured.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<Results> {
    let ns = TestNamespace::create("bench-metrics").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let names: Vec<String> = (0..plan.objects).map(|i| format!("cm-{i:05}")).collect();
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(name);
                api.create(&PostParams::default(), &cm).await
            }
        })
        .buffer_unordered(WRITERS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;

    let dispatcher_metrics = Metrics::default();
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.security = SecurityConfig::insecure();
    config.metrics = dispatcher_metrics.clone();
    let d = TestDispatcher::start(config).await?;

    let mut off = Vec::new();
    let mut on = Vec::new();
    for repeat in 0..plan.repeats {
        for metrics in alternate(repeat) {
            let group = format!(
                "bench-metrics-{repeat}-{}",
                if metrics { "on" } else { "off" }
            );
            let run = one_run(&api, &names, &d, &dispatcher_metrics, &group, metrics).await?;
            let mut sorted = run.latencies.clone();
            sorted.sort_unstable();
            println!(
                "bench-metrics: run {} metrics {:<3}: {:>7.0} reconciles/s, write to reconcile p50 {:>6.2} ms p99 {:>6.2} ms, {} scrapes",
                repeat + 1,
                if metrics { "on" } else { "off" },
                run.throughput,
                percentile(&sorted, 0.5).unwrap_or(f64::NAN) / 1000.0,
                percentile(&sorted, 0.99).unwrap_or(f64::NAN) / 1000.0,
                run.scrapes,
            );
            if metrics { &mut on } else { &mut off }.push(run);
        }
    }
    d.stop().await;
    ns.delete_and_wait(Duration::from_secs(120)).await?;
    Ok(Results {
        objects: plan.objects,
        repeats: plan.repeats,
        off: Mode::of(&off),
        on: Mode::of(&on),
    })
}

/// One run: a fresh group on every object, then a burst of one patch per object.
async fn one_run(
    api: &Api<ConfigMap>,
    names: &[String],
    d: &TestDispatcher,
    dispatcher_metrics: &Metrics,
    group: &str,
    metrics: bool,
) -> anyhow::Result<Run> {
    let seen = Arc::new(Seen::default());
    let stop = CancellationToken::new();
    let admin = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut controller = Controller::<ConfigMap>::new(api.clone().into_client(), group)
        .namespace(api_namespace(api))
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_proto::credentials::Credentials::plaintext())
        .concurrency(16)
        .metrics(metrics)
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    if metrics {
        controller = controller.admin_listen(admin);
    }
    let task = tokio::spawn(
        controller
            .run(
                |cm: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                    let key = (cm.name_any(), cm.resource_version().unwrap_or_default());
                    seen.started
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(key)
                        .or_insert_with(Instant::now);
                    seen.changed.notify_waiters();
                    Ok::<_, kube::Error>(Action::await_change())
                },
                |_, _, _| Action::await_change(),
                seen.clone(),
            )
            .for_each(|_| async {}),
    );
    let scraper = metrics.then(|| {
        let (stop, dispatcher_metrics) = (stop.clone(), dispatcher_metrics.clone());
        tokio::spawn(async move {
            let mut scrapes = 0;
            let mut tick = tokio::time::interval(SCRAPE_EVERY);
            while !stop.is_cancelled() {
                tick.tick().await;
                let _ = dispatcher_metrics.encode();
                if scrape(admin).await.is_ok() {
                    scrapes += 1;
                }
            }
            scrapes
        })
    });

    // Every object reconciled once: the group is warm.
    let names_now: Vec<(String, String)> = current_versions(api).await?;
    wait_for(&seen, &names_now, Duration::from_secs(120)).await?;

    let began = Instant::now();
    let (written, sent) = burst(api, names).await?;
    wait_for(&seen, &written, Duration::from_secs(120)).await?;
    let last = {
        let started = seen.started.lock().unwrap_or_else(|e| e.into_inner());
        written.iter().filter_map(|k| started.get(k)).max().copied()
    }
    .unwrap_or(began);
    let latencies = latencies(&seen, &written, &sent);
    stop.cancel();
    task.await?;
    let scrapes = match scraper {
        Some(s) => s.await?,
        None => 0,
    };
    Ok(Run {
        throughput: written.len() as f64 / last.saturating_duration_since(began).as_secs_f64(),
        latencies,
        scrapes,
    })
}

/// One merge patch per object, `WRITERS` at a time: each object's name and the version the
/// patch made, and when each patch was sent.
async fn burst(
    api: &Api<ConfigMap>,
    names: &[String],
) -> anyhow::Result<(Vec<(String, String)>, HashMap<String, Instant>)> {
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let written: Vec<(String, String)> = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let (api, sent) = (api.clone(), sent.clone());
            async move {
                let at = Instant::now();
                sent.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), at);
                let patch = serde_json::json!({"data": {"run": format!("{at:?}")}});
                let cm = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Ok::<_, kube::Error>((name, cm.resource_version().unwrap_or_default()))
            }
        })
        .buffer_unordered(WRITERS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|e| e.into_inner()));
    Ok((written, sent))
}

/// Per written version, from its patch being sent to the first reconcile that saw it
/// (microseconds).
fn latencies(
    seen: &Seen,
    written: &[(String, String)],
    sent: &HashMap<String, Instant>,
) -> Vec<u64> {
    let started = seen.started.lock().unwrap_or_else(|e| e.into_inner());
    written
        .iter()
        .filter_map(|k| {
            let at = started.get(k)?;
            let from = sent.get(&k.0)?;
            u64::try_from(at.saturating_duration_since(*from).as_micros()).ok()
        })
        .collect()
}

fn api_namespace(api: &Api<ConfigMap>) -> String {
    api.namespace().unwrap_or_default().to_owned()
}

/// Each ConfigMap's name and resourceVersion now.
async fn current_versions(api: &Api<ConfigMap>) -> anyhow::Result<Vec<(String, String)>> {
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|cm| (cm.name_any(), cm.resource_version().unwrap_or_default()))
        .collect())
}

/// Waits until every (name, resourceVersion) of `want` has been reconciled.
async fn wait_for(seen: &Seen, want: &[(String, String)], timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let changed = seen.changed.notified();
        let missing = {
            let started = seen.started.lock().unwrap_or_else(|e| e.into_inner());
            want.iter().filter(|k| !started.contains_key(*k)).count()
        };
        if missing == 0 {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            anyhow::bail!("{missing} changes were not reconciled within {timeout:?}");
        }
    }
}

impl Results {
    /// The results as Markdown: medians over the runs, and on against off.
    pub(crate) fn table(&self) -> String {
        let (off, on) = (&self.off, &self.on);
        let spread = |mode: &Mode| {
            let values = &mode.throughput_per_run;
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(0.0, f64::max);
            format!("{lo:.0} to {hi:.0}")
        };
        let row = |label: &str, off: Option<f64>, on: Option<f64>, digits: usize| match (off, on) {
            (Some(a), Some(b)) => {
                format!("| {label} | {a:.digits$} | {b:.digits$} | {:.3} |\n", b / a)
            }
            _ => format!("| {label} | - | - | - |\n"),
        };
        let mut out = format!(
            "{} ConfigMaps patched at once per run, {} runs of each mode (medians of the runs):\n\n| figure | metrics off | metrics on | on / off |\n| --- | ---: | ---: | ---: |\n",
            self.objects, self.repeats
        );
        out += &row("throughput, reconciles/s", off.throughput, on.throughput, 0);
        out += &row("write to reconcile p50, ms", off.p50_ms, on.p50_ms, 2);
        out += &row("write to reconcile p99, ms", off.p99_ms, on.p99_ms, 2);
        out += &format!(
            "\nThroughput over the runs: off {}, on {} reconciles/s; scrapes per run with metrics on: {}.\n",
            spread(off),
            spread(on),
            on.scrapes_per_run
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        out
    }
}
