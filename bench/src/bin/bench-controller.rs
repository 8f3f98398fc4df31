//! The controller the benchmarks run: it keeps the annotation
//! `bench.kube-dispatch.dev/content-hash` equal to the SHA-256 of each object's data, patching
//! it when it differs, like many real controllers that derive one field from another. The
//! reconcile is the same code in every runtime; only what feeds it differs:
//!
//! - `kube-rs`: a kube-rs `Controller` over `Api::namespaced`, with the default
//!   `watcher::Config` the kube-rs documentation starts from; its reflector caches every object.
//! - `kube-rs-metadata`: the same over `Api<PartialObjectMeta<K>>`, so the watch and the cache
//!   hold metadata only (the kube-rs optimization guide's advice for controllers that can read
//!   the rest on demand); each reconcile then GETs the object.
//! - `dispatch`: the kube-dispatch SDK, polling the dispatchers the load balancer assigns
//!   (`KD_LOADBALANCER`); it holds no cache.
//!
//! Every reconcile prints `reconcile <unix micros> <namespace>/<name> <resourceVersion>` on
//! stdout as it starts; logs go to stderr.

use std::{fmt::Debug, io::Write, sync::Arc, time::Duration};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::{NamespaceResourceScope, api::core::v1::ConfigMap};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{PartialObjectMeta, Patch, PatchParams},
    runtime::{controller, watcher},
};
use kube_dispatch_bench::{ANNOTATION, Content, ReconcileStart, Record, content_hash, now_micros};
use serde::{Serialize, de::DeserializeOwned};

/// The benchmark controller: keeps a content-hash annotation on every object of one namespace.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// How objects reach the reconcile function.
    #[arg(long, value_enum, env = "KD_BENCH_RUNTIME")]
    runtime: Runtime,

    /// Which resource to reconcile.
    #[arg(long, value_enum, env = "KD_BENCH_KIND", default_value = "config-map")]
    kind: Kind,

    /// Namespace of the objects; empty for every namespace (not with kube-rs-metadata).
    #[arg(long, env = "KD_BENCH_NAMESPACE")]
    namespace: String,

    /// Only objects matching this label selector (not with kube-rs-metadata); empty for all.
    #[arg(long, env = "KD_BENCH_SELECTOR", default_value = "")]
    selector: String,

    /// The controller group's name (the SDK runtime): distinct names make distinct controllers
    /// on one tier, each with its own queue of every object.
    #[arg(long, env = "KD_BENCH_NAME", default_value = "bench-controller")]
    name: String,

    /// Most reconciles running at once (the SDK's default; kube-rs is set to the same).
    #[arg(long, env = "KD_BENCH_CONCURRENCY", default_value_t = 16)]
    concurrency: usize,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Runtime {
    /// kube-rs `Controller` with a reflector cache of whole objects.
    KubeRs,
    /// kube-rs `Controller` with a metadata-only watch and cache; reconciles GET the object.
    KubeRsMetadata,
    /// kube-dispatch SDK behind the dispatchers and the load balancer.
    Dispatch,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    /// core/v1 ConfigMap.
    ConfigMap,
    /// bench.kube-dispatch.dev/v1 Record (custom resource).
    Record,
}

#[derive(Debug, thiserror::Error)]
#[error("API call failed: {0}")]
struct Error(#[from] kube::Error);

/// What every object kind needs for the reconcile.
trait Object:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Content
    + Clone
    + DeserializeOwned
    + Serialize
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl Object for ConfigMap {}
impl Object for Record {}

/// Prints the reconcile-start line. Stdout is line-buffered, and the line carries its own
/// timestamp, so a slow reader cannot skew what is measured.
fn started(meta: &kube::api::ObjectMeta) {
    let line = ReconcileStart {
        at_micros: now_micros(),
        key: format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
        resource_version: meta
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0),
    };
    // A closed stdout means the harness is gone; the reconcile itself still runs.
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The work itself: annotate the object with the hash of its content unless it already is.
async fn ensure_hash<K: Object>(object: &K, api: &Api<K>) -> Result<(), Error> {
    let hash = content_hash(object.content());
    if object.annotations().get(ANNOTATION) == Some(&hash) {
        return Ok(());
    }
    let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: hash } } });
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

async fn drain<S, T, E>(results: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    results
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::warn!(error = %e, "reconcile failed");
            }
        })
        .await;
}

fn kube_rs_config(concurrency: usize) -> controller::Config {
    controller::Config::default().concurrency(u16::try_from(concurrency).unwrap_or(u16::MAX))
}

/// The object's API, in its own namespace (a controller over every namespace patches each
/// object where it lives).
fn api_of<K: Object>(client: &Client, object: &K) -> Api<K> {
    Api::namespaced(
        client.clone(),
        object.meta().namespace.as_deref().unwrap_or_default(),
    )
}

async fn run_kube_rs<K: Object>(
    client: Client,
    namespace: &str,
    selector: &str,
    concurrency: usize,
) {
    let api = if namespace.is_empty() {
        Api::<K>::all(client.clone())
    } else {
        Api::<K>::namespaced(client.clone(), namespace)
    };
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(selector);
    }
    let reconcile = |object: Arc<K>, client: Arc<Client>| async move {
        started(object.meta());
        ensure_hash(object.as_ref(), &api_of(&client, object.as_ref())).await?;
        Ok::<_, Error>(controller::Action::await_change())
    };
    let results = controller::Controller::new(api, config)
        .with_config(kube_rs_config(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy_kube_rs, Arc::new(client));
    drain(results).await;
}

async fn run_kube_rs_metadata<K: Object>(client: Client, namespace: &str, concurrency: usize) {
    let api = Api::<K>::namespaced(client.clone(), namespace);
    let metadata = Api::<PartialObjectMeta<K>>::namespaced(client, namespace);
    let reconcile = |partial: Arc<PartialObjectMeta<K>>, api: Arc<Api<K>>| async move {
        started(&partial.metadata);
        // The cache has no data: read the object, as a metadata-only controller must.
        let Some(object) = api.get_opt(&partial.name_any()).await? else {
            return Ok(controller::Action::await_change());
        };
        ensure_hash(&object, &api).await?;
        Ok::<_, Error>(controller::Action::await_change())
    };
    let results = controller::Controller::new(metadata, watcher::Config::default())
        .with_config(kube_rs_config(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy_kube_rs, Arc::new(api));
    drain(results).await;
}

async fn run_dispatch<K: Object>(
    client: Client,
    name: &str,
    namespace: &str,
    selector: &str,
    concurrency: usize,
) {
    let reconcile = |object: Arc<K>, client: Arc<Client>| async move {
        started(object.meta());
        ensure_hash(object.as_ref(), &api_of(&client, object.as_ref())).await?;
        Ok::<_, Error>(kube_dispatch_controller::Action::await_change())
    };
    let results = kube_dispatch_controller::Controller::<K>::new(client.clone(), name)
        .namespace(namespace)
        .labels(selector)
        .concurrency(concurrency)
        .shutdown_on_signal()
        .run(reconcile, error_policy_dispatch, Arc::new(client));
    drain(results).await;
}

fn error_policy_kube_rs<T, C>(_: Arc<T>, _: &Error, _: Arc<C>) -> controller::Action {
    controller::Action::requeue(Duration::from_secs(1))
}

fn error_policy_dispatch<T, C>(
    _: Arc<T>,
    _: &Error,
    _: Arc<C>,
) -> kube_dispatch_controller::Action {
    kube_dispatch_controller::Action::requeue(Duration::from_secs(1))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        runtime,
        kind,
        namespace,
        selector,
        name,
        concurrency,
    } = Args::parse();
    if matches!(runtime, Runtime::KubeRsMetadata) {
        anyhow::ensure!(
            !namespace.is_empty() && selector.is_empty(),
            "the kube-rs-metadata runtime needs --namespace and takes no --selector"
        );
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let client = Client::try_default().await?;
    let ns = namespace.as_str();
    match (runtime, kind) {
        (Runtime::KubeRs, Kind::ConfigMap) => {
            run_kube_rs::<ConfigMap>(client, ns, &selector, concurrency).await
        }
        (Runtime::KubeRs, Kind::Record) => {
            run_kube_rs::<Record>(client, ns, &selector, concurrency).await
        }
        (Runtime::KubeRsMetadata, Kind::ConfigMap) => {
            run_kube_rs_metadata::<ConfigMap>(client, ns, concurrency).await;
        }
        (Runtime::KubeRsMetadata, Kind::Record) => {
            run_kube_rs_metadata::<Record>(client, ns, concurrency).await;
        }
        (Runtime::Dispatch, Kind::ConfigMap) => {
            run_dispatch::<ConfigMap>(client, &name, ns, &selector, concurrency).await
        }
        (Runtime::Dispatch, Kind::Record) => {
            run_dispatch::<Record>(client, &name, ns, &selector, concurrency).await
        }
    }
    Ok(())
}
