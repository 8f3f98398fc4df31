//! Ring membership from coordination.k8s.io Leases: each dispatcher holds a Lease named after
//! its identity and renews it; every dispatcher computes the ring from the Leases it sees
//! renewed.
//!
//! A member is live while its Lease has changed within its duration plus a grace, judged by when
//! *this* process last saw it change (as client-go's leader election does), never by comparing
//! the renew time written by another machine's clock with ours.
//!
//! Not wired into the dispatcher yet: changing the ring safely needs the handover between old
//! and new owners of a key, which comes next.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    },
};
use kube_dispatch_proto::Ring;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Label that marks a Lease as a kube-dispatch dispatcher's.
pub const LEASE_LABEL: &str = "kube-dispatch.dev/dispatcher";

/// What this process knows of the Leases it watches.
#[derive(Debug, Default)]
pub struct Observations {
    leases: HashMap<String, Seen>,
}

#[derive(Debug)]
struct Seen {
    /// Holder and renew time as last seen; a change of either is a renewal.
    marker: (String, String),
    duration: Duration,
    /// When this process saw the marker change.
    changed_at: Instant,
}

impl Observations {
    /// Records the state of Lease `name` as seen at `now`.
    pub fn observe(
        &mut self,
        name: &str,
        holder: &str,
        renew_time: &str,
        duration: Duration,
        now: Instant,
    ) {
        let marker = (holder.to_owned(), renew_time.to_owned());
        match self.leases.get_mut(name) {
            Some(seen) if seen.marker == marker => seen.duration = duration,
            _ => {
                self.leases.insert(
                    name.to_owned(),
                    Seen {
                        marker,
                        duration,
                        changed_at: now,
                    },
                );
            }
        }
    }

    /// Records that Lease `name` is gone (released).
    pub fn forget(&mut self, name: &str) {
        self.leases.remove(name);
    }

    /// Keeps only the Leases for which `keep` is true (after a re-list).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.leases.retain(|name, _| keep(name));
    }

    /// The members live at `now`: Leases with a holder that changed within their duration
    /// plus `grace`.
    pub fn live(&self, now: Instant, grace: Duration) -> BTreeSet<String> {
        self.leases
            .iter()
            .filter(|(_, s)| !s.marker.0.is_empty())
            .filter(|(_, s)| now.saturating_duration_since(s.changed_at) <= s.duration + grace)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// How this dispatcher takes part in membership.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Leases.
    pub namespace: String,
    /// This dispatcher's identity, the name of its Lease.
    pub identity: String,
    /// Lease duration written into the Lease.
    pub duration: Duration,
    /// How often the Lease is renewed; well under the duration.
    pub renew_period: Duration,
    /// Extra time before a silent member is dropped.
    pub grace: Duration,
}

/// Holds this dispatcher's Lease and publishes the ring of live members on `ring` until
/// `cancel`; then releases the Lease (deletes it) so the others drop this member at once.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    ring: watch::Sender<Arc<Ring>>,
    cancel: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client, &config.namespace);
    // Renewing in this task, not a spawned one, ties the Lease to this task's life: if it dies
    // the Lease stops being renewed, as when the process dies.
    let mut renew_tick = tokio::time::interval(config.renew_period);
    let selector = format!("{LEASE_LABEL}=true");
    let mut events = watcher::watcher(leases.clone(), watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    // Names listed by a re-list in progress: those not listed again are gone.
    let mut relisted: Option<BTreeSet<String>> = None;
    let mut observations = Observations::default();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut members: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = renew_tick.tick() => renew(&leases, &config).await,
            event = events.next() => match event {
                Some(Ok(Event::Init)) => relisted = Some(BTreeSet::new()),
                Some(Ok(Event::InitApply(lease))) => {
                    if let Some(names) = relisted.as_mut() {
                        names.insert(lease.name_any());
                    }
                    observe(&mut observations, &lease, Instant::now());
                }
                Some(Ok(Event::InitDone)) => {
                    if let Some(names) = relisted.take() {
                        observations.retain(|name| names.contains(name));
                    }
                }
                Some(Ok(Event::Apply(lease))) => observe(&mut observations, &lease, Instant::now()),
                Some(Ok(Event::Delete(lease))) => observations.forget(&lease.name_any()),
                Some(Err(e)) => warn!(error = %e, "watching dispatcher Leases failed; retrying"),
                None => break,
            },
            _ = tick.tick() => {}
        }
        let live = observations.live(Instant::now(), config.grace);
        if live != members {
            info!(members = ?live, "ring membership changed");
            members = live;
            ring.send_replace(Arc::new(Ring::new(members.iter().cloned())));
        }
    }
    match leases
        .delete(&config.identity, &DeleteParams::default())
        .await
    {
        Ok(_) => info!(lease = %config.identity, "released the dispatcher Lease"),
        Err(e) => {
            warn!(lease = %config.identity, error = %e, "could not release the dispatcher Lease; it expires by itself")
        }
    }
}

fn observe(observations: &mut Observations, lease: &Lease, now: Instant) {
    let spec = lease.spec.clone().unwrap_or_default();
    let renew = spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default();
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15));
    observations.observe(
        &lease.name_any(),
        spec.holder_identity.as_deref().unwrap_or_default(),
        &renew,
        duration,
        now,
    );
}

/// Writes this dispatcher's Lease with a fresh renew time (server-side apply).
async fn renew(leases: &Api<Lease>, config: &LeaseConfig) {
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": config.identity,
            "labels": { LEASE_LABEL: "true" },
        },
        "spec": {
            "holderIdentity": config.identity,
            "leaseDurationSeconds": config.duration.as_secs().max(1),
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
        },
    });
    let params = PatchParams::apply("kube-dispatch-dispatcher").force();
    if let Err(e) = leases
        .patch(&config.identity, &params, &Patch::Apply(&lease))
        .await
    {
        warn!(lease = %config.identity, error = %e, "renewing the dispatcher Lease failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_member_lives_while_its_lease_changes() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        o.observe("a", "a", "t1", 10 * SEC, t0);
        o.observe("b", "b", "t1", 10 * SEC, t0);
        assert_eq!(o.live(t0 + 10 * SEC, SEC).len(), 2);
        // a renews, b falls silent: seeing b's unchanged lease again does not renew it.
        o.observe("a", "a", "t2", 10 * SEC, t0 + 8 * SEC);
        o.observe("b", "b", "t1", 10 * SEC, t0 + 8 * SEC);
        let live = o.live(t0 + 12 * SEC, SEC);
        assert_eq!(live.into_iter().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn released_and_unheld_leases_are_not_members() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        o.observe("a", "", "t1", 10 * SEC, t0);
        o.observe("b", "b", "t1", 10 * SEC, t0);
        o.forget("b");
        assert!(o.live(t0, SEC).is_empty());
    }
}
