//! The controller the benchmarks run: it keeps the annotation
//! `bench.kube-dispatch.dev/content-hash` equal to the SHA-256 of each object's data, patching
//! it when it differs, like many real controllers that derive one field from another. The
//! reconcile is the same code in every runtime; only what feeds it differs:
//!
//! - `kube-rs`: a kube-rs `Controller` over `Api::namespaced`, with the default
//!   `watcher::Config` the kube-rs documentation starts from; its reflector caches every object.
//! - `kube-rs-streaming`: the same, its watcher listing by streaming (`streaming_lists`)
//!   instead of in pages of 500, as kube-rs users do for large collections.
//! - `kube-rs-metadata`: the same over `Api<PartialObjectMeta<K>>`, so the watch and the cache
//!   hold metadata only (the kube-rs optimization guide's advice for controllers that can read
//!   the rest on demand); each reconcile then GETs the object.
//! - `dispatch`: the kube-dispatch SDK, polling the dispatchers the load balancer assigns
//!   (`KD_LOADBALANCER`); it holds no cache.
//!
//! With `--children C` (Records only), each Record also owns C ConfigMaps holding the hash of
//! its data (`kube_dispatch_bench::desired_child`), written when they differ, like a
//! Deployment-like controller keeping its ReplicaSets; each runtime reads the children the way
//! its users would:
//!
//! - `kube-rs`: `Controller::owns_stream` over a reflector, whose store the reconcile reads (the
//!   children are cached, one watch for both);
//! - `dispatch` with `--children-from request`: the children the request carries (name, uid,
//!   resourceVersion) against those the last reconcile here wrote or read for the owner's data
//!   as it is (`children::Checked`, in the key's memo): a child at such a version or an older
//!   one (its write not seen yet) is neither read nor written; one at a newer version is
//!   written without reading it once the owner's
//!   children were written here before, and otherwise (the first reconcile here, as at a cold
//!   start) taken from the request where it carries the child's body, else read first by a GET
//!   the API server answers from its watch cache (`resourceVersion=0`), read again
//!   consistently if that is older than the request;
//! - `dispatch` with `--children-from list`: a LIST of the owner's children by label in every
//!   reconcile, as a controller with no cache and no children in its requests must;
//! - `dispatch` with `--children-from index`: `reads::children`, the SDK's answer to what a
//!   kube-rs controller read from its store (one LIST of the namespace from the watch cache,
//!   at least as new as the request, none when the request shows no child).
//!
//! With `--selector`, the children are selected by it too (they carry their owner's label):
//! the kube-rs watcher of children with that label selector, the SDK's `owns_labelled`.
//!
//! With `--leader-elect LEASE` (the kube-rs runtimes), the shape kube-rs controllers run in
//! production: two or more replicas, one leading through that Lease in `--namespace`, taken and
//! kept with `kube-lease-manager` (15 s duration, 5 s grace, given up on a clean stop), the
//! standby cold: it starts its `Controller`, watch and cache only once it leads, and exits if
//! it stops leading.
//!
//! Every process prints `ready` on stdout once its client is built (with `--leader-elect`,
//! once it has read the Lease), about when a readiness probe of a controller pod first passes,
//! and every reconcile prints `reconcile <unix micros> <namespace>/<name> <resourceVersion>`,
//! the time it started, about a millisecond later (the lines are written together; later while
//! the machine is busy); logs go to stderr.

use std::{fmt::Debug, future::Future, pin::Pin, sync::Arc, time::Duration};

use anyhow::Context as _;

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::{NamespaceResourceScope, api::core::v1::ConfigMap};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{PartialObjectMeta, Patch, PatchParams},
    runtime::{controller, watcher},
};
use kube_dispatch_bench::{ANNOTATION, Content, ReconcileStart, Record, content_hash, now_micros};
use kube_lease_manager::LeaseManagerBuilder;
use serde::{Serialize, de::DeserializeOwned};
use tokio::signal::unix::{SignalKind, signal};

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

    /// Only objects matching this label selector (not with kube-rs-metadata), and with
    /// `--children` only children matching it; empty for all.
    #[arg(long, env = "KD_BENCH_SELECTOR", default_value = "")]
    selector: String,

    /// The controller group's name (the SDK runtime): distinct names make distinct controllers
    /// on one tier, each with its own queue of every object.
    #[arg(long, env = "KD_BENCH_NAME", default_value = "bench-controller")]
    name: String,

    /// Most reconciles running at once (the SDK's default; kube-rs is set to the same).
    #[arg(long, env = "KD_BENCH_CONCURRENCY", default_value_t = 16)]
    concurrency: usize,

    /// Most deliveries the `dispatch` runtime asks for beyond its free slots while its
    /// reconciles are quick (`Controller::prefetch`; 0 for none); unset: the SDK's default
    /// (the concurrency). Not used with `--children`.
    #[arg(long, env = "KD_BENCH_PREFETCH")]
    prefetch: Option<usize>,

    /// ConfigMaps each Record owns and keeps (`--kind record` with `kube-rs` or `dispatch`);
    /// 0 for none.
    #[arg(long, env = "KD_BENCH_CHILDREN", default_value_t = 0)]
    children: usize,

    /// Where the `dispatch` runtime reads a Record's children from, with `--children`.
    #[arg(
        long,
        value_enum,
        env = "KD_BENCH_CHILDREN_FROM",
        default_value = "request"
    )]
    children_from: ChildrenFrom,

    /// Bytes of objects the `dispatch` runtime keeps as last reconciled, with `--children`
    /// (`Controller::recent_objects`) [default: the SDK's, 1 MiB]: enough for every owner
    /// spares the read of an owner whose child changed, for that much memory.
    #[arg(long, env = "KD_BENCH_RECENT_OBJECTS")]
    recent_objects: Option<u64>,

    /// Leads through this Lease in `--namespace` before starting the controller, as one of
    /// several replicas (the kube-rs runtimes, ConfigMaps or Records without children); the
    /// replica's identity is `POD_NAME`.
    #[arg(long, env = "KD_BENCH_LEADER_ELECT", value_name = "LEASE")]
    leader_elect: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ChildrenFrom {
    /// The children the request carries, and a GET served by the API server's watch cache
    /// for each one's content.
    Request,
    /// A LIST of the owner's children by label in every reconcile.
    List,
    /// `reads::children`: what a kube-rs controller reads from its store of children, one
    /// LIST of the namespace from the watch cache, none when the request shows no child.
    Index,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Runtime {
    /// kube-rs `Controller` with a reflector cache of whole objects.
    KubeRs,
    /// The same, listing by streaming (`watcher::Config::streaming_lists`) instead of pages.
    KubeRsStreaming,
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

/// Prints the reconcile-start line (about a millisecond later: [`starts`]). The line carries its
/// own timestamp, so neither that nor a slow reader skews the times measured from it.
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
    starts::print(line);
}

#[path = "bench-controller/starts.rs"]
mod starts;

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

/// The field manager of the children's writes.
#[path = "bench-controller/owners.rs"]
mod owners;
use owners::{run_dispatch_owners, run_kube_rs_owners};

const MANAGER: &str = "bench-controller";

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

/// The kube-rs watcher's configuration: the documentation's default (lists in pages of 500), or
/// streaming lists, with the label selector if any.
fn watcher_config(runtime: Runtime, selector: &str) -> watcher::Config {
    let mut config = watcher::Config::default();
    if matches!(runtime, Runtime::KubeRsStreaming) {
        config = config.streaming_lists();
    }
    if !selector.is_empty() {
        config = config.labels(selector);
    }
    config
}

async fn run_kube_rs<K: Object>(
    client: Client,
    namespace: &str,
    config: watcher::Config,
    concurrency: usize,
) {
    let api = if namespace.is_empty() {
        Api::<K>::all(client.clone())
    } else {
        Api::<K>::namespaced(client.clone(), namespace)
    };
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
    (concurrency, prefetch): (usize, Option<usize>),
) {
    let reconcile = |object: Arc<K>, client: Arc<Client>| async move {
        started(object.meta());
        ensure_hash(object.as_ref(), &api_of(&client, object.as_ref())).await?;
        Ok::<_, Error>(kube_dispatch_controller::Action::await_change())
    };
    let mut controller = kube_dispatch_controller::Controller::<K>::new(client.clone(), name)
        .namespace(namespace)
        .labels(selector)
        .concurrency(concurrency);
    if let Some(n) = prefetch {
        controller = controller.prefetch(n);
    }
    let results =
        controller
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

/// Runs `run` while this replica leads through `lease` (`--leader-elect`): a cold standby until
/// then, as kube-rs controllers run with `kube-lease-manager`. Gives the Lease up when `run`
/// ends (on SIGTERM, through the controller's `shutdown_on_signal`) or when SIGTERM comes while
/// standing by; fails if the Lease is lost while leading, as such a controller exits then.
async fn lead(
    client: Client,
    lease: &str,
    namespace: &str,
    run: Pin<Box<dyn Future<Output = ()> + '_>>,
) -> anyhow::Result<()> {
    let identity = std::env::var("POD_NAME").context("--leader-elect needs POD_NAME")?;
    let manager = LeaseManagerBuilder::new(client, lease)
        .with_namespace(namespace)
        .with_identity(&identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .build()
        .await?;
    let (mut leading, election) = manager.watch().await;
    // Ready once the Lease has been read, as a pod that is ready has long read it.
    println!("ready");
    let mut terminate = signal(SignalKind::terminate())?;
    let led = tokio::select! {
        changed = leading.wait_for(|leads| *leads) => { changed?; true }
        _ = terminate.recv() => false,
    };
    let outcome = if led {
        eprintln!("{identity}: leading through the Lease {lease}");
        tokio::select! {
            () = run => Ok(()),
            lost = leading.wait_for(|leads| !*leads) => {
                lost?;
                Err(anyhow::anyhow!("{identity}: lost the Lease {lease}"))
            }
        }
    } else {
        Ok(())
    };
    // Dropping the receiver ends the election, which gives the Lease up if held.
    drop(leading);
    election.await??;
    outcome
}

/// The Lease of `--leader-elect`: controller-runtime's default duration, renewed 5 s before it
/// runs out (`kube-lease-manager`'s default grace), as controller-runtime renews within 10 s.
const LEASE_SECONDS: u64 = 15;
const LEASE_GRACE_SECONDS: u64 = 5;

/// Refuses flags that do not go together.
fn check(args: &Args) -> anyhow::Result<()> {
    let Args {
        runtime,
        kind,
        namespace,
        selector,
        children,
        leader_elect,
        ..
    } = args;
    if leader_elect.is_some() {
        anyhow::ensure!(
            matches!(runtime, Runtime::KubeRs | Runtime::KubeRsStreaming) && !namespace.is_empty(),
            "--leader-elect needs the kube-rs or kube-rs-streaming runtime and a --namespace for its Lease"
        );
    }
    if *children > 0 {
        anyhow::ensure!(
            matches!(kind, Kind::Record) && matches!(runtime, Runtime::KubeRs | Runtime::Dispatch),
            "--children needs --kind record and the kube-rs or dispatch runtime"
        );
    }
    if matches!(runtime, Runtime::KubeRsMetadata) {
        anyhow::ensure!(
            !namespace.is_empty() && selector.is_empty(),
            "the kube-rs-metadata runtime needs --namespace and takes no --selector"
        );
    }
    Ok(())
}

/// The controller `args` ask for, to run.
fn controller(args: &Args, client: Client) -> Pin<Box<dyn Future<Output = ()> + '_>> {
    let Args {
        runtime,
        kind,
        namespace,
        selector,
        name,
        concurrency,
        prefetch,
        children,
        children_from,
        recent_objects,
        ..
    } = args;
    let (runtime, ns, concurrency, children) =
        (*runtime, namespace.as_str(), *concurrency, *children);
    match (runtime, kind) {
        (Runtime::KubeRs, Kind::Record) if children > 0 => Box::pin(run_kube_rs_owners(
            client,
            (ns, selector),
            concurrency,
            children,
        )),
        (Runtime::Dispatch, Kind::Record) if children > 0 => Box::pin(run_dispatch_owners(
            client,
            name,
            (ns, selector),
            concurrency,
            (children, *children_from),
            *recent_objects,
        )),
        (Runtime::KubeRs | Runtime::KubeRsStreaming, Kind::ConfigMap) => {
            let config = watcher_config(runtime, selector);
            Box::pin(run_kube_rs::<ConfigMap>(client, ns, config, concurrency))
        }
        (Runtime::KubeRs | Runtime::KubeRsStreaming, Kind::Record) => {
            let config = watcher_config(runtime, selector);
            Box::pin(run_kube_rs::<Record>(client, ns, config, concurrency))
        }
        (Runtime::KubeRsMetadata, Kind::ConfigMap) => {
            Box::pin(run_kube_rs_metadata::<ConfigMap>(client, ns, concurrency))
        }
        (Runtime::KubeRsMetadata, Kind::Record) => {
            Box::pin(run_kube_rs_metadata::<Record>(client, ns, concurrency))
        }
        (Runtime::Dispatch, Kind::ConfigMap) => Box::pin(run_dispatch::<ConfigMap>(
            client,
            name,
            ns,
            selector,
            (concurrency, *prefetch),
        )),
        (Runtime::Dispatch, Kind::Record) => Box::pin(run_dispatch::<Record>(
            client,
            name,
            ns,
            selector,
            (concurrency, *prefetch),
        )),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    check(&args)?;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let client = Client::try_default().await?;
    let run = controller(&args, client.clone());
    let outcome = match &args.leader_elect {
        Some(lease) => lead(client, lease, &args.namespace, run).await,
        None => {
            println!("ready");
            run.await;
            Ok(())
        }
    };
    starts::flush();
    outcome
}
