//! Two controllers written as kube-rs's guide writes them, ported to the SDK by changing their
//! imports and builder calls (`diff bundles_kube_rs.rs bundles.rs`, `diff mirrors_kube_rs.rs
//! mirrors.rs`; `tests/check-ports.sh` keeps each within ten lines), run in one process as an
//! operator runs its controllers:
//!
//! - `bundles` (Bundle): owned ConfigMaps listed by label and written by server-side apply, a
//!   status by server-side apply, a check every minute;
//! - `mirrors` (Mirror): a finalizer through `finalizer()`, events through a `Recorder`, the
//!   ConfigMap it names followed through a mark and `references`.
//!
//! Each is a controller group of its own on the tier (`bundles`, `mirrors`); any number of
//! replicas may run, each holding no cache. Each file holds its controller and its tests, which
//! run in `make test` against the local API server (tests/tests/delivery/ported). The Go
//! SDK's examples keep the same kinds (`controller-sdk/go/examples/{bundles,mirrors}`, whose
//! `config/crd` holds the CRDs).
//!
//! Against the local control plane (`make cluster-up`) and one dispatcher (started as the
//! `configset` example's documentation shows):
//!
//! ```sh
//! kubectl --kubeconfig .cluster/kubeconfig apply -k controller-sdk/go/examples/bundles/config/crd
//! kubectl --kubeconfig .cluster/kubeconfig apply -k controller-sdk/go/examples/mirrors/config/crd
//! KUBECONFIG=.cluster/kubeconfig KD_TLS_CA_FILE=.cluster/pki/ca.crt KD_TOKEN_FILE=.cluster/tokens/tester.token \
//!   cargo run -p kube-dispatch-controller --example ported -- --namespace default --dispatcher 127.0.0.1:7070
//! ```
//!
//! In a pod, as `deploy/examples/ported-rust` runs it, the load balancer is found through
//! `KD_LOADBALANCER`.

mod bundle;
mod bundles;
mod mirror;
mod mirrors;

use std::sync::Arc;

use clap::Parser;
use futures::StreamExt;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tracing_subscriber::{EnvFilter, fmt::format::FmtSpan};

/// Runs the Bundle and Mirror example controllers (examples.kube-dispatch.dev/v1) of one
/// namespace on the kube-dispatch tier, each a controller group of its own: no informer cache,
/// no leader election.
///
/// The environment is the SDK's: KD_LOADBALANCER (the load balancer's host:port),
/// KD_TLS_CA_FILE and KD_TLS_SERVER_NAME (how the tier's certificate is checked), KD_TOKEN_FILE
/// (the projected token the tier authenticates), KD_ADMIN_LISTEN (where /metrics, /healthz and
/// /readyz are served, ready while both controllers have a dispatcher session), POD_NAME (the
/// replica's name). RUST_LOG filters the logs (default info); KD_LOG_JSON=1 writes them as
/// JSON, with each reconcile's span opening and closing.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The namespace whose Bundles and Mirrors are reconciled.
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: String,
    /// A dispatcher to poll directly (host:port), instead of asking the load balancer; may be
    /// given more than once.
    #[arg(long = "dispatcher", value_name = "ADDRESS")]
    dispatchers: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()));
    if std::env::var_os("KD_LOG_JSON").is_some() {
        logs.json()
            .with_span_events(FmtSpan::NEW | FmtSpan::CLOSE)
            .init();
    } else {
        logs.init();
    }
    let client = Client::try_default().await?;

    let bundles = bundles::controller(client.clone(), &args.namespace)
        .dispatchers(args.dispatchers.clone())
        .shutdown_on_signal();
    // Each controller's client counts what its reconciles ask of the API server.
    let context = bundles::Context {
        client: bundles.client(),
    };
    let bundles = bundles
        .run(bundles::reconcile, bundles::error_policy, Arc::new(context))
        .for_each(|outcome| logged("bundles", outcome));

    let mirrors = mirrors::controller(client, &args.namespace)
        .dispatchers(args.dispatchers)
        .shutdown_on_signal();
    let reporter = Reporter {
        controller: mirrors::MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let context = mirrors::Context {
        client: mirrors.client(),
        recorder: Recorder::new(mirrors.client(), reporter),
    };
    let mirrors = mirrors
        .run(mirrors::reconcile, mirrors::error_policy, Arc::new(context))
        .for_each(|outcome| logged("mirrors", outcome));

    // Both run until SIGTERM or Ctrl-C has drained their sessions.
    futures::join!(bundles, mirrors);
    Ok(())
}

/// Logs a failed reconcile (a successful one is in its span).
async fn logged<K, E: std::fmt::Display>(controller: &str, outcome: Result<K, E>) {
    if let Err(error) = outcome {
        tracing::warn!(controller, %error, "reconcile failed");
    }
}
