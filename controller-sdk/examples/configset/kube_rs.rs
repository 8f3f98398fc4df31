//! The same ConfigSet controller on plain kube-rs, with informer caches and no dispatcher: the
//! baseline that the SDK version (`main.rs`) is ported from, and that benchmarks compare it
//! with. `diff -u kube_rs.rs main.rs` is the porting guide in the SDK's README.
//!
//! ```sh
//! KUBECONFIG=.cluster/kubeconfig cargo run -p kube-dispatch-controller --example configset_kube_rs
//! ```
//!
//! Like any kube-rs controller it caches every ConfigSet and every ConfigMap of the cluster,
//! and only one replica may run (or leader election must be added).

mod controller;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::{Controller, controller::Action, reflector::ObjectRef, watcher};
use kube::{Api, Client, ResourceExt};

use controller::{ConfigSet, Context, error_policy, reconcile};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let client = Client::try_default().await?;
    let controller = Controller::new(
        Api::<ConfigSet>::all(client.clone()),
        watcher::Config::default(),
    );
    // The ConfigSets naming a Secret, from the controller's cache of every ConfigSet.
    let sets = controller.store();
    controller
        .owns(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
        )
        .watches(
            Api::<Secret>::all(client.clone()),
            watcher::Config::default(),
            move |secret| {
                sets.state()
                    .into_iter()
                    .filter(|set| {
                        set.namespace() == secret.namespace()
                            && set.spec.secret_name.as_deref() == Some(&secret.name_any())
                    })
                    .map(|set| ObjectRef::from_obj(&*set))
                    .collect::<Vec<_>>()
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|result| async move {
            match result {
                Ok((set, _)) => tracing::info!(configset = %set.name, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
    Ok(())
}
