//! Server-side sharding: on a ring keyed by namespace, a dispatcher's object watches ask the API
//! server for the namespaces this dispatcher owns only, with the `shardSelector` parameter of
//! LIST and WATCH (Kubernetes 1.36, alpha, feature gate `ShardedListAndWatch`), so it neither
//! receives nor decodes the others' objects.
//!
//! kube-rs has no field for the parameter: the watch's client appends it to every GET it sends
//! (the watch and its lists are the only requests that client makes), read from the slice at
//! the time, so a watch restarted after a ring change asks for the ranges owned then. An API
//! server without the feature ignores the parameter and sends everything; the dispatcher filters
//! by its ring either way (`routing::place`), so nothing else depends on the server applying it.

use std::sync::Arc;

use kube::{Client, client::Body};
use kube_dispatch_core::handover::Slice;
use tokio::sync::watch;

/// The query parameter.
const PARAMETER: &str = "shardSelector";

/// `client`, with the `shardSelector` of the slice current at each request appended to its GET
/// requests (none on a ring keyed by name, or while this dispatcher owns every key).
pub(super) fn sharded_client(client: Client, slice: watch::Receiver<Arc<Slice>>) -> Client {
    let namespace = client.default_namespace().to_owned();
    let service = tower::service_fn(move |mut request: http::Request<Body>| {
        if request.method() == http::Method::GET
            && let Some(selector) = slice.borrow().shard_selector()
            && let Some(uri) = with_parameter(request.uri(), &selector)
        {
            *request.uri_mut() = uri;
        }
        let client = client.clone();
        async move { client.send(request).await }
    });
    Client::new(service, namespace)
}

/// `uri` with `shardSelector=<selector>` added to its query.
fn with_parameter(uri: &http::Uri, selector: &str) -> Option<http::Uri> {
    let encoded: String = form_urlencoded::byte_serialize(selector.as_bytes()).collect();
    let path = uri.path();
    let path_and_query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{path}?{query}&{PARAMETER}={encoded}"),
        _ => format!("{path}?{PARAMETER}={encoded}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use kube_dispatch_proto::{Ring, RingKey};

    use super::*;

    #[test]
    fn the_selector_is_added_to_the_query_encoded() {
        let selector =
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')";
        let uri: http::Uri = "/api/v1/configmaps?limit=500&watch=true".parse().unwrap();
        let sharded = with_parameter(&uri, selector).unwrap();
        assert_eq!(sharded.path(), "/api/v1/configmaps");
        let query: Vec<(String, String)> =
            form_urlencoded::parse(sharded.query().unwrap().as_bytes())
                .into_owned()
                .collect();
        assert_eq!(
            query,
            [
                ("limit".to_owned(), "500".to_owned()),
                ("watch".to_owned(), "true".to_owned()),
                (PARAMETER.to_owned(), selector.to_owned()),
            ]
        );
        let bare: http::Uri = "https://127.0.0.1:6443/api/v1/configmaps".parse().unwrap();
        let sharded = with_parameter(&bare, "x || y").unwrap();
        assert_eq!(sharded.host(), Some("127.0.0.1"));
        assert_eq!(sharded.query(), Some("shardSelector=x+%7C%7C+y"));
    }

    #[test]
    fn only_a_namespace_ring_that_is_split_asks_for_a_shard() {
        let two = Ring::with_key(["d0", "d1"], RingKey::Namespace);
        assert!(Slice::fixed("d0", two).shard_selector().is_some());
        let one = Ring::with_key(["d0"], RingKey::Namespace);
        assert_eq!(Slice::fixed("d0", one).shard_selector(), None);
        let by_name = Ring::new(["d0", "d1"]);
        assert_eq!(Slice::fixed("d0", by_name).shard_selector(), None);
    }
}
