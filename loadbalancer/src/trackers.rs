//! The tasks that feed the registry: the dispatchers from their Leases, and the expiry of
//! replicas that went away.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_dispatch_server::leases::LeaseWatch;
use tokio_util::sync::CancellationToken;

use crate::registry::Registry;

/// Keeps the registry's dispatchers equal to those with a live Lease and an address.
pub(crate) async fn track_dispatchers(
    leases: Api<Lease>,
    registry: Arc<Registry>,
    grace: Duration,
    stop: CancellationToken,
) {
    // Retried within a dispatcher's default renew period, so placement follows soon after a cut.
    let mut watch = LeaseWatch::new(leases, Duration::from_secs(3));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // The registry learns the dispatchers once the watch has listed: before, it knows none.
    let mut seen = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            more = watch.next() => if more { seen = true } else { return },
            _ = tick.tick() => {}
        }
        if !seen || watch.listing() {
            continue;
        }
        let live: BTreeMap<String, String> = watch
            .observations
            .live(Instant::now(), grace)
            .into_iter()
            .filter_map(|(name, peer)| peer.address.map(|a| (name, a)))
            .collect();
        registry.set_dispatchers(live);
    }
}

pub(crate) async fn expire_replicas(
    registry: Arc<Registry>,
    grace: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => registry.expire(Instant::now(), grace),
        }
    }
}
