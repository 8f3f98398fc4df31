//! A realistic controller on the SDK: `ConfigSet`, a custom resource owning N ConfigMaps and
//! naming a Secret. Shows `owns` (its requests carry its children, so it lists none),
//! `references` (a change to the named Secret reconciles it, with no cache and no mapper),
//! status updates and requeue. Ported from `kube_rs.rs`; `diff -u kube_rs.rs
//! main.rs` is the porting guide in the SDK's README.
//!
//! Against the local control plane (`make cluster-up`) and one dispatcher:
//!
//! ```sh
//! kubectl --kubeconfig .cluster/kubeconfig apply -f controller-sdk/examples/configset/crd.yaml
//! cargo run -p kube-dispatch-dispatcher -- --id dispatcher-0 --kubeconfig .cluster/kubeconfig --listen 127.0.0.1:7070 \
//!   --tls-cert-file .cluster/pki/kube-dispatch.crt --tls-key-file .cluster/pki/kube-dispatch.key \
//!   --tls-ca-file .cluster/pki/ca.crt --token-file .cluster/tokens/tester.token &
//! KUBECONFIG=.cluster/kubeconfig KD_TLS_CA_FILE=.cluster/pki/ca.crt KD_TOKEN_FILE=.cluster/tokens/tester.token \
//!   cargo run -p kube-dispatch-controller --example configset -- 127.0.0.1:7070
//! kubectl --kubeconfig .cluster/kubeconfig apply -f controller-sdk/examples/configset/configset.yaml
//! kubectl --kubeconfig .cluster/kubeconfig get configsets,configmaps -l example.kube-dispatch.dev/configset
//! ```
//!
//! Any number of replicas may run; each holds no cache.

mod controller;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube_dispatch_controller::{Action, Controller};

use controller::{ConfigSet, Context, error_policy, reconcile};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let client = Client::try_default().await?;
    // Dispatcher addresses on the command line poll those; none asks the load balancer
    // (KD_LOADBALANCER, else the in-cluster default).
    let dispatchers: Vec<String> = std::env::args().skip(1).collect();
    let controller = Controller::<ConfigSet>::new(client, "configset");
    // The controller's client counts what the reconciler asks of the API server.
    let client = controller.client();
    controller
        .owns::<ConfigMap>()
        .references::<Secret>(["spec.secretName"])
        .dispatchers(dispatchers)
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
