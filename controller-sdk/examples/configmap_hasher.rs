//! The smallest useful controller: keeps a content hash annotation on every ConfigMap.
//!
//! Against the local control plane (`make cluster-up`, which also makes a serving certificate and
//! a token of a test identity) and one dispatcher, over TLS:
//!
//! ```sh
//! cargo run -p kube-dispatch-dispatcher -- --id dispatcher-0 --kubeconfig .cluster/kubeconfig --listen 127.0.0.1:7070 \
//!   --tls-cert-file .cluster/pki/kube-dispatch.crt --tls-key-file .cluster/pki/kube-dispatch.key \
//!   --tls-ca-file .cluster/pki/ca.crt --token-file .cluster/tokens/tester.token &
//! KUBECONFIG=.cluster/kubeconfig KD_TLS_CA_FILE=.cluster/pki/ca.crt KD_TOKEN_FILE=.cluster/tokens/tester.token \
//!   cargo run -p kube-dispatch-controller --example configmap_hasher -- 127.0.0.1:7070
//! kubectl --kubeconfig .cluster/kubeconfig apply -f controller-sdk/examples/configmap_hasher.yaml
//! kubectl --kubeconfig .cluster/kubeconfig get configmap hasher-demo -o yaml   # see the annotation
//! ```
//!
//! Run a second copy with another `POD_NAME` to see two replicas share the ConfigMaps. Set
//! `KD_WATCH_NAMESPACE` to reconcile one namespace only: the tier then asks only that the
//! replica's identity may `list` and `watch` ConfigMaps there.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, ResourceExt};
use kube_dispatch_controller::{
    Action, Controller,
    precondition::{self, WriteError},
    traces,
};
use sha2::{Digest, Sha256};

const ANNOTATION: &str = "example.kube-dispatch.dev/content-hash";

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("cannot annotate the ConfigMap: {0}")]
    Write(#[from] WriteError),
}

struct Context {
    client: Client,
}

fn content_hash(cm: &ConfigMap) -> String {
    let mut hasher = Sha256::new();
    // BTreeMaps iterate in key order, so equal content gives an equal hash.
    for (k, v) in cm.data.iter().flatten() {
        hasher.update(k.as_bytes());
        hasher.update([0]);
        hasher.update(v.as_bytes());
        hasher.update([0]);
    }
    format!("{:x}", hasher.finalize())
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, Error> {
    if cm.metadata.deletion_timestamp.is_some() {
        // Deleted: nothing of ours to clean up.
        return Ok(Action::await_change());
    }
    let hash = content_hash(&cm);
    if cm.annotations().get(ANNOTATION) == Some(&hash) {
        return Ok(Action::await_change());
    }
    let api: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: hash } } });
    // Only if the ConfigMap is still as this reconcile was given it: a hash of older content
    // must never land after a newer one.
    match precondition::patch(&api, &cm, patch).await {
        // Changed since: the change is delivered again, and that reconcile annotates.
        Err(e) if e.is_stale() => return Ok(Action::await_change()),
        result => result?,
    };
    tracing::info!(configmap = %cm.name_any(), "annotated");
    Ok(Action::await_change())
}

fn error_policy(_cm: Arc<ConfigMap>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // KD_LOG_JSON=1: JSON lines, with a line when each reconcile span opens and closes (its
    // key, resourceVersion and dispatcher), which `make demo` reads to check exclusivity.
    // OTEL_EXPORTER_OTLP_ENDPOINT: export spans over OTLP; each reconcile span continues the
    // trace of the dispatcher's span for the change that caused it.
    use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = if std::env::var_os("KD_LOG_JSON").is_some() {
        tracing_subscriber::fmt::layer()
            .json()
            .with_span_events(
                tracing_subscriber::fmt::format::FmtSpan::NEW
                    | tracing_subscriber::fmt::format::FmtSpan::CLOSE,
            )
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().boxed()
    };
    let (otlp, _traces) = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => {
            let (layer, traces) = traces::otlp_layer(&endpoint, "configmap-hasher")?;
            (Some(layer), traces)
        }
        _ => (None, traces::Traces::default()),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otlp)
        .init();
    // Dispatcher addresses on the command line poll those; none asks the load balancer
    // (KD_LOADBALANCER, else the in-cluster default).
    let dispatchers: Vec<String> = std::env::args().skip(1).collect();
    let client = Client::try_default().await?;
    let mut controller = Controller::<ConfigMap>::new(client.clone(), "configmap-hasher");
    if let Some(namespace) = std::env::var("KD_WATCH_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
    {
        controller = controller.namespace(namespace);
    }
    controller
        .dispatchers(dispatchers)
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::warn!(error = %e, "reconcile failed");
            }
        })
        .await;
    Ok(())
}
