//! The mirrors controller, as kube-rs's guide writes one: a Mirror holds a finalizer
//! (kube-runtime's `finalizer()`), marks the ConfigMap it names as mirrored by it, records a
//! hash of its data in its status by server-side apply with an event (`Recorder`), follows the
//! ConfigMap's changes through that mark (a watched relation and its mapper), and on deletion
//! unmarks the ConfigMap before it lets the Mirror go.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::{Event as Published, EventType, Recorder};
use kube::runtime::{reflector::ObjectRef, watcher};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use kube_dispatch_controller::{Action, Controller, finalizer};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::mirror::{Mirror, MirrorStatus};

pub(super) const MANAGER: &str = "mirrors-controller";
/// Holds a Mirror until its ConfigMap is unmarked.
const FINALIZER: &str = "examples.kube-dispatch.dev/release";
/// Marks a ConfigMap with the name of the Mirror that records it.
const MIRRORED_BY: &str = "examples.kube-dispatch.dev/mirrored-by";

/// What each reconcile is given.
pub(super) struct Context {
    pub(super) client: Client,
    pub(super) recorder: Recorder,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<kube::Error>>),
}

pub(super) async fn reconcile(mirror: Arc<Mirror>, ctx: Arc<Context>) -> Result<Action, Error> {
    let mirrors: Api<Mirror> =
        Api::namespaced(ctx.client.clone(), &mirror.namespace().unwrap_or_default());
    finalizer::finalizer(&mirrors, FINALIZER, mirror, |event| async {
        match event {
            finalizer::Event::Apply(mirror) => record(&mirror, &ctx).await,
            finalizer::Event::Cleanup(mirror) => release(&mirror, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Marks the Mirror's ConfigMap and records the hash of its data.
async fn record(mirror: &Mirror, ctx: &Context) -> Result<Action, kube::Error> {
    let namespace = mirror.namespace().unwrap_or_default();
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let wanted = &mirror.spec.config_map_name;
    let Some(source) = configmaps.get_opt(wanted).await? else {
        let note = format!("no ConfigMap {wanted}");
        publish(ctx, mirror, EventType::Warning, "ConfigMapMissing", note).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    };
    if source.annotations().get(MIRRORED_BY) != Some(&mirror.name_any()) {
        let mark = json!({"metadata": {"annotations": {MIRRORED_BY: mirror.name_any()}}});
        configmaps
            .patch(wanted, &PatchParams::default(), &Patch::Merge(&mark))
            .await?;
    }
    let status = MirrorStatus {
        data_hash: data_hash(source.data.as_ref()),
        observed_generation: mirror.metadata.generation.unwrap_or_default(),
    };
    if mirror.status.as_ref() != Some(&status) {
        let mirrors: Api<Mirror> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({"apiVersion": "examples.kube-dispatch.dev/v1", "kind": "Mirror", "status": status});
        mirrors
            .patch_status(
                &mirror.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        let note = format!("ConfigMap {wanted} at {}", status.data_hash);
        publish(ctx, mirror, EventType::Normal, "Mirrored", note).await?;
    }
    Ok(Action::await_change())
}

/// Unmarks the Mirror's ConfigMap, if it is still marked as the Mirror's.
async fn release(mirror: &Mirror, ctx: &Context) -> Result<Action, kube::Error> {
    let configmaps: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &mirror.namespace().unwrap_or_default());
    let wanted = &mirror.spec.config_map_name;
    if let Some(source) = configmaps.get_opt(wanted).await?
        && source.annotations().get(MIRRORED_BY) == Some(&mirror.name_any())
    {
        let unmark = json!({"metadata": {"annotations": {MIRRORED_BY: null}}});
        configmaps
            .patch(wanted, &PatchParams::default(), &Patch::Merge(&unmark))
            .await?;
    }
    let note = format!("unmarked ConfigMap {wanted}");
    publish(ctx, mirror, EventType::Normal, "Released", note).await?;
    Ok(Action::await_change())
}

async fn publish(
    ctx: &Context,
    mirror: &Mirror,
    type_: EventType,
    reason: &str,
    note: String,
) -> Result<(), kube::Error> {
    let event = Published {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Mirror".into(),
        secondary: None,
    };
    ctx.recorder.publish(&event, &mirror.object_ref(&())).await
}

/// The hex SHA-256 of `data`'s keys and values, in key order.
pub(super) fn data_hash(data: Option<&BTreeMap<String, String>>) -> String {
    let mut hash = Sha256::new();
    for (k, v) in data.into_iter().flatten() {
        hash.update(format!("{k}\0{v}\0"));
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn error_policy(_mirror: Arc<Mirror>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(1))
}

/// The controller of the Mirrors of `namespace`, and of the ConfigMaps they mark.
pub(super) fn controller(client: Client, namespace: &str) -> Controller<Mirror> {
    Controller::for_api(
        Api::<Mirror>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
    )
    .watches(
        Api::<ConfigMap>::namespaced(client, namespace),
        watcher::Config::default(),
        |cm| {
            let mirror = cm.annotations().get(MIRRORED_BY)?;
            Some(ObjectRef::new(mirror).within(&cm.namespace()?))
        },
    )
    .references::<ConfigMap>(["spec.configMapName"])
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::api::DeleteParams;
    use kube::runtime::events::Reporter;
    use kube_dispatch_testing::Tier;
    use kube_dispatch_tests::{
        RequestsPerReconcile, TestNamespace, TestResult, ensure_crd, eventually,
    };
    use tokio_util::sync::CancellationToken;

    use super::super::mirror::MirrorSpec;
    use super::*;

    /// The Mirror `name` in `namespace`, once it has recorded `hash`.
    async fn recorded(client: &Client, namespace: &str, name: &str, hash: &str) -> Option<Mirror> {
        let mirror = Api::<Mirror>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .ok()?;
        let status = mirror.status.clone()?;
        (status.data_hash == hash
            && Some(status.observed_generation) == mirror.metadata.generation
            && mirror.finalizers() == [FINALIZER.to_owned()])
        .then_some(mirror)
    }

    /// Whether `namespace` holds an event `reason` about the Mirror `name`.
    async fn published(client: &Client, namespace: &str, name: &str, reason: &str) -> Option<()> {
        let events = Api::<K8sEvent>::namespaced(client.clone(), namespace)
            .list(&Default::default())
            .await
            .ok()?;
        events
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reporting_controller.as_deref() == Some(MANAGER)
            })
            .then_some(())
    }

    /// Whether the ConfigMap `name` is marked by `mirror` (or unmarked, with `None`).
    async fn marked(
        client: &Client,
        namespace: &str,
        name: &str,
        mirror: Option<&str>,
    ) -> Option<()> {
        let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .ok()?;
        (cm.annotations().get(MIRRORED_BY).map(String::as_str) == mirror).then_some(())
    }

    /// Deletes the Mirror `name` and waits (at most `within`) until it is gone.
    async fn delete(mirrors: &Api<Mirror>, name: &str, within: Duration) -> TestResult {
        mirrors.delete(name, &DeleteParams::default()).await?;
        eventually(within, format!("{name} gone"), || async {
            mirrors.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await?;
        Ok(())
    }

    #[tokio::test]
    async fn a_mirror_records_its_configmap_until_it_is_released() -> TestResult {
        let ns = TestNamespace::create("mirrors").await?;
        ensure_crd::<Mirror>(&ns.client()).await?;
        let (client, at) = (ns.client(), ns.name());
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), at);
        for (name, data) in [("one", "first"), ("two", "second")] {
            let cm = json!({"metadata": {"name": name}, "data": {"k": data}});
            configmaps
                .create(&Default::default(), &serde_json::from_value(cm)?)
                .await?;
        }
        let stop = CancellationToken::new();
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: None,
        };
        let cost = RequestsPerReconcile::default();
        let counted = cost.count(client.clone());
        let context = Context {
            client: counted.clone(),
            recorder: Recorder::new(counted.clone(), reporter),
        };
        let tier = Tier::start(client.clone()).await?;
        let run = controller(counted, at)
            .dispatchers(tier.dispatchers())
            .credentials(tier.credentials())
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(cost.around(reconcile), error_policy, Arc::new(context))
            .for_each(|_| async {});
        let controller = tokio::spawn(run);
        let mirrors: Api<Mirror> = Api::namespaced(client.clone(), at);
        for (name, source) in [("a", "one"), ("b", "two")] {
            let spec = MirrorSpec {
                config_map_name: source.into(),
            };
            mirrors
                .create(&Default::default(), &Mirror::new(name, spec))
                .await?;
        }
        let hash = |v: &str| data_hash(Some(&[("k".to_owned(), v.to_owned())].into()));
        let (first, second, changed) = (hash("first"), hash("second"), hash("changed"));
        let within = Duration::from_secs(30);
        eventually(within, "a records one", || {
            recorded(&client, at, "a", &first)
        })
        .await?;
        eventually(within, "b records two", || {
            recorded(&client, at, "b", &second)
        })
        .await?;
        eventually(within, "one marked by a", || {
            marked(&client, at, "one", Some("a"))
        })
        .await?;
        eventually(within, "a's Mirrored event", || {
            published(&client, at, "a", "Mirrored")
        })
        .await?;

        // A change to a marked ConfigMap reaches its Mirror, and only it.
        let change = json!({"data": {"k": "changed"}});
        configmaps
            .patch("one", &PatchParams::default(), &Patch::Merge(&change))
            .await?;
        eventually(within, "a records the change", || {
            recorded(&client, at, "a", &changed)
        })
        .await?;
        assert!(
            recorded(&client, at, "b", &second).await.is_some(),
            "b is as it was"
        );
        // A deleted ConfigMap is reported missing by the Mirror that named it.
        configmaps.delete("two", &DeleteParams::default()).await?;
        eventually(within, "b's ConfigMapMissing", || {
            published(&client, at, "b", "ConfigMapMissing")
        })
        .await?;
        // A deleted Mirror unmarks its ConfigMap before it goes.
        delete(&mirrors, "a", within).await?;
        assert!(
            marked(&client, at, "one", None).await.is_some(),
            "one is unmarked before a went"
        );
        eventually(within, "a's Released event", || {
            published(&client, at, "a", "Released")
        })
        .await?;
        // A Mirror whose ConfigMap is gone is released too; none is left holding its finalizer
        // once the controller stops, which would keep the namespace from being deleted.
        delete(&mirrors, "b", within).await?;
        stop.cancel();
        controller.await?;
        println!(
            "what the controller asked of the API server: {}",
            cost.summary()
        );
        Ok(())
    }
}
