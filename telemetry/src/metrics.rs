//! Prometheus metrics: one [`Metrics`] registry per process, which each part of it registers
//! its metrics in, served in the OpenMetrics text format at `/metrics` on the admin endpoint
//! ([`crate::admin`]).
//!
//! Every process also exports the process metrics Prometheus' own clients export under the
//! same names ([`ProcessMetrics`]): `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_threads` and
//! `process_start_time_seconds`, read from `/proc` at each scrape; and
//! `kube_dispatch_build_info{version,commit}`, always 1: the release the process was built from,
//! and its commit when the build said it (what the mixed-versions alert compares across the
//! tier).
//!
//! Label cardinality is bounded by design: labels name controller groups, dispatchers, reasons
//! and outcomes, never a key, a uid or an object.

use std::sync::{Arc, Mutex, OnceLock};

use tracing::warn;

use prometheus_client::{
    collector::Collector,
    encoding::EncodeLabelSet,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    metrics::{counter::Counter, family::Family, info::Info},
    registry::{Metric, Registry},
};

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A process's metrics registry; cheap to clone, every clone is the same registry.
#[derive(Clone, Debug)]
pub struct Metrics(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    registry: Mutex<Registry>,
    /// The one count of refused calls and connections, made when first asked for.
    refusals: OnceLock<Refusals>,
}

impl Default for Metrics {
    /// A registry with the process metrics in it.
    fn default() -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessMetrics));
        registry.register(
            "kube_dispatch_build",
            "The release this process was built from",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", option_env!("KD_GIT_COMMIT").unwrap_or_default()),
            ]),
        );
        Self(Arc::new(Inner {
            registry: Mutex::new(registry),
            refusals: OnceLock::new(),
        }))
    }
}

impl Metrics {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The process's count of refusals by its bounds (`kube_dispatch_refused_total`),
    /// registered here when first asked for; every server of the process shares it.
    pub fn refusals(&self) -> Refusals {
        self.0
            .refusals
            .get_or_init(|| Refusals::register(self))
            .clone()
    }

    /// Registers `metric` (a counter, gauge, histogram or a family of them) as `name`. A
    /// counter's name takes `_total` when encoded.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry().register(name, help, metric);
    }

    /// Registers `collector`, asked for its metrics at each scrape.
    pub fn register_collector(&self, collector: impl Collector) {
        self.registry().register_collector(Box::new(collector));
    }

    /// The metrics now, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry());
        text
    }
}

/// Longest a refusal of one bound for one peer or identity stays unlogged after the first.
pub const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// Most peers and identities whose last refusal log is remembered.
const LOG_MEMORY: u64 = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabel {
    bound: &'static str,
}

/// Counts and logs the refusals of a process's bounds: `kube_dispatch_refused_total{bound}`,
/// and a warning once per bound and peer (or identity) every [`LOG_EVERY`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Refusals {
    counts: Family<BoundLabel, Counter>,
    logged: moka::sync::Cache<(&'static str, String), ()>,
}

impl Refusals {
    /// Refusals counted in `metrics`; [`Metrics::refusals`] makes the one of a process.
    fn register(metrics: &Metrics) -> Self {
        let counts = Family::<BoundLabel, Counter>::default();
        metrics.register(
            "kube_dispatch_refused",
            "Calls and connections refused because a bound was reached, by bound",
            counts.clone(),
        );
        Self::with(counts)
    }

    /// Refusals counted nowhere (tests, and servers built without a registry).
    pub fn unregistered() -> Self {
        Self::with(Family::default())
    }

    fn with(counts: Family<BoundLabel, Counter>) -> Self {
        Self {
            counts,
            logged: moka::sync::Cache::builder()
                .max_capacity(LOG_MEMORY)
                .time_to_live(LOG_EVERY)
                .build(),
        }
    }

    /// Counts one refusal by `bound` of `who` (a peer address or an identity), and logs it
    /// with `detail` unless it was logged lately.
    pub fn refused(&self, bound: &'static str, who: &str, detail: &str) {
        self.counts.get_or_create(&BoundLabel { bound }).inc();
        let key = (bound, who.to_owned());
        if self.logged.contains_key(&key) {
            return;
        }
        self.logged.insert(key, ());
        warn!(
            bound,
            who,
            detail,
            "refused: a bound was reached (logged once per {LOG_EVERY:?} for this bound and peer)"
        );
    }

    /// How many refusals `bound` has counted.
    pub fn count(&self, bound: &'static str) -> u64 {
        self.counts.get_or_create(&BoundLabel { bound }).get()
    }
}

/// The process metrics of Prometheus' client libraries, read from `/proc/self` at each scrape.
/// A figure that cannot be read is left out of that scrape.
#[derive(Debug, Clone, Copy)]
pub struct ProcessMetrics;

impl Collector for ProcessMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Ok(me) = procfs::process::Process::myself() else {
            return Ok(());
        };
        let ticks = procfs::ticks_per_second() as f64;
        if let Ok(stat) = me.stat() {
            let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / ticks);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                cpu.metric_type(),
            )?)?;
            let page = procfs::page_size();
            for (name, help, value) in [
                (
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    stat.rss.saturating_mul(page),
                ),
                (
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                    stat.vsize,
                ),
            ] {
                let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
            let threads = ConstGauge::new(stat.num_threads);
            threads.encode(encoder.encode_descriptor(
                "process_threads",
                "Number of OS threads in the process.",
                None,
                threads.metric_type(),
            )?)?;
            if let Ok(boot) = procfs::boot_time_secs() {
                let started = ConstGauge::new(boot as f64 + stat.starttime as f64 / ticks);
                started.encode(encoder.encode_descriptor(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    None,
                    started.metric_type(),
                )?)?;
            }
        }
        if let Ok(fds) = me.fd_count() {
            let fds = ConstGauge::new(i64::try_from(fds).unwrap_or(i64::MAX));
            fds.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                fds.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_metrics_have_the_client_libraries_names() {
        let text = Metrics::default().encode();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_threads ",
            "process_start_time_seconds ",
            "process_open_fds ",
        ] {
            assert!(
                text.contains(&format!("\n{name}")),
                "{name} missing:\n{text}"
            );
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(rss > 1_000_000.0, "{rss}");
        assert!(text.ends_with("# EOF\n"));
    }
}
