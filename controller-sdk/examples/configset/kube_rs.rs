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
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{Controller, controller::Action, watcher};
use kube::{Api, Client};

use controller::{ConfigSet, Context, error_policy, reconcile};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let client = Client::try_default().await?;
    Controller::new(
        Api::<ConfigSet>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default(),
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
