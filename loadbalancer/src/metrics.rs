//! The load balancer's metrics, read from its registry at each scrape and served at `/metrics`
//! on its admin endpoint.
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `kube_dispatch_lb_leader` | gauge | 1 while this replica leads (places replicas), 0 while it stands by |
//! | `kube_dispatch_lb_replicas` | gauge | controller replicas registered |
//! | `kube_dispatch_lb_groups` | gauge | controller groups with a replica registered |
//! | `kube_dispatch_lb_dispatchers` | gauge | live dispatchers known |
//! | `kube_dispatch_lb_assignments_total` | counter | assignments sent to replicas |
//! | `kube_dispatch_lb_moves_total` | counter | of those, changes to an assignment already made |
//!
//! The registry is the leader's: a standby reports zeros.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};
use tokio::sync::watch;

use crate::registry::Registry;

/// Reads the registry and leadership at each scrape.
#[derive(Debug)]
pub struct RegistryCollector {
    registry: Arc<Registry>,
    leading: watch::Receiver<bool>,
}

impl RegistryCollector {
    /// A collector of `registry`, which leads while `leading` says so.
    pub fn new(registry: Arc<Registry>, leading: watch::Receiver<bool>) -> Self {
        Self { registry, leading }
    }
}

impl Collector for RegistryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let f = self.registry.figures();
        let leader = u64::from(*self.leading.borrow());
        for (name, help, value) in [
            (
                "kube_dispatch_lb_leader",
                "1 while this replica leads, 0 while it stands by",
                leader,
            ),
            (
                "kube_dispatch_lb_replicas",
                "Controller replicas registered",
                f.replicas as u64,
            ),
            (
                "kube_dispatch_lb_groups",
                "Controller groups with a replica registered",
                f.groups as u64,
            ),
            (
                "kube_dispatch_lb_dispatchers",
                "Live dispatchers known",
                f.dispatchers as u64,
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        for (name, help, value) in [
            (
                "kube_dispatch_lb_assignments",
                "Assignments sent to replicas",
                f.assignments,
            ),
            (
                "kube_dispatch_lb_moves",
                "Changes to an assignment already made: a replica's dispatchers moved",
                f.moves,
            ),
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)?;
        }
        Ok(())
    }
}
