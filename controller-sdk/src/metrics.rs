//! The replica's metrics, under controller-runtime's names and labels so that dashboards and
//! alerts built for controller-runtime work unchanged, plus kube-dispatch's own.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `controller_runtime_reconcile_total` | counter | `controller`, `result` (`success`, `error`, `requeue`, `requeue_after`) |
//! | `controller_runtime_reconcile_errors_total` | counter | `controller` |
//! | `controller_runtime_reconcile_timeouts_total` | counter | `controller` |
//! | `controller_runtime_reconcile_time_seconds` | histogram (controller-runtime's buckets) | `controller` |
//! | `controller_runtime_active_workers` | gauge | `controller` |
//! | `controller_runtime_max_concurrent_reconciles` | gauge | `controller` |
//! | `kube_dispatch_sessions` | gauge: sessions open | `controller`, `dispatcher` |
//! | `kube_dispatch_session_reconnects_total` | counter: sessions lost and opened again | `controller` |
//! | `kube_dispatch_fenced_reconciles_total` | counter: reconciles cancelled because their session could not be renewed in time | `controller` |
//! | `kube_dispatch_deliveries_total` | counter | `controller`, `reason` (`added`, `modified`, `deleted`, `resync`, `retry`, `requeue`, `owned`, `referenced`, `triggered`) |
//! | `kube_dispatch_stale_writes_total` | counter: conditional writes refused with 409 ([`crate::precondition`]) | `controller` |
//! | `kube_dispatch_delivery_to_reconcile_seconds` | histogram: from a delivery's arrival to its reconcile's start | `controller` |
//! | `kube_dispatch_ready_to_reconcile_seconds` | histogram: from the key's becoming ready at the dispatcher (a change seen, a requeue or backoff due) to its reconcile's start here: the tier's latency, which its SLO alert reads (buckets [`READY_BUCKETS`]; not observed for keys that waited behind the changes by design, a resync or a list after a restart or a handover, nor from dispatchers older than 0.2, which do not say how long the key waited) | `controller` |
//! | `kube_dispatch_objects_loaded_total` | counter: objects handed to reconciles, by where they came from: the request's body, the object as this replica last reconciled it at the version the request names (no read; [`Controller::recent_objects`](crate::Controller::recent_objects)), or a read from the API server | `controller`, `source` (`request`, `recent`, `read`) |
//! | `kube_dispatch_api_requests_total` | counter: requests the controller's client ([`Controller::client`](crate::Controller::client)) sent, by verb; divided by `controller_runtime_reconcile_total`, what a reconcile costs the API server ([`crate::api_requests`]) | `controller`, `verb` (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`) |
//!
//! `controller` is the controller group's name, `dispatcher` a dispatcher's address: no label
//! names a key or an object, so the series stay few however many objects there are.
//!
//! [`registry`] is the process's registry: register your own metrics there and they are
//! served with these by [`Controller::admin_listen`](crate::Controller::admin_listen). A
//! controller that serves a prometheus-client registry of its own passes it to
//! [`register_into`], and serves these with its own.

use std::{sync::LazyLock, time::Duration};

use kube_dispatch_proto::v1::Reason;
use kube_dispatch_telemetry::metrics::Metrics;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Metric, Registry},
};

/// The process's metrics registry: the SDK's metrics and the process metrics are in it, and
/// yours can join them.
pub fn registry() -> &'static Metrics {
    &FAMILIES.metrics
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DispatcherLabels {
    controller: String,
    dispatcher: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    controller: String,
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    controller: String,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    controller: String,
    reason: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

struct Families {
    metrics: Metrics,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabel, Counter>,
    timeouts: Family<ControllerLabel, Counter>,
    reconcile_time: Histograms<ControllerLabel>,
    active: Family<ControllerLabel, Gauge>,
    max_concurrent: Family<ControllerLabel, Gauge>,
    sessions: Family<DispatcherLabels, Gauge>,
    reconnects: Family<ControllerLabel, Counter>,
    fenced: Family<ControllerLabel, Counter>,
    deliveries: Family<ReasonLabels, Counter>,
    stale_writes: Family<ControllerLabel, Counter>,
    delivery_to_reconcile: Histograms<ControllerLabel>,
    ready_to_reconcile: Histograms<ControllerLabel>,
    api_requests: Family<VerbLabels, Counter>,
    loaded: Family<SourceLabels, Counter>,
}

/// controller-runtime's buckets of `controller_runtime_reconcile_time_seconds`.
const RECONCILE_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

fn reconcile_histogram() -> Histogram {
    Histogram::new(RECONCILE_BUCKETS)
}

/// 100 µs to about 100 s, by factors of 2.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 21))
}

/// The buckets of `kube_dispatch_ready_to_reconcile_seconds`, in seconds: round figures, so an
/// SLO's threshold (the chart's `monitoring.alerts.slo.latencySeconds`) is one of them.
pub const READY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

fn ready_histogram() -> Histogram {
    Histogram::new(READY_BUCKETS)
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| {
    let f = Families {
        metrics: Metrics::default(),
        reconciles: Family::default(),
        errors: Family::default(),
        timeouts: Family::default(),
        reconcile_time: Family::new_with_constructor(reconcile_histogram),
        active: Family::default(),
        max_concurrent: Family::default(),
        sessions: Family::default(),
        reconnects: Family::default(),
        fenced: Family::default(),
        deliveries: Family::default(),
        stale_writes: Family::default(),
        delivery_to_reconcile: Family::new_with_constructor(wait_histogram),
        ready_to_reconcile: Family::new_with_constructor(ready_histogram),
        api_requests: Family::default(),
        loaded: Family::default(),
    };
    f.register_into(&mut &f.metrics);
    f
});

/// Where the SDK's families are registered: the process's registry, or a controller's own.
trait Sink {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric);
}

impl Sink for &Metrics {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.register(name, help, metric);
    }
}

impl Sink for Registry {
    fn add(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.register(name, help, metric);
    }
}

impl Families {
    /// Registers every family in `sink`: the same families, so both see the same figures.
    fn register_into(&self, sink: &mut impl Sink) {
        let f = self;
        sink.add(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            f.reconciles.clone(),
        );
        sink.add(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            f.errors.clone(),
        );
        sink.add(
            "controller_runtime_reconcile_timeouts",
            "Total number of reconciliation timeouts per controller",
            f.timeouts.clone(),
        );
        sink.add(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            f.reconcile_time.clone(),
        );
        sink.add(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            f.active.clone(),
        );
        sink.add(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            f.max_concurrent.clone(),
        );
        sink.add(
            "kube_dispatch_sessions",
            "Dispatcher sessions open, per controller and dispatcher",
            f.sessions.clone(),
        );
        sink.add(
            "kube_dispatch_session_reconnects",
            "Dispatcher sessions lost and opened again",
            f.reconnects.clone(),
        );
        sink.add(
            "kube_dispatch_fenced_reconciles",
            "Reconciles cancelled because their session could not be renewed in time",
            f.fenced.clone(),
        );
        sink.add(
            "kube_dispatch_deliveries",
            "Reconcile requests received, by reason",
            f.deliveries.clone(),
        );
        sink.add(
            "kube_dispatch_api_requests",
            "API requests the controller's client sent, by verb",
            f.api_requests.clone(),
        );
        sink.add(
            "kube_dispatch_objects_loaded",
            "Objects handed to reconciles, by where they came from",
            f.loaded.clone(),
        );
        sink.add(
            "kube_dispatch_stale_writes",
            "Conditional writes refused with 409 Conflict: the object had changed",
            f.stale_writes.clone(),
        );
        sink.add(
            "kube_dispatch_delivery_to_reconcile_seconds",
            "Time from a delivery's arrival to its reconcile's start",
            f.delivery_to_reconcile.clone(),
        );
        sink.add(
            "kube_dispatch_ready_to_reconcile_seconds",
            "Time from the key's becoming ready at the dispatcher to its reconcile's start",
            f.ready_to_reconcile.clone(),
        );
    }
}

/// Registers the SDK's metrics in `registry`, a registry the controller serves itself (on its
/// own endpoint, beside its own metrics): the same figures [`registry`] holds and
/// [`Controller::admin_listen`](crate::Controller::admin_listen) serves, under the same names.
/// The process metrics stay in [`registry`]: a controller with its own registry has its own.
/// Call it once per registry (prometheus-client does not merge families registered twice),
/// on a registry without a prefix: `Registry::with_prefix` would rename the metrics away from
/// controller-runtime's names, which dashboards and alerts look for.
///
/// ```
/// use prometheus_client::{metrics::counter::Counter, registry::Registry};
///
/// let widgets = Counter::<u64>::default();
/// let mut registry = Registry::default();
/// registry.register("my_widgets", "Widgets seen", widgets.clone()); // the controller's own
/// kube_dispatch_controller::metrics::register_into(&mut registry); // the SDK's, beside them
/// ```
pub fn register_into(registry: &mut Registry) {
    FAMILIES.register_into(registry);
}

/// How a reconcile ended, as controller-runtime's `result` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Success,
    Error,
    RequeueAfter,
    TimedOut,
}

/// Where the object a reconcile is given came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The request's body (or, for a deletion, what the request says).
    Request,
    /// The object as this replica last reconciled it, at the version the request names.
    Recent,
    /// A read from the API server.
    Read,
}

impl Source {
    const ALL: [Source; 3] = [Source::Request, Source::Recent, Source::Read];

    fn as_str(self) -> &'static str {
        match self {
            Source::Request => "request",
            Source::Recent => "recent",
            Source::Read => "read",
        }
    }
}

/// The reasons a delivery names (`Reason` numbers 1 to 9), as the `reason` label says them.
const REASONS: [&str; 9] = [
    "added",
    "modified",
    "deleted",
    "resync",
    "retry",
    "requeue",
    "owned",
    "referenced",
    "triggered",
];

/// The metrics of one controller, labelled once: counting a delivery or a reconcile takes no
/// lookup and no allocation. Records nothing when made [`ControllerMetrics::off`].
#[derive(Clone, Debug)]
pub(crate) struct ControllerMetrics(Option<Labelled>);

#[derive(Clone, Debug)]
struct Labelled {
    controller: String,
    /// `controller_runtime_reconcile_total` by result: success, error, requeue_after.
    success: Counter,
    error: Counter,
    requeue_after: Counter,
    errors: Counter,
    timeouts: Counter,
    fenced: Counter,
    reconnects: Counter,
    /// By [`REASONS`].
    deliveries: [Counter; 9],
    /// By [`Source::ALL`].
    loaded: [Counter; 3],
    active: Gauge,
    reconcile_time: Histogram,
    delivery_to_reconcile: Histogram,
    ready_to_reconcile: Histogram,
}

impl ControllerMetrics {
    pub(crate) fn new(controller: &str, concurrency: usize) -> Self {
        let f = &*FAMILIES;
        let label = ControllerLabel {
            controller: controller.to_owned(),
        };
        f.max_concurrent
            .get_or_create(&label)
            .set(i64::try_from(concurrency).unwrap_or(i64::MAX));
        let result = |result| {
            f.reconciles
                .get_or_create(&ResultLabels {
                    controller: controller.to_owned(),
                    result,
                })
                .clone()
        };
        // Present from the start, as controller-runtime's are; this SDK never requeues at
        // once, so `requeue` stays at zero.
        let _ = result("requeue");
        // Present from the start too: a dashboard sees a zero rather than nothing.
        let _ = f.stale_writes.get_or_create(&label);
        Self(Some(Labelled {
            controller: controller.to_owned(),
            success: result("success"),
            error: result("error"),
            requeue_after: result("requeue_after"),
            errors: f.errors.get_or_create(&label).clone(),
            timeouts: f.timeouts.get_or_create(&label).clone(),
            fenced: f.fenced.get_or_create(&label).clone(),
            reconnects: f.reconnects.get_or_create(&label).clone(),
            deliveries: REASONS.map(|reason| {
                f.deliveries
                    .get_or_create(&ReasonLabels {
                        controller: controller.to_owned(),
                        reason,
                    })
                    .clone()
            }),
            loaded: Source::ALL.map(|source| {
                f.loaded
                    .get_or_create(&SourceLabels {
                        controller: controller.to_owned(),
                        source: source.as_str(),
                    })
                    .clone()
            }),
            active: f.active.get_or_create(&label).clone(),
            reconcile_time: f.reconcile_time.get_or_create(&label).clone(),
            delivery_to_reconcile: f.delivery_to_reconcile.get_or_create(&label).clone(),
            ready_to_reconcile: f.ready_to_reconcile.get_or_create(&label).clone(),
        }))
    }

    /// Metrics that record nothing ([`crate::Controller::metrics`]).
    pub(crate) fn off() -> Self {
        Self(None)
    }

    /// Whether they record.
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// A delivery arrived (a reason never sent is not counted).
    pub(crate) fn delivered(&self, reason: Reason) {
        if let Some(counter) = self.0.as_ref().and_then(|m| {
            (reason as usize)
                .checked_sub(1)
                .and_then(|i| m.deliveries.get(i))
        }) {
            counter.inc();
        }
    }

    /// A reconcile was given an object from `source`.
    pub(crate) fn loaded(&self, source: Source) {
        if let Some(m) = &self.0 {
            m.loaded[source as usize].inc();
        }
    }

    /// A reconcile starts, `waited` after its delivery arrived and `at_dispatcher` after its key
    /// became ready there (when the dispatcher said); counts it active until the guard drops.
    pub(crate) fn started(&self, waited: Duration, at_dispatcher: Option<Duration>) -> Active<'_> {
        if let Some(m) = &self.0 {
            m.delivery_to_reconcile.observe(waited.as_secs_f64());
            if let Some(before) = at_dispatcher {
                m.ready_to_reconcile
                    .observe((before + waited).as_secs_f64());
            }
            m.active.inc();
        }
        Active(self.0.as_ref().map(|m| &m.active))
    }

    /// A reconcile ended after `took`.
    pub(crate) fn ended(&self, ended: Ended, took: Duration) {
        let Some(m) = &self.0 else {
            return;
        };
        match ended {
            Ended::Success => m.success.inc(),
            Ended::RequeueAfter => m.requeue_after.inc(),
            Ended::Error => {
                m.error.inc();
                m.errors.inc()
            }
            Ended::TimedOut => {
                m.error.inc();
                m.errors.inc();
                m.timeouts.inc()
            }
        };
        m.reconcile_time.observe(took.as_secs_f64());
    }

    /// A reconcile was cancelled because its session was lost.
    pub(crate) fn fenced(&self) {
        if let Some(m) = &self.0 {
            m.fenced.inc();
        }
    }

    /// A session with `dispatcher` opened; counted open until the guard drops, and its series
    /// removed once no session with that dispatcher is open (dispatchers come and go).
    pub(crate) fn session_opened(&self, dispatcher: &str) -> OpenSession {
        let Some(m) = &self.0 else {
            return OpenSession(None);
        };
        let labels = DispatcherLabels {
            controller: m.controller.clone(),
            dispatcher: dispatcher.to_owned(),
        };
        let gauge = FAMILIES.sessions.get_or_create(&labels).clone();
        gauge.inc();
        OpenSession(Some((gauge, labels)))
    }

    /// A session was lost and is opened again.
    pub(crate) fn reconnecting(&self) {
        if let Some(m) = &self.0 {
            m.reconnects.inc();
        }
    }
}

/// Counts a reconcile as active while it lives.
pub(crate) struct Active<'a>(Option<&'a Gauge>);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        if let Some(active) = self.0 {
            active.dec();
        }
    }
}

/// Counts a session as open while it lives.
pub(crate) struct OpenSession(Option<(Gauge, DispatcherLabels)>);

impl Drop for OpenSession {
    fn drop(&mut self) {
        // One session loop per dispatcher: the last one closing removes the series.
        if let Some((gauge, labels)) = &self.0
            && gauge.dec() <= 1
        {
            FAMILIES.sessions.remove(labels);
        }
    }
}

tokio::task_local! {
    /// The controller whose reconcile runs in this task, for metrics counted by free functions
    /// ([`crate::precondition`]).
    pub(crate) static CONTROLLER: String;
}

/// The counters of the requests the client of `controller` sends, by verb.
pub(crate) fn api_requests(controller: &str) -> crate::api_requests::RequestCounts {
    crate::api_requests::RequestCounts(crate::api_requests::Verb::ALL.map(|verb| {
        FAMILIES
            .api_requests
            .get_or_create(&VerbLabels {
                controller: controller.to_owned(),
                verb: verb.as_str(),
            })
            .clone()
    }))
}

/// A conditional write was refused as stale in the current reconcile.
pub(crate) fn stale_write() {
    let _ = CONTROLLER.try_with(|controller| {
        // Empty: the controller records no metrics.
        if controller.is_empty() {
            return;
        }
        FAMILIES
            .stale_writes
            .get_or_create(&ControllerLabel {
                controller: controller.clone(),
            })
            .inc();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that read the process-wide registry, which the others write to: under
    /// `cargo test` they share one process.
    static REGISTRY: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn metrics_switched_off_record_nothing() {
        let _alone = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        let reconcile = |m: &ControllerMetrics| {
            m.delivered(Reason::Added);
            let session = m.session_opened("dispatcher-0");
            let active = m.started(Duration::from_millis(1), Some(Duration::from_millis(600)));
            m.ended(Ended::Success, Duration::from_millis(2));
            m.fenced();
            m.reconnecting();
            drop((active, session));
        };
        // The controllers' series (not the process figures, which move by themselves).
        let series = || -> Vec<String> {
            registry()
                .encode()
                .lines()
                .filter(|l| l.contains("controller=\""))
                .map(str::to_owned)
                .collect()
        };
        let before = series();
        reconcile(&ControllerMetrics::off());
        assert_eq!(series(), before, "switched off, nothing is recorded");
        reconcile(&ControllerMetrics::new("switched-on", 4));
        let text = series().join("\n");
        assert!(
            text.contains(
                r#"controller_runtime_reconcile_total{controller="switched-on",result="success"} 1"#
            ),
            "{text}"
        );
        // 601 ms from ready to the reconcile's start: in the 1 s bucket, not the 0.5 s one.
        for (le, count) in [("0.5", 0), ("1.0", 1)] {
            let line = format!(
                r#"kube_dispatch_ready_to_reconcile_seconds_bucket{{le="{le}",controller="switched-on"}} {count}"#
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
    }

    #[test]
    fn a_controllers_own_registry_serves_the_same_figures() {
        let _alone = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        let mut own = Registry::default();
        register_into(&mut own);
        let encoded = |registry: &Registry| {
            let mut text = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut text, registry);
            text
        };
        let line =
            r#"controller_runtime_reconcile_total{controller="own-registry",result="success"} 1"#;
        assert!(!encoded(&own).contains(line));
        let metrics = ControllerMetrics::new("own-registry", 1);
        metrics.ended(Ended::Success, Duration::from_millis(3));
        let text = encoded(&own);
        assert!(text.contains(line), "{text}");
        // The SDK's own endpoint shows the same.
        assert!(registry().encode().contains(line));
    }
}
