//! Writes that fail when the object changed since the reconciler was given it: optimistic
//! concurrency on `metadata.resourceVersion`, as the Kubernetes API intends.
//!
//! # What exclusivity covers, and what it does not
//!
//! The dispatchers hand a key to one replica of a group at a time, and a replica cancels a
//! reconcile before its key can go to another replica (a session it could not renew, a reconcile
//! past its time limit). So no two reconciles of one key *run* at once. But a reconcile that is
//! cancelled may already have sent a write that the API server applies afterwards, while the
//! key's next reconcile, elsewhere, is running: cancelling a future does not recall a request in
//! flight. Exclusivity covers the reconciles; it does not cover writes already on the wire.
//!
//! A write made with the resourceVersion of the object the reconciler was given closes that
//! gap for the object itself: if anything changed the object since (the next reconcile's own
//! write above all), the API server refuses the stale write with 409 Conflict, and the helpers
//! here return [`WriteError::Stale`]. A reconciler treats that as "a newer reconcile is on it":
//! the change that made it stale is delivered again, so returning
//! `Ok(Action::await_change())` loses nothing.
//!
//! What it does not cover: writes to *other* objects (children created or patched with
//! server-side apply, deletions) carry no precondition on the owner. Make those idempotent
//! (apply the full desired state, delete by name), so that a late one is harmless or undone by
//! the next reconcile.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! # use kube::{Api, ResourceExt};
//! # use kube_dispatch_controller::{Action, precondition::{self, WriteError}};
//! async fn reconcile(cm: Arc<ConfigMap>, client: kube::Client) -> Result<Action, WriteError> {
//!     let api: Api<ConfigMap> = Api::namespaced(client, &cm.namespace().unwrap_or_default());
//!     let patch = serde_json::json!({ "metadata": { "annotations": { "example/seen": "yes" } } });
//!     match precondition::patch(&api, &cm, patch).await {
//!         // Changed meanwhile: the change is delivered again, and that reconcile writes.
//!         Err(e) if e.is_stale() => Ok(Action::await_change()),
//!         Err(e) => Err(e),
//!         Ok(_) => Ok(Action::await_change()),
//!     }
//! }
//! ```

use std::fmt::Debug;

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

/// A write with a resourceVersion precondition that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The API server answered 409 Conflict: the object changed since the resourceVersion the
    /// write was made against. A newer reconcile takes it from here.
    #[error(
        "{name} changed since resourceVersion {resource_version}: the write was refused (409 Conflict)"
    )]
    Stale {
        /// The object's name.
        name: String,
        /// The resourceVersion the write was made against.
        resource_version: String,
    },
    /// The object has no resourceVersion to write against (a tombstone of a deleted object).
    #[error("{name} has no resourceVersion to make the write conditional on")]
    NoResourceVersion {
        /// The object's name.
        name: String,
    },
    /// The patch is not a JSON object, so no resourceVersion can be added to it.
    #[error("a conditional patch must be a JSON object, not {0}")]
    NotAnObject(serde_json::Value),
    /// Any other failure of the call.
    #[error(transparent)]
    Api(kube::Error),
}

impl WriteError {
    /// Whether the write was refused because the object changed meanwhile.
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }

    fn from_kube<K: Resource>(seen: &K, resource_version: &str, error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if status.code == 409 => {
                crate::metrics::stale_write();
                Self::Stale {
                    name: seen.name_any(),
                    resource_version: resource_version.to_owned(),
                }
            }
            e => Self::Api(e),
        }
    }
}

/// The resourceVersion of `seen`, or why there is none.
fn resource_version<K: Resource>(seen: &K) -> Result<String, WriteError> {
    seen.resource_version()
        .filter(|rv| !rv.is_empty())
        .ok_or_else(|| WriteError::NoResourceVersion {
            name: seen.name_any(),
        })
}

/// `patch` (a JSON merge patch) with `metadata.resourceVersion` set to that of `seen`.
fn conditional(
    mut patch: serde_json::Value,
    resource_version: &str,
) -> Result<serde_json::Value, WriteError> {
    let metadata_is_object = patch
        .get("metadata")
        .is_none_or(serde_json::Value::is_object);
    match patch.as_object_mut() {
        Some(object) if metadata_is_object => {
            let metadata = object
                .entry("metadata")
                .or_insert_with(|| serde_json::json!({}));
            metadata["resourceVersion"] = resource_version.into();
            Ok(patch)
        }
        _ => Err(WriteError::NotAnObject(patch)),
    }
}

/// Applies the JSON merge patch `patch` to the object `seen` names, only if the object is still
/// at `seen`'s resourceVersion.
pub async fn patch<K>(api: &Api<K>, seen: &K, patch: serde_json::Value) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'static,
{
    let rv = resource_version(seen)?;
    let patch = conditional(patch, &rv)?;
    let written = api
        .patch(
            &seen.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
    answered(written).map_err(|e| WriteError::from_kube(seen, &rv, e))
}

/// Applies the JSON merge patch `patch` to the status of the object `seen` names (its `status`
/// subresource), only if the object is still at `seen`'s resourceVersion.
pub async fn patch_status<K>(
    api: &Api<K>,
    seen: &K,
    patch: serde_json::Value,
) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'static,
{
    let rv = resource_version(seen)?;
    let patch = conditional(patch, &rv)?;
    let written = api
        .patch_status(
            &seen.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
    answered(written).map_err(|e| WriteError::from_kube(seen, &rv, e))
}

/// Applies `patch` by server-side apply, as the field manager `manager` (forcing conflicts, as
/// a controller owns the fields it applies), to the object `seen` names, only if the object is
/// still at `seen`'s resourceVersion. The apply configuration gets `apiVersion`, `kind` and
/// `metadata.name` from `seen` where it lacks them, so `patch` may hold only what the
/// controller owns.
pub async fn apply<K>(
    api: &Api<K>,
    seen: &K,
    manager: &str,
    patch: serde_json::Value,
) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'static,
    K::DynamicType: Default,
{
    apply_to(api, seen, manager, patch, false).await
}

/// [`apply`] to the object's `status` subresource: the status a controller reports, as the
/// field manager `manager`, only if the object is still at `seen`'s resourceVersion.
///
/// ```no_run
/// # use k8s_openapi::api::apps::v1::Deployment;
/// # use kube::Api;
/// # use kube_dispatch_controller::precondition::{self, WriteError};
/// # async fn example(api: Api<Deployment>, seen: Deployment) -> Result<(), WriteError> {
/// let status = serde_json::json!({ "status": { "observedGeneration": 3 } });
/// match precondition::apply_status(&api, &seen, "my-controller", status).await {
///     // Changed meanwhile: the change is delivered again, and that reconcile reports.
///     Err(e) if e.is_stale() => Ok(()),
///     other => other.map(drop),
/// }
/// # }
/// ```
pub async fn apply_status<K>(
    api: &Api<K>,
    seen: &K,
    manager: &str,
    patch: serde_json::Value,
) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'static,
    K::DynamicType: Default,
{
    apply_to(api, seen, manager, patch, true).await
}

/// [`apply`] to the object, or to its `status` subresource.
async fn apply_to<K>(
    api: &Api<K>,
    seen: &K,
    manager: &str,
    patch: serde_json::Value,
    status: bool,
) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'static,
    K::DynamicType: Default,
{
    let rv = resource_version(seen)?;
    let patch = Patch::Apply(apply_configuration(seen, conditional(patch, &rv)?));
    let (name, params) = (seen.name_any(), PatchParams::apply(manager).force());
    let written = if status {
        api.patch_status(&name, &params, &patch).await
    } else {
        api.patch(&name, &params, &patch).await
    };
    answered(written).map_err(|e| WriteError::from_kube(seen, &rv, e))
}

/// `patch` (a JSON object, as [`conditional`] returns it) with the `apiVersion`, `kind` and
/// `metadata.name` server-side apply requires, from `seen` where it lacks them.
fn apply_configuration<K>(seen: &K, mut patch: serde_json::Value) -> serde_json::Value
where
    K: Resource,
    K::DynamicType: Default,
{
    let types = K::DynamicType::default();
    if let Some(object) = patch.as_object_mut() {
        object
            .entry("apiVersion")
            .or_insert_with(|| K::api_version(&types).into());
        object
            .entry("kind")
            .or_insert_with(|| K::kind(&types).into());
        if let Some(metadata) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            metadata
                .entry("name")
                .or_insert_with(|| seen.name_any().into());
        }
    }
    patch
}

/// Replaces the object with `object`, only if it is still at `object`'s resourceVersion (the
/// resourceVersion of the object the reconciler was given, when `object` is a modified copy of
/// it).
pub async fn replace<K>(api: &Api<K>, object: &K) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + 'static,
{
    let rv = resource_version(object)?;
    let written = api
        .replace(&object.name_any(), &PostParams::default(), object)
        .await;
    answered(written).map_err(|e| WriteError::from_kube(object, &rv, e))
}

/// What a write answered, told to the reconcile running in this task: when it wrote its own
/// object, the next delivery of the version it made is handed this without a read.
fn answered<K: 'static>(written: Result<K, kube::Error>) -> Result<K, kube::Error> {
    if let Ok(object) = &written {
        crate::own_writes::wrote(object);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_version_joins_the_patch_metadata() {
        let patch =
            serde_json::json!({ "metadata": { "labels": { "a": "b" } }, "data": { "k": "v" } });
        let got = conditional(patch, "42").ok();
        assert_eq!(
            got,
            Some(serde_json::json!({
                "metadata": { "labels": { "a": "b" }, "resourceVersion": "42" },
                "data": { "k": "v" },
            }))
        );
        let got = conditional(serde_json::json!({ "status": { "ready": 1 } }), "7").ok();
        assert_eq!(
            got,
            Some(serde_json::json!({
                "metadata": { "resourceVersion": "7" },
                "status": { "ready": 1 },
            }))
        );
    }

    #[test]
    fn an_apply_configuration_names_the_object_and_its_kind() {
        let mut seen = k8s_openapi::api::core::v1::ConfigMap::default();
        seen.metadata.name = Some("target".into());
        let patch = conditional(serde_json::json!({ "data": { "k": "v" } }), "9")
            .map(|p| apply_configuration(&seen, p))
            .ok();
        assert_eq!(
            patch,
            Some(serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": "target", "resourceVersion": "9" },
                "data": { "k": "v" },
            }))
        );
        // What the patch says already is kept.
        let own = serde_json::json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "other" } });
        assert_eq!(apply_configuration(&seen, own.clone()), own);
    }

    #[test]
    fn a_patch_that_is_not_an_object_is_refused() {
        assert!(matches!(
            conditional(serde_json::json!([1, 2]), "1"),
            Err(WriteError::NotAnObject(_))
        ));
        assert!(matches!(
            conditional(serde_json::json!({ "metadata": 3 }), "1"),
            Err(WriteError::NotAnObject(_))
        ));
    }
}
