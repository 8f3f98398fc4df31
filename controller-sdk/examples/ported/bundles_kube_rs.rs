//! The bundles controller, as kube-rs's guide writes one: it owns ConfigMaps, lists its own by
//! label, creates, updates and deletes copies to match each Bundle by server-side apply,
//! reports them in the status, and checks again every minute.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::runtime::{Controller, controller::Action};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;

use super::bundle::{Bundle, BundleStatus};

pub(super) const MANAGER: &str = "bundles-controller";
/// Each copy carries the name of its Bundle under this label.
const LABEL: &str = "examples.kube-dispatch.dev/bundle";

/// What each reconcile is given.
pub(super) struct Context {
    pub(super) client: Client,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

pub(super) async fn reconcile(bundle: Arc<Bundle>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = bundle.namespace().unwrap_or_default();
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let copies = configmaps
        .list(&ListParams::default().labels(&format!("{LABEL}={}", bundle.name_any())))
        .await?
        .items;
    let wanted: BTreeSet<String> = (0..bundle.spec.copies)
        .map(|i| format!("{}-{i}", bundle.name_any()))
        .collect();
    for copy in &copies {
        if !wanted.contains(&copy.name_any()) {
            configmaps
                .delete(&copy.name_any(), &DeleteParams::default())
                .await?;
        }
    }
    for name in &wanted {
        let current = copies.iter().find(|c| c.name_any() == *name);
        if current.is_some_and(|c| c.data.as_ref() == Some(&bundle.spec.data)) {
            continue;
        }
        let copy = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {LABEL: bundle.name_any()}, "ownerReferences": [bundle.controller_owner_ref(&())]},
            "data": bundle.spec.data,
        });
        configmaps
            .patch(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&copy),
            )
            .await?;
    }
    let status = BundleStatus {
        ready_copies: bundle.spec.copies,
        observed_generation: bundle.metadata.generation.unwrap_or_default(),
    };
    if bundle.status.as_ref() != Some(&status) {
        let bundles: Api<Bundle> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({"apiVersion": "examples.kube-dispatch.dev/v1", "kind": "Bundle", "status": status});
        bundles
            .patch_status(
                &bundle.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

pub(super) fn error_policy(_bundle: Arc<Bundle>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(1))
}

/// The controller of the Bundles of `namespace`, and of their copies.
pub(super) fn controller(client: Client, namespace: &str) -> Controller<Bundle> {
    Controller::new(
        Api::<Bundle>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::namespaced(client, namespace),
        watcher::Config::default(),
    )
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kube_dispatch_tests::{
        RequestsPerReconcile, TestNamespace, TestResult, ensure_crd, eventually,
    };
    use tokio_util::sync::CancellationToken;

    use super::super::bundle::BundleSpec;
    use super::*;

    /// Whether `namespace` holds exactly `want` copies of `bundle` with `data`, reported in its
    /// status at its generation.
    async fn copies_of(
        client: &Client,
        namespace: &str,
        bundle: &str,
        want: u32,
        data: &str,
    ) -> Option<()> {
        let b = Api::<Bundle>::namespaced(client.clone(), namespace)
            .get(bundle)
            .await
            .ok()?;
        let all = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .list(&Default::default())
            .await
            .ok()?;
        let held: Vec<_> = all
            .items
            .iter()
            .filter(|c| c.owner_references().iter().any(|r| r.name == bundle))
            .collect();
        let status = b.status.unwrap_or_default();
        (held.len() == want as usize
            && held.iter().all(|c| {
                c.data.as_ref().and_then(|d| d.get("k")).map(String::as_str) == Some(data)
            })
            && status.ready_copies == want
            && Some(status.observed_generation) == b.metadata.generation)
            .then_some(())
    }

    #[tokio::test]
    async fn a_bundle_keeps_its_copies() -> TestResult {
        let ns = TestNamespace::create("bundles").await?;
        ensure_crd::<Bundle>(&ns.client()).await?;
        let stop = CancellationToken::new();
        let cost = RequestsPerReconcile::default();
        let counted = cost.count(ns.client());
        let run = controller(counted.clone(), ns.name())
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(
                cost.around(reconcile),
                error_policy,
                Arc::new(Context { client: counted }),
            )
            .for_each(|_| async {});
        let controller = tokio::spawn(run);
        let bundles: Api<Bundle> = Api::namespaced(ns.client(), ns.name());
        for (name, copies, data) in [("first", 3, "one"), ("second", 2, "two")] {
            let spec = BundleSpec {
                copies,
                data: [("k".to_owned(), data.to_owned())].into(),
            };
            bundles
                .create(&Default::default(), &Bundle::new(name, spec))
                .await?;
        }
        let client = ns.client();
        eventually(Duration::from_secs(30), "first's 3 copies", || {
            copies_of(&client, ns.name(), "first", 3, "one")
        })
        .await?;
        eventually(Duration::from_secs(30), "second's 2 copies", || {
            copies_of(&client, ns.name(), "second", 2, "two")
        })
        .await?;

        let change = json!({"spec": {"copies": 1, "data": {"k": "changed"}}});
        bundles
            .patch("first", &PatchParams::default(), &Patch::Merge(&change))
            .await?;
        eventually(Duration::from_secs(30), "first's one changed copy", || {
            copies_of(&client, ns.name(), "first", 1, "changed")
        })
        .await?;
        eventually(Duration::from_secs(30), "second's 2 copies", || {
            copies_of(&client, ns.name(), "second", 2, "two")
        })
        .await?;
        stop.cancel();
        controller.await?;
        println!(
            "what the controller asked of the API server: {}",
            cost.summary()
        );
        Ok(())
    }
}
