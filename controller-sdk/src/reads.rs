//! Reads a kube-rs controller makes through its reflector `Store`, served without one.
//!
//! A kube-rs controller finds the children of the object it reconciles, or the objects that
//! name it, in a `Store` it keeps with a reflector: `store.state()` filtered by owner, or
//! `store.find(..)`. On the tier there is no store; these answer the same questions from the
//! API server's watch cache (no quorum read of etcd): the children its request lists, as the
//! request carries them or each read by name at least as new as the request shows it, or one
//! LIST of a namespace at least
//! as new as the change the reconcile was delivered and the children its request listed
//! (`resourceVersionMatch=NotOlderThan`), so a reconcile sees the children an earlier one
//! created. Typed, whole objects, as the store held them.
//!
//! ```no_run
//! # async fn reconcile(owner: std::sync::Arc<k8s_openapi::api::core::v1::ConfigMap>, client: kube::Client) -> Result<(), kube::Error> {
//! use k8s_openapi::api::core::v1::Secret;
//! use kube::{Api, ResourceExt};
//! use kube_dispatch_controller::reads;
//!
//! let secrets: Api<Secret> = Api::namespaced(client, &owner.namespace().unwrap_or_default());
//! // Was: store.state().into_iter().filter(|s| s.owner_references().iter().any(..))
//! let children = reads::children(&secrets, owner.as_ref()).await?;
//! // Was: store.find(|s| s.labels().get("app") == Some(&"web".into()))
//! let web = reads::find(&secrets, |s| s.labels().get("app").is_some_and(|a| a == "web")).await?;
//! # drop((children, web));
//! # Ok(())
//! # }
//! ```
//!
//! [`find`] is one LIST (counted as a `list` in `kube_dispatch_api_requests_total` when the
//! `Api` comes from [`Controller::client`](crate::Controller::client)). [`children()`] of a
//! kind the request lists completely takes each child from the request (the dispatcher sends
//! children's bodies it holds) or reads it by name (a `get` each, none without a child), and
//! otherwise makes one LIST: a LIST of a namespace costs the API server in proportion to the
//! namespace, a GET in proportion to the object. An `Api::all` of a namespaced kind is
//! refused: across every namespace a LIST would read the whole kind.

use std::{any::TypeId, fmt::Debug};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use kube::{
    Api, Resource, ResourceExt,
    api::{GetParams, ListParams, VersionMatch},
};
use serde::de::DeserializeOwned;

use crate::children::{self, Children};

/// The most children read by name for one call; past it, one LIST.
const MAX_CHILD_READS: usize = 64;
/// The most of those reads in flight at once.
const CHILD_READS_AT_ONCE: usize = 8;

/// The objects of kind `K` that `owner` controls (their controller owner reference names its
/// uid), whole, from `api`'s namespace: a cluster-scoped owner's children may be in several,
/// and an `Api::all` takes those of every namespace when the request carries all their bodies
/// (else it fails as its LIST would, below: ask per namespace).
///
/// When the request lists the owner's children completely (the controller `owns` kind `K`)
/// and some of kind `K`, each is taken from the request when it carries the child's body
/// (no read), and otherwise read by name from the API server's watch cache, at least as
/// new as the version the request shows (a request of a few hundred bytes each, at most
/// eight at once); a child deleted since is left out; none when all of the kind are in other
/// namespaces. Otherwise (none of the kind listed, more than 64 of them with one to read, or the
/// request does not list them all), one LIST of the namespace from the watch
/// cache, kept to the owner's children: a read that grows with the namespace. So too when a
/// reconcile of this key here wrote an object of kind `K` (through
/// [`Controller::client`](crate::Controller::client)) that the request does not show yet,
/// a LIST at least as new as that write: a child just created is found. One created through
/// another client, or by another replica, is found by the LIST only: write children by
/// server-side apply (idempotent), as kube-rs's guide does.
pub async fn children<K, O>(api: &Api<K>, owner: &O) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    K::Scope: 'static,
    O: Resource,
{
    let Some(uid) = owner.meta().uid.clone() else {
        return Ok(Vec::new());
    };
    let known = children::of_this_reconcile();
    let controlled_by_owner = |k: &K| {
        k.owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == uid)
    };
    // Listed completely, and some of the kind: taken from the request or read by name. None of
    // the kind listed (the kind may not be an owned one), or more to read than a LIST costs: one
    // LIST. Some of the kind listed, none in `api`'s namespace: none there.
    let of_kind: Vec<&children::Child> = known
        .as_deref()
        .filter(|c| c.is_complete())
        .map(|c| c.of::<K>().collect())
        .unwrap_or_default();
    let named: Vec<children::Child> = of_kind
        .iter()
        .filter(|c| api.namespace().is_none_or(|ns| c.namespace == ns))
        .map(|c| (*c).clone())
        .collect();
    // A write of the kind here for this key that the request does not show yet (the
    // dispatcher's watch is behind it): what it made may be missing, so one LIST, at least as
    // new as the write.
    let shown = named
        .iter()
        .filter_map(|c| c.resource_version.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let written = crate::own_writes::written_newer_than(
        &crate::own_writes::resource_key(
            &K::group(&()),
            &K::plural(&()),
            api.namespace().unwrap_or_default(),
        ),
        shown,
    );
    if written.is_none() && !of_kind.is_empty() && named.is_empty() {
        return Ok(Vec::new());
    }
    // Read by name: in `api`'s namespace, or for a cluster-scoped kind. An `Api::all` of a
    // namespaced kind cannot read by name; with a child to read, it goes to the LIST, which
    // refuses it.
    let by_name = api.namespace().is_some()
        || TypeId::of::<K::Scope>() != TypeId::of::<NamespaceResourceScope>();
    let carried: Vec<Option<K>> = named.iter().map(children::Child::object::<K>).collect();
    let to_read = carried.iter().filter(|c| c.is_none()).count();
    if written.is_none()
        && !named.is_empty()
        && (to_read == 0 || (by_name && named.len() <= MAX_CHILD_READS))
    {
        let read: Vec<Option<K>> = futures::stream::iter(named.into_iter().zip(carried))
            .map(|(child, carried)| async move {
                match carried {
                    Some(object) => Ok(Some(object)),
                    None => read_at(api, &child.name, &child.resource_version).await,
                }
            })
            .buffered(CHILD_READS_AT_ONCE)
            .try_collect()
            .await?;
        return Ok(read
            .into_iter()
            .flatten()
            .filter(controlled_by_owner)
            .collect());
    }
    let written = written.map(|v| v.to_string());
    let floor = newest(
        [owner.meta().resource_version.as_deref(), written.as_deref()],
        known.as_deref(),
    );
    let listed = list_not_older(api, &floor).await?;
    Ok(listed.into_iter().filter(controlled_by_owner).collect())
}

/// The object `name`, at least as new as `version`, from the API server's watch cache: no read
/// of etcd, where a read without a version is a quorum read. A cache that has not caught up
/// within its wait (`504`, too large a resource version), a cache not ready yet (`503`), or a
/// version it cannot take (`400`, `410`, `500`), is read consistently instead. `None` if it does
/// not exist; without a version, a consistent read.
pub(crate) async fn read_at<K>(
    api: &Api<K>,
    name: &str,
    version: &str,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if version.is_empty() {
        return api.get_opt(name).await;
    }
    match api.get_with(name, &GetParams::at(version)).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(kube::Error::Api(e)) if watch_cache_cannot_serve(e.code) => api.get_opt(name).await,
        Err(e) => Err(e),
    }
}

/// The objects of `api`'s namespace that `keep` accepts, whole: what a reflector store's
/// `find` or its filtered `state()` answered.
pub async fn find<K>(api: &Api<K>, keep: impl Fn(&K) -> bool) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    K::Scope: 'static,
{
    let known = children::of_this_reconcile();
    let floor = newest([], known.as_deref());
    Ok(list_not_older(api, &floor)
        .await?
        .into_iter()
        .filter(|k| keep(k))
        .collect())
}

/// One LIST of `api`, at least as new as `floor`; one the watch cache cannot serve at that
/// version is made consistently instead.
async fn list_not_older<K>(api: &Api<K>, floor: &str) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    K::Scope: 'static,
{
    if TypeId::of::<K::Scope>() == TypeId::of::<NamespaceResourceScope>()
        && api.namespace().is_none()
    {
        return Err(kube::Error::Service(
            format!(
                "kube-dispatch: a read of {} across every namespace would read the whole kind; use Api::namespaced",
                K::kind(&())
            )
            .into(),
        ));
    }
    let params = ListParams::default()
        .at(floor)
        .matching(VersionMatch::NotOlderThan);
    match api.list(&params).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if watch_cache_cannot_serve(status.code) => {
            Ok(api.list(&ListParams::default()).await?.items)
        }
        Err(e) => Err(e),
    }
}

/// Whether a read at a resourceVersion should be made consistently instead: the version is
/// too old or not in the watch cache yet (400, 410, 504), or the cache is not ready (500, 503).
fn watch_cache_cannot_serve(code: u16) -> bool {
    matches!(code, 400 | 410 | 500 | 503 | 504)
}

/// The newest of `versions` and of the children's versions, as a resourceVersion ("0", any,
/// when none is known).
fn newest<'a>(
    versions: impl IntoIterator<Item = Option<&'a str>>,
    known: Option<&'a Children>,
) -> String {
    let children = known
        .into_iter()
        .flat_map(|c| c.iter().map(|c| Some(c.resource_version.as_str())));
    versions
        .into_iter()
        .chain(children)
        .flatten()
        .filter_map(|v| v.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn the_floor_is_the_newest_version_known() {
        assert_eq!(newest([Some("7"), None, Some("x")], None), "7");
        assert_eq!(newest([], None), "0");
    }

    /// A client whose API server answers every GET by `answer(path)` and records the paths.
    fn answering(answer: fn(&str) -> String) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let body = answer(request.uri().path());
            seen.lock().unwrap().push(request.uri().to_string());
            let response = http::Response::new(kube::client::Body::from(body.into_bytes()));
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        (kube::Client::new(service, "default"), asked)
    }

    /// A ConfigMap `settings` in `namespace`, controlled by the owner of uid `owner`.
    fn settings(namespace: &str) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"settings","namespace":"{namespace}","resourceVersion":"40","ownerReferences":[{{"apiVersion":"example.dev/v1","kind":"Tenant","name":"t","uid":"owner","controller":true}}]}}}}"#
        )
    }

    /// The children of a cluster-scoped owner: a ConfigMap `settings` in each of two
    /// namespaces, complete, with their bodies if `bodies`.
    fn two_namespaces(bodies: bool) -> Option<Children> {
        let child = |namespace: &str| kube_dispatch_proto::v1::OwnedObject {
            object: Some(kube_dispatch_proto::v1::ObjectKey {
                version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: namespace.into(),
                name: "settings".into(),
                ..Default::default()
            }),
            uid: format!("uid-{namespace}"),
            resource_version: "40".into(),
            object_json: if bodies {
                settings(namespace).into_bytes()
            } else {
                Vec::new()
            },
        };
        Children::from_request(&kube_dispatch_proto::v1::ReconcileRequest {
            children: vec![child("team-a"), child("team-b")],
            children_state: kube_dispatch_proto::v1::ChildrenState::Complete as i32,
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn a_cluster_scoped_owners_children_are_read_in_their_own_namespaces() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let mut owner = ConfigMap::default();
        owner.metadata.uid = Some("owner".into());
        let namespaces = |maps: Vec<ConfigMap>| -> Vec<String> {
            maps.into_iter()
                .filter_map(|m| m.metadata.namespace)
                .collect()
        };

        // Namespaced: only that namespace's child, read there by name.
        let (client, asked) = answering(|path| {
            assert_eq!(path, "/api/v1/namespaces/team-a/configmaps/settings");
            settings("team-a")
        });
        let api = Api::<ConfigMap>::namespaced(client, "team-a");
        let read = children::scope(two_namespaces(false), children(&api, &owner)).await;
        assert_eq!(namespaces(read.expect("read")), ["team-a"]);
        assert_eq!(asked.lock().unwrap().len(), 1);

        // A namespace where the owner has none of the kind: none, and no request.
        let (client, asked) = answering(|path| panic!("no request expected: {path}"));
        let api = Api::<ConfigMap>::namespaced(client, "team-c");
        let read = children::scope(two_namespaces(false), children(&api, &owner)).await;
        assert!(read.expect("none").is_empty());
        assert!(asked.lock().unwrap().is_empty());

        // Across namespaces, with every body carried: both, and no request.
        let (client, asked) = answering(|path| panic!("no request expected: {path}"));
        let api = Api::<ConfigMap>::all(client);
        let read = children::scope(two_namespaces(true), children(&api, &owner)).await;
        assert_eq!(namespaces(read.expect("taken")), ["team-a", "team-b"]);
        assert!(asked.lock().unwrap().is_empty());

        // Across namespaces, with a child to read: refused, as its LIST would be, unread.
        let (client, asked) = answering(|path| panic!("no request expected: {path}"));
        let api = Api::<ConfigMap>::all(client);
        let refused = children::scope(two_namespaces(false), children(&api, &owner)).await;
        assert!(refused.is_err(), "{refused:?}");
        assert!(asked.lock().unwrap().is_empty());
    }

    /// A reconcile here created a child its request does not show yet (the dispatcher's watch
    /// is behind): one LIST at least as new as the write finds it, until a request shows it.
    #[tokio::test]
    async fn a_child_written_here_that_the_request_does_not_show_is_listed() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let mut owner = ConfigMap::default();
        owner.metadata.uid = Some("owner".into());
        let written = Arc::new(crate::own_writes::Written::new());
        let request = |version: &str| {
            let child = kube_dispatch_proto::v1::OwnedObject {
                object: Some(kube_dispatch_proto::v1::ObjectKey {
                    version: "v1".into(),
                    kind: "ConfigMap".into(),
                    namespace: "team-a".into(),
                    name: "settings".into(),
                    ..Default::default()
                }),
                uid: "uid-settings".into(),
                resource_version: version.into(),
                object_json: settings("team-a").into_bytes(),
            };
            Children::from_request(&kube_dispatch_proto::v1::ReconcileRequest {
                children: vec![child],
                children_state: kube_dispatch_proto::v1::ChildrenState::Complete as i32,
                ..Default::default()
            })
        };
        let (client, asked) = answering(|path| {
            assert_eq!(path, "/api/v1/namespaces/team-a/configmaps");
            let other = settings("team-a").replace(r#""name":"settings""#, r#""name":"more""#);
            format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMapList","metadata":{{"resourceVersion":"45"}},"items":[{},{other}]}}"#,
                settings("team-a")
            )
        });
        let api = Api::<ConfigMap>::namespaced(client, "team-a");
        let names = |maps: Vec<ConfigMap>| -> Vec<String> {
            maps.into_iter().filter_map(|m| m.metadata.name).collect()
        };
        let read = |version: &'static str| {
            let written = written.clone();
            let api = api.clone();
            let owner = owner.clone();
            async move {
                crate::own_writes::as_reconcile_of("/ConfigMap/team-a/t", written, async move {
                    children::scope(request(version), children(&api, &owner)).await
                })
                .await
            }
        };

        // Nothing written here: the child is taken from the request.
        assert_eq!(names(read("40").await.expect("taken")), ["settings"]);
        assert!(asked.lock().unwrap().is_empty());

        // A child of the kind written at 45, the request showing 40: one LIST, not older.
        crate::own_writes::as_reconcile_of("/ConfigMap/team-a/t", written.clone(), async {
            crate::own_writes::wrote_resource("/configmaps/team-a", 45);
        })
        .await;
        assert_eq!(
            names(read("40").await.expect("listed")),
            ["settings", "more"]
        );
        let asked_now = asked.lock().unwrap().clone();
        assert_eq!(asked_now.len(), 1, "{asked_now:?}");
        assert!(
            asked_now[0].contains("resourceVersion=45")
                && asked_now[0].contains("resourceVersionMatch=NotOlderThan"),
            "{asked_now:?}"
        );

        // A request that shows the write: taken from it again, and the write forgotten.
        assert_eq!(names(read("45").await.expect("taken")), ["settings"]);
        assert_eq!(names(read("40").await.expect("taken")), ["settings"]);
        assert_eq!(asked.lock().unwrap().len(), 1);
    }

    #[test]
    fn versions_the_watch_cache_cannot_serve_are_read_consistently() {
        for code in [400, 410, 500, 503, 504] {
            assert!(watch_cache_cannot_serve(code), "{code}");
        }
        for code in [403, 404, 409, 429] {
            assert!(!watch_cache_cannot_serve(code), "{code}");
        }
    }
}
