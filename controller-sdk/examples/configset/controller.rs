//! The ConfigSet controller: a custom resource that declares N ConfigMaps; the controller
//! creates and updates them as its children, deletes the ones no longer declared, and reports
//! how many are ready in the status. A ConfigSet may name a Secret (`spec.secretName`): each
//! child then carries the Secret's resourceVersion in an annotation, so a change to the Secret
//! rolls the children (the pattern of a checksum annotation that restarts a Deployment's Pods).
//! Deleting a ConfigSet needs no finalizer: its children carry a controller ownerReference, so
//! the garbage collector removes them.
//!
//! Shared by the `configset` example and the SDK's integration tests, which both include this
//! file as a module: its items are public to whichever crate includes it.

#![allow(unreachable_pub, dead_code)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client, CustomResource, Resource, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, Preconditions},
};
// `Action` comes from the including crate: kube_dispatch_controller::Action in the SDK version,
// kube::runtime::controller::Action in the kube-rs version. Nothing else differs.
use super::Action;
use kube_dispatch_controller::{
    children::{self, Checked, Children},
    precondition::{self, WriteError},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label every child carries, naming its ConfigSet.
pub const OWNER_LABEL: &str = "example.kube-dispatch.dev/configset";
/// Annotation every child of a ConfigSet that names a Secret carries: the resourceVersion of
/// the Secret it was written from.
pub const SECRET_ANNOTATION: &str = "example.kube-dispatch.dev/secret-version";
const MANAGER: &str = "configset-controller";

/// Declares `count` ConfigMaps named `<name>-<i>`, each holding `data`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "example.kube-dispatch.dev",
    version = "v1",
    kind = "ConfigSet",
    namespaced,
    status = "ConfigSetStatus",
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.ready"}"#
)]
pub struct ConfigSetSpec {
    /// How many ConfigMaps.
    #[schemars(range(min = 0))]
    pub count: i32,
    /// What each of them holds.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    /// A Secret in the same namespace whose changes roll the children.
    #[serde(
        default,
        rename = "secretName",
        skip_serializing_if = "Option::is_none"
    )]
    pub secret_name: Option<String>,
}

/// What the controller last achieved.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ConfigSetStatus {
    /// Children that exist with the declared content.
    pub ready: i32,
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
}

/// What a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// The status write failed.
    #[error("status write failed: {0}")]
    Write(#[from] WriteError),
    /// The object has no namespace or uid (never true for objects read from the API server).
    #[error("ConfigSet without namespace or uid")]
    Incomplete,
}

/// Shared by every reconcile.
pub struct Context {
    /// Client for writes.
    pub client: Client,
}

fn child_name(set: &str, i: i32) -> String {
    format!("{set}-{i}")
}

/// Brings the children and the status of one ConfigSet in line with its spec.
pub async fn reconcile(set: Arc<ConfigSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if set.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the children; nothing else to clean up.
        return Ok(Action::await_change());
    }
    let ns = set.namespace().ok_or(Error::Incomplete)?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    // The named Secret's version, read (a GET) only when one is named; a missing Secret
    // leaves the annotation out until it is created, which reconciles this ConfigSet again.
    let secret_version = match &set.spec.secret_name {
        Some(secret) => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
            secrets
                .get_opt(secret)
                .await?
                .and_then(|s| s.resource_version())
        }
        None => None,
    };
    // The children as the request shows them (kube-dispatch; elsewhere none).
    let known = children::of_this_reconcile().filter(|c| c.is_complete());
    write_children(&set, &configmaps, known.as_deref(), secret_version).await?;
    delete_undeclared(&set, &configmaps, known.as_deref()).await?;
    if !report(&set, &ctx.client, &ns).await? {
        return Ok(Action::await_change());
    }
    // Children changed by hand are noticed through `owns`, the named Secret's changes through
    // `references` (the SDK) or `watches` (kube-rs); the requeue is a safety net.
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Writes (server-side apply) each declared child not already as this controller last wrote
/// it for the same spec and Secret. Those versions are kept in the key's memo: a child at a
/// version it wrote needs no write; a child changed or deleted by hand, or never written, is
/// written.
async fn write_children(
    set: &ConfigSet,
    configmaps: &Api<ConfigMap>,
    known: Option<&Children>,
    secret_version: Option<String>,
) -> Result<(), Error> {
    let name = set.name_any();
    let owner = set.controller_owner_ref(&()).ok_or(Error::Incomplete)?;
    let generation = set.meta().generation.unwrap_or_default();
    let mut checked = Checked::for_desired(format!(
        "{generation}/{}",
        secret_version.as_deref().unwrap_or_default()
    ));
    for i in 0..set.spec.count {
        let shown =
            known.and_then(|c| c.of::<ConfigMap>().find(|c| c.name == child_name(&name, i)));
        if shown.is_some_and(|c| checked.holds(c)) {
            continue;
        }
        let child = ConfigMap {
            metadata: ObjectMeta {
                name: Some(child_name(&name, i)),
                labels: Some([(OWNER_LABEL.to_owned(), name.clone())].into()),
                annotations: secret_version
                    .as_ref()
                    .map(|v| [(SECRET_ANNOTATION.to_owned(), v.clone())].into()),
                owner_references: Some(vec![owner.clone()]),
                ..ObjectMeta::default()
            },
            data: Some(set.spec.data.clone()),
            ..ConfigMap::default()
        };
        let written = configmaps
            .patch(
                &child_name(&name, i),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&child),
            )
            .await?;
        checked.record(&written);
    }
    // Left with the acknowledgement; outside kube-dispatch (no memo) or past about 45 children
    // (too long for one), the next reconcile writes them all, as it would without.
    if let Err(e) = checked.leave() {
        tracing::debug!(error = %e, "children's versions not kept for the next reconcile");
    }
    Ok(())
}

/// Deletes the children beyond the declared count (it was lowered). On kube-dispatch the
/// request carries them (no LIST); elsewhere, or while the dispatcher's view is not whole,
/// they are listed.
async fn delete_undeclared(
    set: &ConfigSet,
    configmaps: &Api<ConfigMap>,
    known: Option<&Children>,
) -> Result<(), Error> {
    let name = set.name_any();
    // Either way, the ConfigMaps this ConfigSet controls, as (name, uid, resourceVersion).
    let existing: Vec<(String, Option<String>, Option<String>)> = match known {
        Some(children) => children
            .of::<ConfigMap>()
            .map(|c| {
                let (uid, version) = (c.uid.clone(), c.resource_version.clone());
                (c.name.clone(), Some(uid), Some(version))
            })
            .collect(),
        None => {
            let selector = format!("{OWNER_LABEL}={name}");
            let uid = set.uid();
            configmaps
                .list(&ListParams::default().labels(&selector))
                .await?
                .into_iter()
                .filter(|cm| {
                    cm.owner_references()
                        .iter()
                        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
                })
                .map(|cm| (cm.name_any(), cm.uid(), cm.resource_version()))
                .collect()
        }
    };
    for (child, uid, resource_version) in existing {
        let index = child
            .strip_prefix(&format!("{name}-"))
            .and_then(|i| i.parse::<i32>().ok());
        if index.is_none_or(|i| i >= set.spec.count) {
            // Exactly the object seen, as seen: one made anew under its name, or changed since
            // (adopted by another owner, say), is left to the reconcile its change causes.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version,
                }),
                ..DeleteParams::default()
            };
            match configmaps.delete(&child, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Reports the children ready in the status, if it does not say so already. False when the
/// ConfigSet changed or went away meanwhile: nothing is left to report then.
async fn report(set: &ConfigSet, client: &Client, ns: &str) -> Result<bool, Error> {
    let status = ConfigSetStatus {
        ready: set.spec.count,
        observed_generation: set.meta().generation,
    };
    if set.status.as_ref() == Some(&status) {
        return Ok(true);
    }
    let sets: Api<ConfigSet> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({ "status": status });
    // Only if the ConfigSet is still as this reconcile was given it: a reconcile cancelled
    // with this write in flight must not overwrite what a newer one reported.
    match precondition::patch_status(&sets, set, patch).await {
        // Changed since: the change is delivered again, and that reconcile reports.
        Err(e) if e.is_stale() => Ok(false),
        // Deleted while this reconcile ran (a ConfigSet has no finalizer, so it goes at
        // once): there is no status left to report, and its children go with it.
        Err(WriteError::Api(kube::Error::Api(status))) if status.code == 404 => Ok(false),
        result => result.map(|_| true).map_err(Error::from),
    }
}

/// Retry failed reconciles soon.
pub fn error_policy(_set: Arc<ConfigSet>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(2))
}
