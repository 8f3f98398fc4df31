//! The dispatcher's metrics, read from its groups at each scrape and served at `/metrics` on its
//! admin endpoint.
//!
//! Per controller group, the `workqueue_*` family under controller-runtime's names and meanings
//! (labels `name` and `controller`, both the group's name, as controller-runtime sets them,
//! and `owner`, the user the group belongs to: groups are scoped by identity, so two users'
//! groups of one name are two series), so dashboards built for controller-runtime's work
//! queues read the tier's:
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `workqueue_depth` | gauge | keys ready for delivery |
//! | `workqueue_adds_total` | counter | keys made ready (a change, a resync, a timer, a session that ended) |
//! | `workqueue_queue_duration_seconds` | histogram | from a key becoming ready to its delivery |
//! | `workqueue_retries_total` | counter | deliveries that failed (failure acks and deliveries past the maximum reconcile time) |
//! | `workqueue_work_duration_seconds` | histogram | from a delivery to its acknowledgement |
//! | `workqueue_unfinished_work_seconds` | gauge | time the deliveries in flight have been out, summed |
//! | `workqueue_longest_running_processor_seconds` | gauge | the longest any delivery in flight has been out |
//!
//! and kube-dispatch's own, labels `group` and `owner`:
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `kube_dispatch_group_keys` | gauge | keys indexed |
//! | `kube_dispatch_group_in_flight` | gauge | deliveries in flight |
//! | `kube_dispatch_group_delayed` | gauge | keys backing off or waiting for a requeue |
//! | `kube_dispatch_group_held_deletions` | gauge | deletions held until a handover completes |
//! | `kube_dispatch_group_remembered_deletions` | gauge | deletions of keys owned elsewhere, remembered for a handover |
//! | `kube_dispatch_group_held_changes` | gauge | changes of keys a handover holds, delivered first when it ends (at most 4096) |
//! | `kube_dispatch_group_held_keys` | gauge | keys a handover holds whose objects this dispatcher knows exist (the index of held keys), so that a re-list after a gap of the watch shows their deletions; at most one per key owned |
//! | `kube_dispatch_group_referrers` | gauge | objects served here that name others at a `referenced_by` field path |
//! | `kube_dispatch_group_reference_bytes` | gauge | about the bytes of the index of what they name (about 150 per reference) |
//! | `kube_dispatch_group_sessions` | gauge | live sessions |
//! | `kube_dispatch_group_body_bytes` | gauge | bytes of object bodies held for ready keys, and kept from deliveries in groups with children or named objects |
//! | `kube_dispatch_group_memo_bytes` | gauge | bytes of memos acknowledgements left for their keys' next deliveries |
//! | `kube_dispatch_group_oldest_ready_seconds` | gauge | how long the key ready the longest has waited for delivery (0 with none ready) |
//! | `kube_dispatch_group_deliveries_total` | counter | deliveries, by `reason` |
//! | `kube_dispatch_group_acks_total` | counter | acknowledgements, by `outcome` (`success`, `failure`, `requeue`, `unknown`) |
//! | `kube_dispatch_group_expired_deliveries_total` | counter | deliveries not acknowledged within the maximum reconcile time |
//! | `kube_dispatch_group_memos_refused_total` | counter | memos not kept: the group's `--memo-budget-bytes` or the process's `--max-memo-bytes` was full |
//! | `kube_dispatch_group_changes_filtered_total` | counter | changes not delivered: the subscription's change filter (`only_changes_of`) found the parts it compares unchanged |
//!
//! A group's series go when the group is dropped (after `--idle-group-grace` without sessions)
//! and its counters start again from zero if it comes back. No label names a key or an object.
//!
//! The dispatcher as a whole ([`RingMetrics`], and [`GroupTableCollector`] for the table):
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `kube_dispatch_ring_members` | gauge | members of the ring this dispatcher sees |
//! | `kube_dispatch_ring_changes_total` | counter | rings adopted |
//! | `kube_dispatch_ring_serving` | gauge | 1 while every key this dispatcher owns is served; 0 during a handover, when fenced (cut off from the API server) and when draining |
//! | `kube_dispatch_lease_renewals_total` | counter | writes of this dispatcher's Lease (each renews it), by `outcome`: `accepted`, `conflict` (written meanwhile: read and written again), `failed` (refused or unreachable), `timeout` (abandoned after the renew period) |
//! | `kube_dispatch_handover_seconds` | histogram | from adopting a ring to serving all of it |
//! | `kube_dispatch_groups` | gauge | controller groups held, idle ones included |
//! | `kube_dispatch_body_bytes` | gauge | bytes of object bodies held over all groups |
//! | `kube_dispatch_body_capacity_bytes` | gauge | the most they may hold (`--max-body-bytes`) |
//! | `kube_dispatch_bodies_shed_bytes_total` | counter | bytes of bodies dropped from groups over an even share of a short pool |
//! | `kube_dispatch_sessions` | gauge | live sessions |
//! | `kube_dispatch_expired_sessions_total` | counter | sessions that expired (their replica stopped polling) |
//!
//! Whole lists shared between the dispatchers (`crate::watch::sharing`), label `how`:
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `kube_dispatch_shared_lists_total` | counter | `made`: LISTs this dispatcher sent to the API server for its own watches and its peers' together; `joined`: requests answered by one of those already under way; `relayed`: peers' requests it answered; `from_peer`: its watches' lists read from a peer; `alone`: its watches' lists made alone, no lister able to share them (a ring keyed by name only); `too_old`: shared lists that its lists beside a watch's stream found older than the stream had shown, and left (for another, then alone) |
//!
//! Per watch (labels `resource` and `watch`, bounded by the subscriptions; `watch` is an opaque
//! id of the namespace and selectors, which a caller chooses and which may name an object, so
//! they stay off this unauthenticated endpoint: the log line `starting watch` maps one to the
//! other):
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `kube_dispatch_watch_events_total` | counter | objects seen, by `type` (`applied`, `deleted`) |
//! | `kube_dispatch_watch_protobuf_total` | counter | of the objects seen, those the API server sent in protobuf (`--protobuf`; the rest came in JSON) |
//! | `kube_dispatch_watch_json_fallbacks_total` | counter | times the watch turned to JSON because what the API server sent in protobuf could not be read through the dispatcher's table of types (a field it does not know: an API server newer than the dispatcher; or a proxy refusing protobuf) |
//! | `kube_dispatch_watch_relists_total` | counter | lists of the whole resource by the watch: its first, and after a 410 or an API-server restart |
//! | `kube_dispatch_watch_side_lists_total` | counter | lists beside the watch for keys newly served here, or newly held by a handover (to index them) |
//! | `kube_dispatch_watch_side_lists_spared_total` | counter | lists beside the watch not made when the keys served here grew, since every group had kept up with them: the dispatcher had handed nothing out since the watch's list (warming up to join, waiting out its previous process, fenced) |
//! | `kube_dispatch_watch_errors_total` | counter | errors the watch recovered from (by retrying; a 410 Gone by listing again at once) |
//! | `kube_dispatch_watch_gone_total` | counter | of those, 410 Gone: the resourceVersion it resumed from had expired |
//! | `kube_dispatch_watch_elsewhere_total` | counter | objects seen whose keys other dispatchers own: decoded for nothing but a deletion's memory (on a ring keyed by namespace with server-side sharding, near zero) |
//! | `kube_dispatch_watch_reshards_total` | counter | restarts of the watch because the namespaces this dispatcher owns changed (ring keyed by namespace) |
//! | `kube_dispatch_watch_names_left_out_total` | counter | objects that named more than 64 others at their group's `referenced_by` field paths: the names past it are not followed |
//! | `kube_dispatch_watch_children` | gauge | owned objects the watch indexes by their controlling owner, to tell an owner that loses a child |
//! | `kube_dispatch_watch_children_bytes` | gauge | about the bytes of that index (about 300 per owned object: key, uid, resourceVersion) |

use std::{
    fmt,
    sync::{
        Arc, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use kube_dispatch_core::{handover::Slice, queue::QueueCounts};
use kube_dispatch_server::auth::GroupId;
use kube_dispatch_telemetry::metrics::Metrics;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
    },
};

mod groups;

mod workqueue;

use crate::{
    group::GroupFigures,
    table::GroupTable,
    watch::{
        registry::{WatchCounts, WatchFigures},
        sharing::SharingCounts,
    },
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
    controller: String,
    owner: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabel {
    group: String,
    owner: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    #[prometheus(flatten)]
    group: GroupLabel,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    #[prometheus(flatten)]
    group: GroupLabel,
    outcome: &'static str,
}

/// Reads every group's figures at each scrape, from the table it was last pointed at (one per
/// term of the dispatcher: a drained dispatcher brought back serves a new table). Registered
/// once per process; clones point together. Holds the table weakly: a registry outliving its
/// dispatcher (tests) encodes nothing.
#[derive(Clone, Debug, Default)]
pub struct GroupTableCollector(Arc<std::sync::RwLock<Weak<GroupTable>>>);

impl GroupTableCollector {
    /// From now on, a collector of `groups`' metrics.
    pub fn point_at(&self, groups: &Arc<GroupTable>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(groups);
    }
}

/// A metric's name, help and how to read its value.
type Described<F> = (&'static str, &'static str, F);
type FigureOf<T> = fn(&GroupFigures) -> T;
type CountOf = fn(&QueueCounts) -> u64;
type WatchCounter = fn(&WatchCounts) -> &AtomicU64;

struct Snapshot {
    id: GroupId,
    figures: GroupFigures,
    work: Histogram,
    queued: Histogram,
}

const REASONS: [(usize, &str); 9] = [
    (1, "added"),
    (2, "modified"),
    (3, "deleted"),
    (4, "resync"),
    (5, "retry"),
    (6, "requeue"),
    (7, "owned"),
    (8, "referenced"),
    (9, "triggered"),
];

impl Collector for GroupTableCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let current = self.0.read().unwrap_or_else(|e| e.into_inner()).upgrade();
        let Some(groups) = current else {
            return Ok(());
        };
        let snapshots: Vec<Snapshot> = groups
            .all()
            .iter()
            .map(|g| Snapshot {
                id: g.id.clone(),
                figures: g.figures(),
                work: g.work_duration.clone(),
                queued: g.queue_duration.clone(),
            })
            .collect();
        let watches = groups.watch_figures();
        let sharing = groups.sharing().cloned();
        let table = [
            (
                "kube_dispatch_groups",
                "Controller groups held, idle ones included",
                MetricType::Gauge,
                groups.group_count() as u64,
            ),
            (
                "kube_dispatch_body_bytes",
                "Bytes of object bodies held over all groups (the body pool)",
                MetricType::Gauge,
                groups.settings().bodies.used() as u64,
            ),
            (
                "kube_dispatch_body_capacity_bytes",
                "Most bytes of object bodies all groups together may hold (--max-body-bytes)",
                MetricType::Gauge,
                groups.settings().bodies.capacity() as u64,
            ),
            (
                "kube_dispatch_bodies_shed_bytes",
                "Bytes of bodies dropped from groups over an even share of a short body pool",
                MetricType::Counter,
                groups.counters.shed_body_bytes.load(Ordering::Relaxed),
            ),
            (
                "kube_dispatch_sessions",
                "Live sessions",
                MetricType::Gauge,
                groups.session_count() as u64,
            ),
            (
                "kube_dispatch_expired_sessions",
                "Sessions that expired: their replica stopped polling",
                MetricType::Counter,
                groups.counters.expired_sessions.load(Ordering::Relaxed),
            ),
        ];
        drop(groups);
        for (name, help, kind, value) in table {
            let metric = encoder.encode_descriptor(name, help, None, kind)?;
            if kind == MetricType::Counter {
                ConstCounter::new(value).encode(metric)?;
            } else {
                ConstGauge::new(value).encode(metric)?;
            }
        }
        encode_watches(&mut encoder, &watches)?;
        if let Some(sharing) = &sharing {
            encode_sharing(&mut encoder, &sharing.counts)?;
        }

        workqueue::encode(&mut encoder, &snapshots)?;
        groups::encode(&mut encoder, &snapshots)?;
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SharingLabels {
    how: &'static str,
}

/// `kube_dispatch_shared_lists_total`, by how each list was had.
fn encode_sharing(encoder: &mut DescriptorEncoder<'_>, counts: &SharingCounts) -> fmt::Result {
    let mut family = encoder.encode_descriptor(
        "kube_dispatch_shared_lists",
        "Whole lists shared between the dispatchers, by how: made here for several readers, joined here, relayed to a peer, read from a peer, made alone, or left by a list beside a stream newer than it",
        None,
        MetricType::Counter,
    )?;
    for (how, counter) in [
        ("made", &counts.made),
        ("joined", &counts.joined),
        ("relayed", &counts.relayed),
        ("from_peer", &counts.from_peers),
        ("alone", &counts.alone),
        ("too_old", &counts.too_old),
    ] {
        ConstCounter::new(counter.load(Ordering::Relaxed))
            .encode(family.encode_family(&SharingLabels { how })?)?;
    }
    Ok(())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    resource: String,
    watch: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchEventLabels {
    #[prometheus(flatten)]
    watch: WatchLabels,
    r#type: &'static str,
}

/// The watches' counters, each a family with a series per watch.
const WATCH_COUNTERS: [Described<WatchCounter>; 10] = [
    (
        "kube_dispatch_watch_protobuf",
        "Objects seen that the API server sent in protobuf",
        |c| &c.protobuf,
    ),
    (
        "kube_dispatch_watch_json_fallbacks",
        "Times the watch turned to JSON because what the API server sent in protobuf could not be read through the dispatcher's table of types",
        |c| &c.json_fallbacks,
    ),
    (
        "kube_dispatch_watch_names_left_out",
        "Objects that named more than 64 others at their group's referenced_by field paths (those past it are not followed)",
        |c| &c.names_left_out,
    ),
    (
        "kube_dispatch_watch_relists",
        "Lists of the whole resource by the watch: its first, and after a 410 or an API-server restart",
        |c| &c.relists,
    ),
    (
        "kube_dispatch_watch_side_lists",
        "Lists beside the watch for keys newly served here, or newly held by a handover (to index them)",
        |c| &c.side_lists,
    ),
    (
        "kube_dispatch_watch_side_lists_spared",
        "Lists beside the watch not made when the keys served here grew: the groups had kept up with them",
        |c| &c.side_lists_spared,
    ),
    (
        "kube_dispatch_watch_errors",
        "Errors the watch recovered from, by retrying or, after a 410 Gone, by listing again",
        |c| &c.errors,
    ),
    (
        "kube_dispatch_watch_gone",
        "Watch errors that were 410 Gone: the resourceVersion it resumed from had expired",
        |c| &c.gone,
    ),
    (
        "kube_dispatch_watch_elsewhere",
        "Objects seen whose keys other dispatchers own",
        |c| &c.elsewhere,
    ),
    (
        "kube_dispatch_watch_reshards",
        "Restarts of the watch because the namespaces this dispatcher owns changed",
        |c| &c.reshards,
    ),
];

fn encode_watches(encoder: &mut DescriptorEncoder<'_>, watches: &[WatchFigures]) -> fmt::Result {
    let labels = |w: &WatchFigures| WatchLabels {
        resource: w.resource.clone(),
        watch: w.id.clone(),
    };
    {
        let mut family = encoder.encode_descriptor(
            "kube_dispatch_watch_events",
            "Objects the watch saw, by type",
            None,
            MetricType::Counter,
        )?;
        for w in watches {
            for (kind, value) in [
                ("applied", &w.counts.applied),
                ("deleted", &w.counts.deleted),
            ] {
                let labels = WatchEventLabels {
                    watch: labels(w),
                    r#type: kind,
                };
                ConstCounter::new(value.load(Ordering::Relaxed))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
    }
    for (name, help, counter) in WATCH_COUNTERS {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for w in watches {
            ConstCounter::new(counter(&w.counts).load(Ordering::Relaxed))
                .encode(family.encode_family(&labels(w))?)?;
        }
    }
    let gauges: [Described<WatchCounter>; 2] = [
        (
            "kube_dispatch_watch_children",
            "Owned objects the watch indexes by their controlling owner",
            |c| &c.children,
        ),
        (
            "kube_dispatch_watch_children_bytes",
            "About the bytes of the watch's index of owned objects (about 300 per object)",
            |c| &c.children_bytes,
        ),
    ];
    for (name, help, gauge) in gauges {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for w in watches {
            let value = i64::try_from(gauge(&w.counts).load(Ordering::Relaxed)).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(family.encode_family(&labels(w))?)?;
        }
    }
    Ok(())
}

fn queue_labels(id: &GroupId) -> QueueLabels {
    QueueLabels {
        name: id.name.clone(),
        controller: id.name.clone(),
        owner: id.owner.clone().unwrap_or_default(),
    }
}

fn group_label(id: &GroupId) -> GroupLabel {
    GroupLabel {
        group: id.name.clone(),
        owner: id.owner.clone().unwrap_or_default(),
    }
}

/// The ring as this dispatcher lives it: members, changes, how long each handover took to
/// settle, and whether it serves. Kept by the one task that follows the slice (one per term of
/// the dispatcher, each with a clone of the metrics registered once for the process: clones
/// report into the same series).
#[derive(Clone, Debug)]
pub struct RingMetrics {
    members: Gauge,
    changes: Counter,
    serving: Gauge,
    handover: Histogram,
    /// The members of the ring last adopted.
    ring: Vec<String>,
    /// When it was adopted, while its handover is pending.
    adopted: Option<Instant>,
}

impl RingMetrics {
    /// Ring metrics registered in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let ring = Self {
            members: Gauge::default(),
            changes: Counter::default(),
            serving: Gauge::default(),
            handover: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            ring: Vec::new(),
            adopted: None,
        };
        metrics.register(
            "kube_dispatch_ring_members",
            "Members of the ring this dispatcher sees",
            ring.members.clone(),
        );
        metrics.register(
            "kube_dispatch_ring_changes",
            "Rings adopted",
            ring.changes.clone(),
        );
        metrics.register(
            "kube_dispatch_ring_serving",
            "1 while every key this dispatcher owns is served; 0 during a handover, when fenced and when draining",
            ring.serving.clone(),
        );
        metrics.register(
            "kube_dispatch_handover_seconds",
            "From adopting a ring to serving all of it",
            ring.handover.clone(),
        );
        ring
    }

    /// Records the slice as it is `now`.
    pub fn observe(&mut self, slice: &Slice, now: Instant) {
        let members = slice.ring.members();
        self.members
            .set(i64::try_from(members.len()).unwrap_or(i64::MAX));
        self.serving.set(i64::from(slice.is_settled()));
        // An empty ring is none at all (no Lease seen yet): not a ring adopted.
        if !members.is_empty() && self.ring != members {
            if !self.ring.is_empty() {
                self.changes.inc();
            }
            self.ring = members.to_vec();
            self.adopted = Some(now);
        }
        if slice.is_settled()
            && let Some(adopted) = self.adopted.take()
        {
            self.handover
                .observe(now.saturating_duration_since(adopted).as_secs_f64());
        }
    }

    /// Serves nothing from now on (draining).
    pub fn closed(&self) {
        self.serving.set(0);
    }
}
