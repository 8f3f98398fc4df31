//! What a controller asks of the API server. [`Controller::client`](crate::Controller::client)
//! gives the controller's client wrapped so that every request it sends is counted by verb
//! (`kube_dispatch_api_requests_total{controller, verb}`); the SDK's own fresh reads of objects
//! go through it too. Divided by `controller_runtime_reconcile_total`, it is what a reconcile
//! costs the API server, the figure a controller without a cache is judged by.
//!
//! Requests are counted as they are sent, whichever task sends them. (kube's client hands each
//! request to a worker task before it reaches this wrapper, so a request cannot be told apart
//! by the reconcile that made it: the counts are the controller's, not a reconcile's.)

use std::sync::Arc;

use http::{Method, Request};
use kube::client::Body;
use prometheus_client::metrics::counter::Counter;

/// The kinds of API request, as the API server's audit log names their verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// A GET of one object.
    Get,
    /// A GET of a collection.
    List,
    /// A GET with `watch=true`.
    Watch,
    /// A POST.
    Create,
    /// A PUT.
    Update,
    /// A PATCH (server-side apply included).
    Patch,
    /// A DELETE of one object or of a collection.
    Delete,
}

impl Verb {
    /// Every verb, in the order of [`RequestCounts`].
    pub const ALL: [Verb; 7] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }

    /// The verb of `request`: its method, and for a GET whether it watches and whether its path
    /// names one object (`/api/v1/namespaces/ns/configmaps/name`) or a collection. `None` for a
    /// request that is not about objects (discovery: `/version`, `/apis`, `/apis/<group>/<v>`).
    pub fn of<B>(request: &Request<B>) -> Option<Verb> {
        let one = names_one_object(request.uri().path())?;
        Some(match *request.method() {
            Method::GET => {
                let watch = request
                    .uri()
                    .query()
                    .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
                if watch {
                    Verb::Watch
                } else if one {
                    Verb::Get
                } else {
                    Verb::List
                }
            }
            Method::POST => Verb::Create,
            Method::PUT => Verb::Update,
            Method::PATCH => Verb::Patch,
            Method::DELETE => Verb::Delete,
            _ => return None,
        })
    }
}

/// Whether `path` names one object rather than a collection: after `/api/v1` or
/// `/apis/<group>/<version>`, `namespaces/<ns>/<plural>/<name>...` or `<plural>/<name>...`
/// (`namespaces/<ns>` alone is the Namespace object). `None` for a path that names neither
/// (discovery).
fn names_one_object(path: &str) -> Option<bool> {
    let mut parts = path.trim_matches('/').split('/');
    let rest: Vec<&str> = match parts.next() {
        Some("api") => parts.skip(1).collect(),
        Some("apis") => parts.skip(2).collect(),
        _ => return None,
    };
    match rest.as_slice() {
        [] | [""] => None,
        ["namespaces", _] => Some(true),
        ["namespaces", _, _plural, ..] => Some(rest.len() >= 4),
        [_plural, ..] => Some(rest.len() >= 2),
    }
}

/// Requests counted by verb, in [`Verb::ALL`] order.
#[derive(Clone, Debug, Default)]
pub struct RequestCounts(pub(crate) [Counter; 7]);

impl RequestCounts {
    /// The requests of `verb` so far.
    pub fn of(&self, verb: Verb) -> u64 {
        self.0[verb as usize].get()
    }

    /// Every request so far.
    pub fn total(&self) -> u64 {
        self.0.iter().map(Counter::get).sum()
    }

    fn count(&self, verb: Verb) {
        self.0[verb as usize].inc();
    }
}

/// The resource a request's path is about and its namespace, as `group/plural/namespace`
/// (`/secrets/team-a`, `apps/deployments/team-a`, `/nodes/`): after `/api/v1` or
/// `/apis/<group>/<version>`, the plural after `namespaces/<ns>/`, or the first part
/// (`namespaces` itself for a Namespace, which is in none). `None` for discovery. What
/// [`crate::own_writes::resource_key`] makes of a kind and an `Api`'s namespace.
pub(crate) fn resource_of(path: &str) -> Option<String> {
    let mut parts = path.trim_matches('/').split('/');
    let group = match parts.next() {
        Some("api") => "",
        Some("apis") => parts.next()?,
        _ => return None,
    };
    let rest: Vec<&str> = parts.skip(1).collect();
    let (plural, namespace) = match rest.as_slice() {
        ["namespaces", _, "status" | "finalize"] => ("namespaces", ""),
        ["namespaces", namespace, plural, ..] => (*plural, *namespace),
        [plural, ..] if !plural.is_empty() => (*plural, ""),
        _ => return None,
    };
    Some(crate::own_writes::resource_key(group, plural, namespace))
}

/// The `metadata.resourceVersion` of an object's JSON, as the number it is, if the object has
/// a controller (an owner reference with `controller: true`): a child's, which
/// [`crate::reads::children`] looks for. Other objects a reconcile writes (its own object's
/// status, Events, objects it does not control) are of no concern to it.
fn child_version_of(json: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    struct Metadata {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
        #[serde(rename = "ownerReferences", default)]
        owner_references: Vec<OwnerReference>,
    }
    #[derive(serde::Deserialize)]
    struct OwnerReference {
        #[serde(default)]
        controller: Option<bool>,
    }
    let metadata = serde_json::from_slice::<Object>(json).ok()?.metadata;
    metadata
        .owner_references
        .iter()
        .any(|r| r.controller == Some(true))
        .then(|| metadata.resource_version.parse().ok())
        .flatten()
}

/// `client`, counting each request it sends into `counts` (by [`Verb::of`]; discovery is not
/// counted). What [`Controller::client`](crate::Controller::client) gives; also for counting a
/// client of one's own, an incumbent controller's for example, the same way.
///
/// A write a reconcile makes through it (create, update or patch, not a dry run) of an object
/// with a controller is also noted for the reconcile's key with the version the API server
/// answered, so that [`reads::children`](crate::reads::children) lists rather than trust a
/// later request that does not show it yet. Only writes made in the reconcile's own task are
/// seen: not those of a task it spawns.
pub fn counted(client: kube::Client, counts: Arc<RequestCounts>) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: Request<Body>| {
        let verb = Verb::of(&request);
        if let Some(verb) = verb {
            counts.count(verb);
        }
        let dry_run = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p.starts_with("dryRun=")));
        let written = (matches!(verb, Some(Verb::Create | Verb::Update | Verb::Patch)) && !dry_run)
            .then(|| resource_of(request.uri().path()))
            .flatten();
        let client = client.clone();
        // Run in the task that sent the request (kube's worker hands this future back to it):
        // a reconcile's, where it has one.
        async move {
            let response = client.send(request).await?;
            match written {
                Some(resource)
                    if response.status().is_success() && crate::own_writes::in_reconcile() =>
                {
                    // One object's answer, which the caller reads whole anyway.
                    let (parts, body) = response.into_parts();
                    let bytes = body.collect_bytes().await?;
                    if let Some(version) = child_version_of(&bytes) {
                        crate::own_writes::wrote_resource(&resource, version);
                    }
                    Ok::<_, kube::Error>(http::Response::from_parts(parts, Body::from(bytes)))
                }
                _ => Ok(response),
            }
        }
    });
    kube::Client::new(service, namespace)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        Api,
        api::{ListParams, Patch, PatchParams},
    };

    use super::*;

    #[test]
    fn a_request_is_named_by_its_method_and_path() {
        let verb = |method: Method, uri: &str| {
            Verb::of(&Request::builder().method(method).uri(uri).body(()).unwrap())
        };
        for (method, uri, want) in [
            (Method::GET, "/api/v1/namespaces/ns/configmaps/c", Verb::Get),
            (Method::GET, "/api/v1/namespaces/ns/configmaps", Verb::List),
            (
                Method::GET,
                "/api/v1/namespaces/ns/configmaps?labelSelector=a",
                Verb::List,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=1",
                Verb::Watch,
            ),
            (Method::GET, "/api/v1/namespaces/ns", Verb::Get),
            (Method::GET, "/api/v1/namespaces", Verb::List),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/ns/deployments/d/status",
                Verb::Get,
            ),
            (Method::GET, "/apis/example.dev/v1/widgets", Verb::List),
            (Method::GET, "/apis/example.dev/v1/widgets/w", Verb::Get),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/configmaps/c",
                Verb::Patch,
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/configmaps",
                Verb::Create,
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/ns/configmaps/c",
                Verb::Update,
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/configmaps/c",
                Verb::Delete,
            ),
        ] {
            assert_eq!(verb(method.clone(), uri), Some(want), "{method} {uri}");
        }
        for discovery in ["/version", "/api", "/api/v1", "/apis", "/apis/apps/v1"] {
            assert_eq!(verb(Method::GET, discovery), None, "{discovery}");
        }
    }

    #[test]
    fn a_request_names_its_resource_by_group_plural_and_namespace() {
        for (path, want) in [
            ("/api/v1/namespaces/ns/secrets", Some("/secrets/ns")),
            ("/api/v1/namespaces/ns/secrets/s", Some("/secrets/ns")),
            (
                "/apis/apps/v1/namespaces/ns/deployments/d/status",
                Some("apps/deployments/ns"),
            ),
            (
                "/apis/example.dev/v1/widgets/w",
                Some("example.dev/widgets/"),
            ),
            ("/api/v1/namespaces/ns", Some("/namespaces/")),
            ("/api/v1/namespaces/ns/finalize", Some("/namespaces/")),
            ("/api/v1/nodes", Some("/nodes/")),
            ("/api/v1", None),
            ("/apis/apps/v1", None),
            ("/version", None),
        ] {
            assert_eq!(resource_of(path).as_deref(), want, "{path}");
        }
    }

    /// Every request the wrapped client sends is counted by its verb.
    #[tokio::test]
    async fn the_client_counts_each_request_by_verb() {
        let answer = tower::service_fn(|request: Request<Body>| async move {
            let body = if request.uri().path().ends_with("configmaps") {
                r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{},"items":[]}"#
            } else {
                r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"ns"}}"#
            };
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(
                body.as_bytes().to_vec(),
            )))
        });
        let counts = Arc::new(RequestCounts::default());
        let api: Api<ConfigMap> = Api::namespaced(
            counted(kube::Client::new(answer, "ns"), counts.clone()),
            "ns",
        );
        api.get("c").await.unwrap();
        api.get("c").await.unwrap();
        api.list(&ListParams::default()).await.unwrap();
        api.patch(
            "c",
            &PatchParams::apply("t"),
            &Patch::Apply(serde_json::json!({})),
        )
        .await
        .unwrap();
        assert_eq!(
            Verb::ALL.map(|v| counts.of(v)),
            [2, 1, 0, 0, 0, 1, 0],
            "get, list, watch, create, update, patch, delete"
        );
        assert_eq!(counts.total(), 4);
    }

    /// A reconcile's write of a child (an object with a controller) is noted for its key at
    /// the version the API server answered; a read, a dry run, a write of an object with no
    /// controller, or a write outside a reconcile, is not.
    #[tokio::test]
    async fn a_reconciles_writes_are_noted_with_the_version_answered() {
        let answer = tower::service_fn(|request: Request<Body>| async move {
            // The object named `orphan` has no controller.
            let owners = if request.uri().path().ends_with("orphan") {
                ""
            } else {
                r#","ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"o","uid":"u","controller":true}]"#
            };
            let body = format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c","namespace":"ns","resourceVersion":"77"{owners}}}}}"#
            );
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(body.into_bytes())))
        });
        let api: Api<ConfigMap> = Api::namespaced(
            counted(kube::Client::new(answer, "ns"), Arc::default()),
            "ns",
        );
        let written = Arc::new(crate::own_writes::Written::new());
        let (params, patch) = (PatchParams::apply("t"), Patch::Apply(serde_json::json!({})));
        let apply = || api.patch("c", &params, &patch);
        apply().await.expect("outside a reconcile");
        crate::own_writes::as_reconcile_of("k", written.clone(), async {
            api.get("c").await.expect("read");
            api.patch("c", &PatchParams::apply("t").dry_run(), &patch)
                .await
                .expect("a dry run");
            api.patch("orphan", &params, &patch)
                .await
                .expect("no controller");
        })
        .await;
        assert_eq!(
            written.newer_than("k", "/configmaps/ns", 0),
            None,
            "a read, a dry run, an object with no controller"
        );
        let answered = crate::own_writes::as_reconcile_of("k", written.clone(), apply())
            .await
            .expect("written");
        assert_eq!(
            answered.metadata.resource_version.as_deref(),
            Some("77"),
            "the answer reaches the caller whole"
        );
        assert_eq!(written.newer_than("k", "/configmaps/ns", 70), Some(77));
    }
}
