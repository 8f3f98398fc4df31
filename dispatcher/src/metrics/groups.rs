//! kube-dispatch's own series per group (`kube_dispatch_group_*`), labelled `group` and
//! `owner`.

use std::fmt;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{
    CountOf, Described, FigureOf, OutcomeLabels, REASONS, ReasonLabels, Snapshot, group_label,
};

/// The gauges of each group: name, help, and the figure.
const GAUGES: [Described<FigureOf<usize>>; 13] = [
    ("kube_dispatch_group_keys", "Keys indexed", |f| f.queue.keys),
    (
        "kube_dispatch_group_in_flight",
        "Deliveries in flight",
        |f| f.queue.in_flight,
    ),
    (
        "kube_dispatch_group_delayed",
        "Keys backing off or waiting for a requeue",
        |f| f.queue.delayed,
    ),
    (
        "kube_dispatch_group_backing_off",
        "Keys backing off after a failed reconcile",
        |f| f.queue.backing_off,
    ),
    (
        "kube_dispatch_group_held_deletions",
        "Deletions held until a handover completes",
        |f| f.held,
    ),
    (
        "kube_dispatch_group_remembered_deletions",
        "Deletions of keys owned elsewhere, remembered for a handover",
        |f| f.remembered,
    ),
    (
        "kube_dispatch_group_held_changes",
        "Changes of keys a handover holds, delivered first when it ends",
        |f| f.held_changes,
    ),
    (
        "kube_dispatch_group_held_keys",
        "Keys a handover holds whose objects this dispatcher knows exist, so that a re-list shows their deletions",
        |f| f.held_keys,
    ),
    ("kube_dispatch_group_sessions", "Live sessions", |f| {
        f.sessions
    }),
    (
        "kube_dispatch_group_referrers",
        "Objects served here that name others at a referenced_by field path",
        |f| f.referrers,
    ),
    (
        "kube_dispatch_group_reference_bytes",
        "About the bytes of the index of what those objects name",
        |f| f.reference_bytes,
    ),
    (
        "kube_dispatch_group_body_bytes",
        "Bytes of object bodies held for ready keys, and kept from deliveries in groups with children or named objects",
        |f| f.queue.body_bytes,
    ),
    (
        "kube_dispatch_group_memo_bytes",
        "Bytes of memos acknowledgements left for their keys' next deliveries",
        |f| f.queue.memo_bytes,
    ),
];

/// The counters of each group beside deliveries and acknowledgements: name, help, and the count.
const COUNTERS: [Described<CountOf>; 3] = [
    (
        "kube_dispatch_group_expired_deliveries",
        "Deliveries not acknowledged within the maximum reconcile time",
        |c| c.expired,
    ),
    (
        "kube_dispatch_group_memos_refused",
        "Memos not kept: the group's memo budget or the process's memo pool was full",
        |c| c.memos_refused,
    ),
    (
        "kube_dispatch_group_changes_filtered",
        "Changes not delivered: the subscription's change filter (only_changes_of) found its parts unchanged",
        |c| c.changes_filtered,
    ),
];

/// Encodes the series for each group of `snapshots`.
pub(super) fn encode(encoder: &mut DescriptorEncoder<'_>, snapshots: &[Snapshot]) -> fmt::Result {
    for (name, help, value) in GAUGES {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for s in snapshots {
            let labels = group_label(&s.id);
            ConstGauge::new(value(&s.figures)).encode(family.encode_family(&labels)?)?;
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "kube_dispatch_group_oldest_ready_seconds",
            "How long the key ready the longest has waited for delivery",
            None,
            MetricType::Gauge,
        )?;
        for s in snapshots {
            ConstGauge::new(s.figures.queue.oldest_ready.as_secs_f64())
                .encode(family.encode_family(&group_label(&s.id))?)?;
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "kube_dispatch_group_deliveries",
            "Deliveries handed out, by reason",
            None,
            MetricType::Counter,
        )?;
        for s in snapshots {
            for (index, reason) in REASONS {
                let labels = ReasonLabels {
                    group: group_label(&s.id),
                    reason,
                };
                ConstCounter::new(s.figures.queue.counts.deliveries[index])
                    .encode(family.encode_family(&labels)?)?;
            }
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "kube_dispatch_group_acks",
            "Acknowledgements, by outcome",
            None,
            MetricType::Counter,
        )?;
        for s in snapshots {
            let c = &s.figures.queue.counts;
            for (outcome, value) in [
                ("success", c.acks_success),
                ("failure", c.acks_failure),
                ("requeue", c.acks_requeue),
                ("unknown", c.acks_unknown),
            ] {
                let labels = OutcomeLabels {
                    group: group_label(&s.id),
                    outcome,
                };
                ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    for (name, help, value) in COUNTERS {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for s in snapshots {
            let labels = group_label(&s.id);
            ConstCounter::new(value(&s.figures.queue.counts))
                .encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}
