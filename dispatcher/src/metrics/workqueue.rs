//! The `workqueue_*` family, under controller-runtime's names and meanings: one series per
//! group, labelled `name` and `controller` (both the group's name) and `owner`.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{CountOf, Described, FigureOf, Snapshot, queue_labels};

/// Encodes the family for each group of `snapshots`.
pub(super) fn encode(encoder: &mut DescriptorEncoder<'_>, snapshots: &[Snapshot]) -> fmt::Result {
    let queue_gauges: [Described<FigureOf<f64>>; 3] = [
        ("workqueue_depth", "Current depth of workqueue", |f| {
            f.queue.ready as f64
        }),
        (
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            |f| f.queue.unfinished.as_secs_f64(),
        ),
        (
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            |f| f.queue.longest.as_secs_f64(),
        ),
    ];
    for (name, help, value) in queue_gauges {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for s in snapshots {
            let labels = queue_labels(&s.id);
            ConstGauge::new(value(&s.figures)).encode(family.encode_family(&labels)?)?;
        }
    }
    let queue_counters: [Described<CountOf>; 2] = [
        (
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            |c| c.adds,
        ),
        (
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            |c| c.retries,
        ),
    ];
    for (name, help, value) in queue_counters {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for s in snapshots {
            let labels = queue_labels(&s.id);
            ConstCounter::new(value(&s.figures.queue.counts))
                .encode(family.encode_family(&labels)?)?;
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes: from a delivery to its acknowledgement",
            None,
            MetricType::Histogram,
        )?;
        for s in snapshots {
            s.work.encode(family.encode_family(&queue_labels(&s.id))?)?;
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested: from a key becoming ready to its delivery",
            None,
            MetricType::Histogram,
        )?;
        for s in snapshots {
            s.queued
                .encode(family.encode_family(&queue_labels(&s.id))?)?;
        }
    }

    Ok(())
}
