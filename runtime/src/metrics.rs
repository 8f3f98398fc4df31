//! Prometheus metrics: one [`Registry`] per process, filled at start by each part of it and
//! served in the OpenMetrics text format at `/metrics` on the admin endpoint
//! ([`crate::admin`]).
//!
//! Every process also exports the process metrics Prometheus' own clients export under the
//! same names ([`ProcessMetrics`]): `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_threads` and
//! `process_start_time_seconds`, read from `/proc` at each scrape.
//!
//! Label cardinality is bounded by design: labels name controller groups, dispatchers, reasons
//! and outcomes, never a key, a uid or an object.

use std::sync::Arc;

pub use prometheus_client::registry::Registry;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// A registry with the process metrics in it, ready for a process's own.
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessMetrics));
    registry
}

/// Encodes `registry` in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry shared with the admin endpoint once every metric is registered.
pub type SharedRegistry = Arc<Registry>;

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
        let text = encode(&registry());
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
