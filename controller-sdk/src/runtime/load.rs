//! The object a delivery is about: the body the dispatcher sent, a fresh read, or for a deletion
//! the last known state or a tombstone.

use kube::{
    Api, Resource,
    api::{ApiResource, DynamicObject},
};
use kube_dispatch_proto::v1::ReconcileRequest;

use super::shared::{Shared, Types};
use crate::Error;

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

/// The object to reconcile: the body the dispatcher sent, or a fresh read. For a deletion, the
/// last known state marked with a deletion timestamp (so a finalizer-free controller can clean
/// up), else a tombstone built from the request, or `None` when the type cannot be built from
/// metadata alone.
pub(super) async fn load<T: Types>(
    shared: &Shared<T>,
    request: &ReconcileRequest,
) -> Result<Option<T::K>, Error<T::E>> {
    let decode = |bytes: &[u8]| {
        serde_json::from_slice::<T::K>(bytes).map_err(|source| Error::Decode {
            key: request.key.clone(),
            kind: T::K::kind(&shared.dyntype).into_owned(),
            source,
        })
    };
    let full = shared.full_payload;
    if request.deleted {
        if request.object_json.is_empty() || !full {
            // No last state (a deletion found by a re-list, or a payload without bodies): a
            // tombstone with what the request says, if the type can be built from metadata
            // alone; otherwise there is nothing to hand over.
            return Ok(tombstone(shared, request).and_then(|json| decode(&json).ok()));
        }
        let mut object = decode(&request.object_json)?;
        let meta = object.meta_mut();
        if meta.deletion_timestamp.is_none() {
            meta.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        }
        return Ok(Some(object));
    }
    if full && !request.object_json.is_empty() {
        return decode(&request.object_json).map(Some);
    }
    let Some(key) = request.object.as_ref() else {
        return Ok(None);
    };
    // Through the dynamic API, so one code path serves namespaced and cluster-scoped kinds.
    let resource = ApiResource::erase::<T::K>(&shared.dyntype);
    let api: Api<DynamicObject> = if key.namespace.is_empty() {
        Api::all_with(shared.client.clone(), &resource)
    } else {
        Api::namespaced_with(shared.client.clone(), &key.namespace, &resource)
    };
    let read = api
        .get_opt(&key.name)
        .await
        .map_err(|source| Error::ObjectRead {
            key: request.key.clone(),
            source,
        })?;
    let Some(object) = read else { return Ok(None) };
    let json = serde_json::to_vec(&object).map_err(|source| Error::Decode {
        key: request.key.clone(),
        kind: T::K::kind(&shared.dyntype).into_owned(),
        source,
    })?;
    decode(&json).map(Some)
}
