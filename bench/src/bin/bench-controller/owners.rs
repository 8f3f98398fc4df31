//! Controllers with children (`--children`): the owner's reconcile that keeps its children, on
//! kube-rs (its children from a reflector) and on the SDK (from the request, or listed).

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{GetParams, ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, controller, reflector, watcher},
};
use kube_dispatch_bench::{
    CHILD_LABEL, Content, Record, child_is_current, child_name, content_hash, desired_child,
};
use kube_dispatch_controller::{children::Checked, reads};

use super::{
    ChildrenFrom, Error, MANAGER, api_of, drain, ensure_hash, error_policy_dispatch,
    error_policy_kube_rs, kube_rs_config, started,
};

/// A child as a reconcile finds it.
pub(super) enum Found {
    /// Known to hold what this controller wrote for the owner as it is now: nothing to read.
    Held,
    /// At a version this controller did not write (or read) for the owner as it is now, after
    /// it wrote the owner's children before: written without reading it, as the apply is the
    /// same whatever it holds.
    Unchecked,
    /// As read (`None`: it does not exist).
    Read(Option<Box<ConfigMap>>),
}

/// Makes the `count` children of `owner` what [`desired_child`] says, finding each by `find`
/// and writing (server-side apply, through `api`) only those that differ; `current` is told
/// of each child found or written as desired.
pub(super) async fn ensure_children<F, Fut>(
    owner: &Record,
    count: usize,
    api: &Api<ConfigMap>,
    find: F,
    mut current: impl FnMut(&ConfigMap),
) -> Result<(), Error>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Found, Error>>,
{
    for i in 0..count {
        let name = child_name(&owner.name_any(), i);
        match find(name.clone()).await? {
            Found::Held => continue,
            Found::Read(Some(c)) if child_is_current(owner, &c) => {
                current(&c);
                continue;
            }
            Found::Read(_) | Found::Unchecked => {}
        }
        let written = api
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&desired_child(owner, i)),
            )
            .await?;
        current(&written);
    }
    Ok(())
}

/// A child as the API server's watch cache has it (`resourceVersion=0`: no read of etcd), read
/// again consistently if older than `known` (the resourceVersion the request showed).
pub(super) async fn cached_child(
    api: &Api<ConfigMap>,
    name: &str,
    known: Option<u64>,
) -> Result<Option<ConfigMap>, Error> {
    tracing::debug!(child = name, ?known, "reading a child from the API server");
    let got = match api.get_with(name, &GetParams::any()).await {
        Ok(c) => Some(c),
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(e) => return Err(e.into()),
    };
    let version = |c: &ConfigMap| c.resource_version().and_then(|v| v.parse::<u64>().ok());
    match (&got, known) {
        (Some(c), Some(known)) if version(c).is_some_and(|v| v < known) => {
            Ok(api.get_opt(name).await?)
        }
        (None, Some(_)) => Ok(api.get_opt(name).await?),
        _ => Ok(got),
    }
}

/// kube-rs: Records, each owning `children` ConfigMaps read from the store of the reflector
/// that also triggers the owners (`owns_stream`): one watch of the children, cached.
pub(super) async fn run_kube_rs_owners(
    client: Client,
    (namespace, selector): (&str, &str),
    concurrency: usize,
    children: usize,
) {
    let (records, configmaps) = if namespace.is_empty() {
        (
            Api::<Record>::all(client.clone()),
            Api::<ConfigMap>::all(client.clone()),
        )
    } else {
        (
            Api::<Record>::namespaced(client.clone(), namespace),
            Api::<ConfigMap>::namespaced(client.clone(), namespace),
        )
    };
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(selector);
    }
    let (store, writer) = reflector::store::<ConfigMap>();
    let owned = watcher(configmaps, config.clone())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let reconcile = move |record: Arc<Record>, client: Arc<Client>| {
        let store = store.clone();
        async move {
            started(record.meta());
            ensure_hash(record.as_ref(), &api_of(&client, record.as_ref())).await?;
            let ns = record.namespace().unwrap_or_default();
            let configmaps = Api::<ConfigMap>::namespaced(client.as_ref().clone(), &ns);
            let find = |name: String| {
                let cached = store
                    .get(&reflector::ObjectRef::new(&name).within(&ns))
                    .map(|c| (*c).clone());
                async move { Ok(Found::Read(cached.map(Box::new))) }
            };
            ensure_children(&record, children, &configmaps, find, |_| {}).await?;
            Ok::<_, Error>(controller::Action::await_change())
        }
    };
    let results = controller::Controller::new(records, config)
        .owns_stream(owned)
        .with_config(kube_rs_config(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy_kube_rs, Arc::new(client));
    drain(results).await;
}

/// The owner's children, listed: by label (`List`, a LIST the API server answers from etcd),
/// or as a kube-rs controller reads them from its store (`Index`, `reads::children`).
async fn listed_children(
    configmaps: &Api<ConfigMap>,
    record: &Record,
    from: ChildrenFrom,
) -> Result<Vec<ConfigMap>, Error> {
    Ok(match from {
        ChildrenFrom::Index => reads::children(configmaps, record).await?,
        _ => {
            configmaps
                .list(
                    &ListParams::default().labels(&format!("{CHILD_LABEL}={}", record.name_any())),
                )
                .await?
                .items
        }
    })
}

/// The SDK: Records, each owning `children` ConfigMaps, read as `from` says.
pub(super) async fn run_dispatch_owners(
    client: Client,
    name: &str,
    (namespace, selector): (&str, &str),
    concurrency: usize,
    (children, from): (usize, ChildrenFrom),
    recent_objects: Option<u64>,
) {
    let reconcile = move |record: Arc<Record>, client: Arc<Client>| async move {
        started(record.meta());
        let ns = record.namespace().unwrap_or_default();
        ensure_hash(record.as_ref(), &api_of(&client, record.as_ref())).await?;
        let configmaps = Api::<ConfigMap>::namespaced(client.as_ref().clone(), &ns);
        match from {
            ChildrenFrom::Request => {
                // What the dispatcher knows of the children: which exist, and how new each is.
                let known = kube_dispatch_controller::children::of_this_reconcile()
                    .filter(|c| c.is_complete());
                // The versions this controller wrote or read for the owner's data as it is.
                let mut checked = Checked::for_desired(content_hash(record.content()));
                // Whether an earlier reconcile here left what it wrote: without (the first
                // reconcile here, as at a cold start), a child is read before it is written.
                let wrote_before = kube_dispatch_controller::memo::previous().is_some();
                let api = &configmaps;
                let (held, mut recorded) = (&checked, Vec::new());
                let find = |name: String| {
                    // Some(None): known not to exist; Some(Some(child)): exists, as the
                    // request shows it; None: the request does not say.
                    let seen = known
                        .as_ref()
                        .map(|c| c.of::<ConfigMap>().find(|k| k.name == name).cloned());
                    async move {
                        match seen {
                            Some(Some(child)) if held.holds(&child) => Ok(Found::Held),
                            // Known not to exist: nothing to read.
                            Some(None) => Ok(Found::Read(None)),
                            // Written before (the owner changed since, or the child did).
                            Some(Some(_)) if wrote_before => Ok(Found::Unchecked),
                            // Carried by the request, as the dispatcher's watch showed it.
                            Some(Some(child)) if !child.object_json.is_empty() => {
                                Ok(Found::Read(child.object::<ConfigMap>().map(Box::new)))
                            }
                            Some(Some(child)) => {
                                let version = child.resource_version.parse::<u64>().ok();
                                Ok(Found::Read(
                                    cached_child(api, &name, version).await?.map(Box::new),
                                ))
                            }
                            None => Ok(Found::Read(
                                cached_child(api, &name, None).await?.map(Box::new),
                            )),
                        }
                    }
                };
                let result = ensure_children(&record, children, &configmaps, find, |c| {
                    recorded.push(c.clone());
                })
                .await;
                // What was found or written stays recorded, whatever the outcome.
                for c in &recorded {
                    checked.record(c);
                }
                if let Err(e) = checked.leave() {
                    tracing::debug!(error = %e, "children's versions not kept");
                }
                result?;
            }
            ChildrenFrom::List | ChildrenFrom::Index => {
                let listed = listed_children(&configmaps, &record, from).await?;
                let find = |name: String| {
                    let found = listed.iter().find(|c| c.name_any() == name).cloned();
                    async move { Ok(Found::Read(found.map(Box::new))) }
                };
                ensure_children(&record, children, &configmaps, find, |_| {}).await?;
            }
        }
        Ok::<_, Error>(kube_dispatch_controller::Action::await_change())
    };
    let controller = kube_dispatch_controller::Controller::<Record>::new(client.clone(), name)
        .namespace(namespace);
    let controller = if selector.is_empty() {
        controller.owns::<ConfigMap>()
    } else {
        // The children carry their owner's label: selected alike.
        controller
            .labels(selector)
            .owns_labelled::<ConfigMap>(selector)
    };
    let controller = match recent_objects {
        Some(bytes) => controller.recent_objects(bytes),
        None => controller,
    };
    let results = controller
        .concurrency(concurrency)
        .shutdown_on_signal()
        .run(reconcile, error_policy_dispatch, Arc::new(client));
    drain(results).await;
}
