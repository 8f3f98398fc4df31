//! The objects a run reconciles: one namespace per kind and object count (or many namespaces of
//! labelled objects, see [`populate_spread`]), filled once and reused by every variant and every
//! later `make bench`.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Namespace},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, CustomResourceExt, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
    runtime::wait::{await_condition, conditions},
};
use kube_dispatch_bench::{
    ANNOTATION, CHILD_HASH_KEY, Content, Record, RecordSpec, SET_LABEL, child_is_current,
    child_name, content_hash, desired_child,
};

const MANAGER: &str = "kube-dispatch-bench";

/// The resource the objects are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Kind {
    /// core/v1 ConfigMaps.
    ConfigMap,
    /// bench.kube-dispatch.dev/v1 Records, a custom resource.
    Record,
}

impl Kind {
    /// The `--kind` value of `bench-controller`.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Kind::ConfigMap => "config-map",
            Kind::Record => "record",
        }
    }

    /// The resource name in the API server's metrics.
    pub(crate) fn resource(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmaps",
            Kind::Record => "records",
        }
    }

    pub(crate) fn title(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMaps",
            Kind::Record => "Records (custom resource)",
        }
    }
}

/// Creates the empty ConfigMap `name` through `api`: the object a latency run patches.
pub(crate) async fn create_probe(
    api: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: &str,
) -> anyhow::Result<()> {
    api.create(
        &kube::api::PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?,
    )
    .await
    .with_context(|| format!("cannot create ConfigMap {name}"))?;
    Ok(())
}

/// The `--kind` flags of `kinds`, joined: a name for namespaces, files and logs.
pub(crate) fn flags(kinds: &[Kind]) -> String {
    joined(kinds, Kind::flag, "-and-")
}

/// The titles of `kinds`, joined, for headings.
pub(crate) fn titles(kinds: &[Kind]) -> String {
    joined(kinds, Kind::title, " and ")
}

fn joined(kinds: &[Kind], part: fn(Kind) -> &'static str, separator: &str) -> String {
    kinds
        .iter()
        .map(|k| part(*k))
        .collect::<Vec<_>>()
        .join(separator)
}

/// Name of the `i`th object.
pub(crate) fn object_name(i: usize) -> String {
    format!("obj-{i:06}")
}

/// The data of the `i`th object: a `value` the writes change, and a `config.yaml` of about
/// `bytes` bytes, the size of a small real configuration file.
fn object_data(i: usize, bytes: usize) -> BTreeMap<String, String> {
    let mut config = String::with_capacity(bytes + 64);
    let mut line = 0usize;
    while config.len() < bytes {
        config.push_str(&format!(
            "setting-{line:03}: value-{:016x}\n",
            (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ line as u64
        ));
        line += 1;
    }
    [
        ("value".to_owned(), "0".to_owned()),
        ("config.yaml".to_owned(), config),
    ]
    .into()
}

/// Installs the Record CRD (server-side apply) and waits until it is served.
pub(crate) async fn install_crd(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Record::crd();
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("cannot install the Record CRD")?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .context("the Record CRD was not established within 30 s")??;
    Ok(())
}

/// Makes `namespace` hold exactly objects `0..count` of `kind`, each carrying the correct hash
/// annotation, so a controller starting on it finds everything up to date. Objects already
/// right are left alone; returns how many had to be written.
pub(crate) async fn populate(
    client: &Client,
    kind: Kind,
    namespace: &str,
    count: usize,
    bytes: usize,
) -> anyhow::Result<usize> {
    populate_labelled(client, kind, namespace, count, bytes, None).await
}

/// [`populate`], each object labelled `label` (key, value) when given.
pub(crate) async fn populate_labelled(
    client: &Client,
    kind: Kind,
    namespace: &str,
    count: usize,
    bytes: usize,
    label: Option<(&str, &str)>,
) -> anyhow::Result<usize> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .patch(namespace, &PatchParams::apply(MANAGER), &Patch::Apply(&ns))
        .await
        .with_context(|| format!("cannot create namespace {namespace}"))?;

    let up_to_date = match kind {
        Kind::ConfigMap => up_to_date::<ConfigMap>(client, namespace, count, bytes, label).await?,
        Kind::Record => up_to_date::<Record>(client, namespace, count, bytes, label).await?,
    };
    let missing: Vec<usize> = (0..count).filter(|i| !up_to_date[*i]).collect();
    futures::stream::iter(missing.iter().copied())
        .map(|i| apply_object(client, kind, namespace, i, bytes, label))
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    Ok(missing.len())
}

/// Which of objects `0..count` exist with the content and annotation `populate` gives them.
async fn up_to_date<K>(
    client: &Client,
    namespace: &str,
    count: usize,
    bytes: usize,
    label: Option<(&str, &str)>,
) -> anyhow::Result<Vec<bool>>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Content
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut ok = vec![false; count];
    // Every object's config.yaml has the same length (its lines are fixed-width): build one, not
    // one per object listed.
    let config_len_wanted = object_data(0, bytes)["config.yaml"].len();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("cannot list the objects of {namespace}"))?;
        for object in &page.items {
            let Some(i) = object
                .name_any()
                .strip_prefix("obj-")
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|i| *i < count)
            else {
                continue;
            };
            let config_len = object
                .content()
                .and_then(|d| d.get("config.yaml"))
                .map_or(0, String::len);
            ok[i] = object.annotations().get(ANNOTATION) == Some(&content_hash(object.content()))
                && config_len == config_len_wanted
                && label.is_none_or(|(k, v)| object.labels().get(k).map(String::as_str) == Some(v));
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Ok(ok)
}

async fn apply_object(
    client: &Client,
    kind: Kind,
    namespace: &str,
    i: usize,
    bytes: usize,
    label: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let data = object_data(i, bytes);
    let metadata = ObjectMeta {
        name: Some(object_name(i)),
        namespace: Some(namespace.to_owned()),
        labels: label.map(|(k, v)| [(k.to_owned(), v.to_owned())].into()),
        annotations: Some([(ANNOTATION.to_owned(), content_hash(Some(&data)))].into()),
        ..ObjectMeta::default()
    };
    let params = PatchParams::apply(MANAGER).force();
    match kind {
        Kind::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            let object = ConfigMap {
                metadata,
                data: Some(data),
                ..ConfigMap::default()
            };
            api.patch(&object_name(i), &params, &Patch::Apply(&object))
                .await?;
        }
        Kind::Record => {
            let api: Api<Record> = Api::namespaced(client.clone(), namespace);
            let mut object = Record::new(&object_name(i), RecordSpec { data });
            object.metadata = metadata;
            api.patch(&object_name(i), &params, &Patch::Apply(&object))
                .await?;
        }
    }
    Ok(())
}

/// Changes the `value` of object `i` (a merge patch, as a user's edit would be) and returns
/// the resourceVersion the write produced.
pub(crate) async fn change_value(
    client: &Client,
    kind: Kind,
    namespace: &str,
    i: usize,
    value: &str,
) -> anyhow::Result<u64> {
    let params = PatchParams::default();
    let rv = match kind {
        Kind::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            let patch = serde_json::json!({ "data": { "value": value } });
            api.patch(&object_name(i), &params, &Patch::Merge(&patch))
                .await?
                .resource_version()
        }
        Kind::Record => {
            let api: Api<Record> = Api::namespaced(client.clone(), namespace);
            let patch = serde_json::json!({ "spec": { "data": { "value": value } } });
            api.patch(&object_name(i), &params, &Patch::Merge(&patch))
                .await?
                .resource_version()
        }
    };
    rv.and_then(|rv| rv.parse().ok())
        .context("the write returned no numeric resourceVersion")
}

/// A run's objects spread over namespaces, each holding as many, labelled ([`SET_LABEL`]) for a
/// run of that shape: runs of other sizes (the smoke test's) select none of them. Owners (a run
/// with children) are a set of their own for each number of children, in namespaces of their
/// own, so a run of ConfigMaps never selects an owner's children, nor a run with fewer
/// children the children of one with more.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spread {
    pub(crate) namespaces: usize,
    /// Objects in each namespace.
    pub(crate) per: usize,
    /// Children each object (a Record) owns; 0: none.
    pub(crate) children: usize,
}

impl Spread {
    /// `total` objects over `namespaces` namespaces (which divide it), each owning `children`.
    pub(crate) fn new(total: usize, namespaces: usize, children: usize) -> Self {
        Self {
            namespaces,
            per: total / namespaces,
            children,
        }
    }

    /// The value of [`SET_LABEL`] the objects (and children) carry.
    pub(crate) fn label_value(&self) -> String {
        match self.children {
            0 => format!("shards-{}x{}", self.namespaces, self.per),
            c => format!("owners{c}-{}x{}", self.namespaces, self.per),
        }
    }

    /// The label selector every controller of the run watches with.
    pub(crate) fn selector(&self) -> String {
        format!("{SET_LABEL}={}", self.label_value())
    }

    /// The namespace of shard `i`. The index comes early: FNV-1a, the API server's shard hash,
    /// leaves names that differ only in their last characters close together on the ring
    /// (`kd-bench-shard-0` to `-9` would all land on one dispatcher). Runs with other object
    /// counts use other namespaces.
    pub(crate) fn namespace(&self, i: usize) -> String {
        match self.children {
            0 => format!("kd-{i}-bench-shard-{}", self.per),
            c => format!("kd-{i}-bench-owners{c}-{}", self.per),
        }
    }

    /// The namespace and index in it of object `i` of the run.
    pub(crate) fn place(&self, i: usize) -> (String, usize) {
        (self.namespace(i / self.per), i % self.per)
    }
}

/// Fills the namespaces of `spread` with its objects of `kind`, and makes the namespace the
/// tier's Leases live in, beside the other benchmarks' objects. Returns that namespace and
/// how many objects had to be written.
pub(crate) async fn populate_spread(
    client: &Client,
    kind: Kind,
    spread: Spread,
    bytes: usize,
) -> anyhow::Result<(String, usize)> {
    let label = spread.label_value();
    let mut written = 0;
    for i in 0..spread.namespaces {
        written += populate_labelled(
            client,
            kind,
            &spread.namespace(i),
            spread.per,
            bytes,
            Some((SET_LABEL, &label)),
        )
        .await?;
    }
    let leases = match spread.children {
        0 => format!("kd-bench-{}-shards", kind.flag()),
        c => format!("kd-bench-{}-owners{c}", kind.flag()),
    };
    populate_labelled(client, kind, &leases, 0, bytes, None).await?;
    Ok((leases, written))
}

/// The namespace of `objects` objects of the kinds `flags` names, each owning `children`
/// ConfigMaps, in one namespace.
pub(crate) fn owners_namespace(flags: &str, objects: usize, children: usize) -> String {
    format!("kd-bench-{flags}-{objects}-owning-{children}")
}

/// Makes each of the Records `0..count` of `namespace` own `children` ConfigMaps as the
/// controller keeps them ([`desired_child`]), so a controller starting on them finds them up to
/// date. Children already right are left alone; returns how many had to be written.
pub(crate) async fn populate_children(
    client: &Client,
    namespace: &str,
    count: usize,
    children: usize,
) -> anyhow::Result<usize> {
    let records: Api<Record> = Api::namespaced(client.clone(), namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let owners: Vec<Record> = records
        .list(&ListParams::default())
        .await
        .with_context(|| format!("cannot list the Records of {namespace}"))?
        .items;
    let existing: BTreeMap<String, ConfigMap> = configmaps
        .list(&ListParams::default())
        .await
        .with_context(|| format!("cannot list the ConfigMaps of {namespace}"))?
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let mut missing = Vec::new();
    for owner in owners.iter().filter(|o| {
        o.name_any()
            .strip_prefix("obj-")
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i < count)
    }) {
        for i in 0..children {
            let current = existing.get(&child_name(&owner.name_any(), i));
            let owned = current.is_some_and(|c| {
                c.owner_references()
                    .iter()
                    .any(|r| Some(&r.uid) == owner.uid().as_ref())
            });
            // Labelled as its owner is, too: a child left by a run of another shape may carry
            // another set's label, and the controllers would not select it.
            let labelled =
                current.is_some_and(|c| c.labels().get(SET_LABEL) == owner.labels().get(SET_LABEL));
            if !(owned && labelled && current.is_some_and(|c| child_is_current(owner, c))) {
                missing.push(desired_child(owner, i));
            }
        }
    }
    let params = PatchParams::apply(MANAGER).force();
    futures::stream::iter(missing.iter())
        .map(|child| {
            let (api, params) = (&configmaps, &params);
            async move {
                api.patch(&child.name_any(), params, &Patch::Apply(child))
                    .await
                    .map(|_| ())
                    .with_context(|| format!("cannot write child {}", child.name_any()))
            }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    Ok(missing.len())
}

/// Changes child `child` of Record `i` away from what its owner says (a merge patch, as a
/// hand edit would be): drift for the controller to repair.
pub(crate) async fn drift_child(
    client: &Client,
    namespace: &str,
    i: usize,
    child: usize,
    value: &str,
) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({ "data": { CHILD_HASH_KEY: format!("drift-{value}") } });
    api.patch(
        &child_name(&object_name(i), child),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Whether every child of the Records `0..count` of `namespace` holds what its owner says,
/// and how many LIST requests it took to find out (pages of 500).
pub(crate) async fn children_current(
    client: &Client,
    namespace: &str,
    count: usize,
    children: usize,
) -> anyhow::Result<(bool, u64)> {
    let records: Api<Record> = Api::namespaced(client.clone(), namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let (records, owner_pages) = list_all(&records).await?;
    let (children_listed, child_pages) = list_all(&configmaps).await?;
    let lists = owner_pages + child_pages;
    let owners: BTreeMap<String, Record> = records.into_iter().map(|r| (r.name_any(), r)).collect();
    let kids: BTreeMap<String, ConfigMap> = children_listed
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let current = (0..count).all(|i| {
        owners.get(&object_name(i)).is_some_and(|owner| {
            (0..children).all(|c| {
                kids.get(&child_name(&owner.name_any(), c))
                    .is_some_and(|kid| child_is_current(owner, kid))
            })
        })
    });
    Ok((current, lists))
}

/// Every object `api` lists, in pages of 500, and how many pages that took.
async fn list_all<K>(api: &Api<K>) -> anyhow::Result<(Vec<K>, u64)>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut pages = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        pages += 1;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok((items, pages)),
        }
    }
}
