//! The checker: a controller replica on the SDK that records every reconcile in the journal,
//! and the journal's keys and versions of the objects it reconciles.

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube_dispatch_controller::{Action, Controller};

use super::TTL;
use crate::{Cluster, FixtureError, Widget, isolated::Isolated, journal::Journal};

pub(super) fn key<K: Resource<DynamicType = ()>>(kind: &str, obj: &K) -> String {
    format!(
        "{kind}/{}/{}",
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default()
    )
}

pub(super) fn rv<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
pub(super) struct Never;

pub(super) struct Checker {
    pub(super) journal: Journal,
    pub(super) replica: String,
}

pub(super) async fn record<K: Resource<DynamicType = ()>>(
    kind: &str,
    obj: &K,
    checker: &Checker,
) -> Result<Action, Never> {
    let _running = checker.journal.start_reconcile(
        key(kind, obj),
        rv(obj),
        obj.meta().deletion_timestamp.is_some(),
        &checker.replica,
    );
    // A little work, so reconciles overlap in time when exclusivity breaks.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Action::await_change())
}

/// A controller replica running two groups on the SDK: ConfigMaps, and Widgets owning
/// ConfigMaps, both selected by `label`, recording every reconcile in `journal`.
pub(super) fn start_checker(
    replica: &str,
    label: &str,
    load_balancer: std::net::SocketAddr,
    journal: &Journal,
) -> Result<Isolated, FixtureError> {
    let (replica, label, journal) = (replica.to_owned(), label.to_owned(), journal.clone());
    let name = replica.clone();
    Isolated::spawn(&name, move |shutdown| async move {
        let client = match Cluster::shared().client().await {
            Ok(c) => c,
            Err(e) => panic!("chaos replica has no client: {e}"),
        };
        let checker = Arc::new(Checker {
            journal,
            replica: replica.clone(),
        });
        let lb = load_balancer.to_string();
        let configmaps = Controller::<ConfigMap>::new(client.clone(), "chaos-configmaps")
            .labels(label.clone())
            .load_balancer(lb.clone())
            .credentials(crate::credentials())
            .replica_id(replica.clone())
            .concurrency(8)
            .session_ttl(TTL)
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                |cm, c: Arc<Checker>| async move { record("ConfigMap", &*cm, &c).await },
                |_, _: &Never, _| Action::await_change(),
                checker.clone(),
            )
            .for_each(|_| async {});
        let widgets = Controller::<Widget>::new(client, "chaos-widgets")
            .labels(label)
            .owns::<ConfigMap>()
            .load_balancer(lb)
            .credentials(crate::credentials())
            .replica_id(replica)
            .concurrency(8)
            .session_ttl(TTL)
            .graceful_shutdown_on(shutdown.cancelled_owned())
            .run(
                |w, c: Arc<Checker>| async move { record("Widget", &*w, &c).await },
                |_, _: &Never, _| Action::await_change(),
                checker,
            )
            .for_each(|_| async {});
        futures::join!(configmaps, widgets);
    })
}
