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

/// `client`, counting each request it sends into `counts` (by [`Verb::of`]; discovery is not
/// counted). What [`Controller::client`](crate::Controller::client) gives; also for counting a
/// client of one's own, an incumbent controller's for example, the same way.
pub fn counted(client: kube::Client, counts: Arc<RequestCounts>) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |request: Request<Body>| {
        if let Some(verb) = Verb::of(&request) {
            counts.count(verb);
        }
        let client = client.clone();
        async move { client.send(request).await }
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
}
