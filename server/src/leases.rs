//! A watch of the dispatcher Leases of one namespace (those labelled
//! [`kube_dispatch_proto::lease::LEASE_LABEL`]), folded into
//! [`kube_dispatch_core::leases::Observations`]: what dispatchers judge membership on and what
//! the load balancer places replicas by.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, ResourceExt,
    runtime::{
        WatchStreamExt,
        utils::ResetTimerBackoff,
        watcher::{self, Event},
    },
};
use kube_dispatch_core::leases::{LeaseState, Observations};
use kube_dispatch_proto::lease::{
    self, ADDRESS_ANNOTATION, AWAITS_ANNOTATION, DRAINED_ANNOTATION, LEASE_LABEL,
    RELEASED_AFTER_ANNOTATION, RELEASED_ANNOTATION, RING_KEY_ANNOTATION, WARMING_ANNOTATION,
};
use tracing::warn;

/// A watch of the dispatcher Leases of one namespace, folded into [`Observations`].
pub struct LeaseWatch {
    events: futures::stream::BoxStream<'static, Result<Event<Lease>, watcher::Error>>,
    /// Names listed by a re-list in progress: those not listed again are gone.
    relisted: Option<BTreeSet<String>>,
    /// What the watch has shown so far.
    pub observations: Observations,
}

impl std::fmt::Debug for LeaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseWatch")
            .field("observations", &self.observations)
            .finish_non_exhaustive()
    }
}

impl LeaseWatch {
    /// Watches the dispatcher Leases (those labelled [`LEASE_LABEL`]) of `leases`, retrying
    /// after a failure with a backoff from 100 ms doubling to `max_backoff`.
    pub fn new(leases: Api<Lease>, max_backoff: Duration) -> Self {
        let selector = format!("{LEASE_LABEL}=true");
        let backoff = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(max_backoff)
            .with_jitter()
            .without_max_times();
        let events = watcher::watcher(leases, watcher::Config::default().labels(&selector))
            .backoff(ResetTimerBackoff::new(
                watcher::ExponentialBackoff::from(backoff),
                Duration::from_secs(60),
            ))
            .boxed();
        Self {
            events,
            relisted: None,
            observations: Observations::default(),
        }
    }

    /// Whether a list (the first, or a re-list after the watch could not resume) is under way:
    /// the Leases it has not shown yet are missing or stale, so the view is not whole.
    pub fn listing(&self) -> bool {
        self.relisted.is_some()
    }

    /// Waits for the next event and records it; false once the watch has ended.
    pub async fn next(&mut self) -> bool {
        let now = Instant::now;
        match self.events.next().await {
            Some(Ok(Event::Init)) => self.relisted = Some(BTreeSet::new()),
            Some(Ok(Event::InitApply(lease))) => {
                if let Some(names) = self.relisted.as_mut() {
                    names.insert(lease.name_any());
                }
                self.observations
                    .observe(&lease.name_any(), lease_state(&lease), now());
            }
            Some(Ok(Event::InitDone)) => {
                if let Some(names) = self.relisted.take() {
                    self.observations
                        .relisted(|name| names.contains(name), now());
                }
            }
            Some(Ok(Event::Apply(lease))) => {
                self.observations
                    .observe(&lease.name_any(), lease_state(&lease), now());
            }
            Some(Ok(Event::Delete(lease))) => {
                self.observations
                    .deleted(&lease.name_any(), Some(lease_state(&lease)), now());
            }
            Some(Err(e)) => warn!(error = %e, "watching dispatcher Leases failed; retrying"),
            None => return false,
        }
        self.observations.prune(now());
        true
    }
}

/// What `lease` says, as [`Observations`] records it.
pub fn lease_state(lease: &Lease) -> LeaseState {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseState {
        holder: spec.holder_identity.unwrap_or_default(),
        renew_time: spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default(),
        duration: Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15),
        ),
        released: lease.annotations().get(RELEASED_ANNOTATION).cloned(),
        released_after: lease
            .annotations()
            .get(RELEASED_AFTER_ANNOTATION)
            .and_then(|rv| rv.parse().ok()),
        address: lease.annotations().get(ADDRESS_ANNOTATION).cloned(),
        awaits: lease
            .annotations()
            .get(AWAITS_ANNOTATION)
            .and_then(|v| lease::parse_awaits(v)),
        ring_key: lease.annotations().get(RING_KEY_ANNOTATION).cloned(),
        drained: lease
            .annotations()
            .get(DRAINED_ANNOTATION)
            .is_some_and(|v| v == "true"),
        warming: lease
            .annotations()
            .get(WARMING_ANNOTATION)
            .is_some_and(|v| v == "true"),
        resource_version: lease
            .resource_version()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0),
        sessions: lease
            .annotations()
            .get(lease::SESSIONS_ANNOTATION)
            .and_then(|v| lease::parse_sessions(v)),
        ended: lease
            .annotations()
            .get(lease::ENDED_ANNOTATION)
            .map(|v| lease::parse_ended(v))
            .unwrap_or_default(),
        capabilities: lease
            .annotations()
            .get(lease::CAPABILITIES_ANNOTATION)
            .map(|v| lease::parse_capabilities(v))
            .unwrap_or_default(),
    }
}
