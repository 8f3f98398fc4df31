//! The object a delivery is about: the body the dispatcher sent, a fresh read, or for a deletion
//! the last known state or a tombstone.

use kube::{
    Api, Resource,
    api::{ApiResource, DynamicObject},
};
use std::sync::Arc;

use kube_dispatch_proto::v1::{Reason, ReconcileRequest};

use super::shared::{Shared, Types};
use crate::{Error, metrics::Source, reads::read_at as read};

/// A deleted object as JSON from the request alone: type, name, namespace, uid,
/// resourceVersion and a deletion timestamp.
fn tombstone<T: Types>(shared: &Shared<T>, request: &ReconcileRequest) -> Option<Vec<u8>> {
    let key = request.object.as_ref()?;
    let mut metadata = serde_json::json!({
        "name": key.name,
        "deletionTimestamp": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ),
    });
    for (field, value) in [
        ("namespace", &key.namespace),
        ("uid", &request.uid),
        ("resourceVersion", &request.resource_version),
    ] {
        if !value.is_empty() {
            metadata[field] = value.clone().into();
        }
    }
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": T::K::api_version(&shared.dyntype),
        "kind": T::K::kind(&shared.dyntype),
        "metadata": metadata,
    }))
    .ok()
}

/// The object to reconcile: the body the dispatcher sent, the object as this replica last
/// reconciled it when the request names that very version ([`super::recent`]), or a fresh read.
/// For a deletion, the last known state marked with a deletion timestamp (so a finalizer-free
/// controller can clean up), else a tombstone built from the request, or `None` when the type
/// cannot be built from metadata alone.
pub(super) async fn load<T: Types>(
    shared: &Shared<T>,
    request: &ReconcileRequest,
) -> Result<Option<Arc<T::K>>, Error<T::E>> {
    let decode = |bytes: &[u8]| {
        serde_json::from_slice::<T::K>(bytes).map_err(|source| Error::Decode {
            key: request.key.clone(),
            kind: T::K::kind(&shared.dyntype).into_owned(),
            source,
        })
    };
    let full = shared.full_payload;
    if request.deleted {
        shared.forget(&request.key);
        shared.metrics.loaded(Source::Request);
        if request.object_json.is_empty() || !full {
            // No last state (a deletion found by a re-list, or a payload without bodies): a
            // tombstone with what the request says, if the type can be built from metadata
            // alone; otherwise there is nothing to hand over.
            return Ok(tombstone(shared, request)
                .and_then(|json| decode(&json).ok())
                .map(Arc::new));
        }
        let mut object = decode(&request.object_json)?;
        let meta = object.meta_mut();
        if meta.deletion_timestamp.is_none() {
            meta.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        }
        return Ok(Some(Arc::new(object)));
    }
    let keep = |object: T::K, json_len: usize| {
        let object = Arc::new(object);
        let meta = object.meta();
        let version = meta.resource_version.as_deref().unwrap_or_default();
        let uid = meta.uid.as_deref().unwrap_or_default();
        shared
            .recent
            .keep(&request.key, (version, uid), object.clone(), json_len);
        object
    };
    // A delivery for another object's change (a child's, say) names the version the
    // dispatcher's watch last showed; a reconcile here may have written a newer one since.
    if Reason::try_from(request.reason).is_ok_and(kube_dispatch_proto::is_related)
        && let Some(object) =
            shared
                .recent
                .newer(&request.key, &request.resource_version, &request.uid)
    {
        shared.metrics.loaded(Source::Recent);
        return Ok(Some(object));
    }
    if full && !request.object_json.is_empty() {
        shared.metrics.loaded(Source::Request);
        let object = decode(&request.object_json)?;
        return Ok(Some(keep(object, request.object_json.len())));
    }
    if let Some(object) = shared
        .recent
        .get(&request.key, &request.resource_version, &request.uid)
    {
        shared.metrics.loaded(Source::Recent);
        return Ok(Some(object));
    }
    let Some(key) = request.object.as_ref() else {
        return Ok(None);
    };
    shared.metrics.loaded(Source::Read);
    tracing::debug!(
        key = request.key,
        reason = request.reason,
        "reading the object: its request carries no body"
    );
    // Through the dynamic API, so one code path serves namespaced and cluster-scoped kinds.
    let resource = ApiResource::erase::<T::K>(&shared.dyntype);
    let api: Api<DynamicObject> = if key.namespace.is_empty() {
        Api::all_with(shared.client.clone(), &resource)
    } else {
        Api::namespaced_with(shared.client.clone(), &key.namespace, &resource)
    };
    let read = read(&api, &key.name, &request.resource_version)
        .await
        .map_err(|source| Error::ObjectRead {
            key: request.key.clone(),
            source,
        })?;
    let Some(object) = read else {
        shared.forget(&request.key);
        return Ok(None);
    };
    let json = serde_json::to_vec(&object).map_err(|source| Error::Decode {
        key: request.key.clone(),
        kind: T::K::kind(&shared.dyntype).into_owned(),
        source,
    })?;
    let object = decode(&json)?;
    Ok(Some(keep(object, json.len())))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::{api::ApiResource, client::Body};

    use super::*;

    /// A client whose API server answers each GET by `answer(query)` and records the queries.
    fn client(
        answer: fn(Option<&str>) -> (u16, &'static str),
    ) -> (Api<DynamicObject>, Arc<Mutex<Vec<String>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let query = request.uri().query().map(str::to_owned);
            let asked = query.as_deref().unwrap_or_default().trim_start_matches('&');
            seen.lock().unwrap().push(asked.to_owned());
            let (status, body) = answer(query.as_deref());
            let mut response = Response::new(Body::from(body.as_bytes().to_vec()));
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let api = Api::namespaced_with(kube::Client::new(service, "ns"), "ns", &resource);
        (api, asked)
    }

    const FOUND: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"ns","resourceVersion":"9"}}"#;
    const TOO_NEW: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Timeout","message":"Too large resource version","code":504}"#;
    const NOT_FOUND: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","message":"not found","code":404}"#;

    #[tokio::test]
    async fn an_object_is_read_from_the_watch_cache_at_least_as_new_as_its_delivery() {
        let (api, asked) = client(|_| (200, FOUND));
        let got = read(&api, "c", "7").await.expect("read");
        assert_eq!(
            got.and_then(|o| o.metadata.resource_version),
            Some("9".into())
        );
        assert_eq!(*asked.lock().unwrap(), ["resourceVersion=7"]);

        let (api, asked) = client(|_| (404, NOT_FOUND));
        assert!(
            read(&api, "c", "7")
                .await
                .expect("a 404 is an answer")
                .is_none()
        );
        assert_eq!(asked.lock().unwrap().len(), 1, "no second read");
    }

    #[tokio::test]
    async fn a_cache_that_has_not_caught_up_is_read_consistently_instead() {
        let (api, asked) = client(|query| match query {
            Some(q) if q.contains("resourceVersion") => (504, TOO_NEW),
            _ => (200, FOUND),
        });
        assert!(read(&api, "c", "7").await.expect("read").is_some());
        assert_eq!(*asked.lock().unwrap(), ["resourceVersion=7", ""]);

        let (api, asked) = client(|_| (200, FOUND));
        read(&api, "c", "").await.expect("read");
        assert_eq!(
            *asked.lock().unwrap(),
            [""],
            "no version known: a consistent read"
        );
    }
}
