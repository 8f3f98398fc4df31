//! Leases as the tests watch them.

use std::{collections::BTreeMap, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::time::Instant;

/// The versions of the Lease `name` that a watch of it shows within `window`, by
/// resourceVersion: the first is the Lease as it stands when the watch starts, each later one a
/// write of it. Panics as soon as it has seen more than `most`, so that a write loop fails the
/// test at once rather than at the end of the window.
pub async fn lease_versions(
    leases: Api<Lease>,
    name: &str,
    window: Duration,
    most: usize,
) -> Result<BTreeMap<String, Lease>, watcher::Error> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(leases, config).applied_objects());
    let end = Instant::now() + window;
    let mut versions = BTreeMap::new();
    while let Ok(Some(lease)) = tokio::time::timeout_at(end, events.next()).await {
        let lease = lease?;
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        versions.insert(version, lease);
        assert!(
            versions.len() <= most,
            "{} versions of Lease {name} within {window:?}, more than the {most} its renewals \
             make: a write loop",
            versions.len()
        );
    }
    Ok(versions)
}
