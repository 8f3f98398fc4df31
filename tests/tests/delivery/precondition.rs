//! The SDK's writes with a resourceVersion precondition (`kube_dispatch_controller::precondition`)
//! against the real API server: a write made against an object that changed since gets 409
//! Conflict, reported as stale; a write against the current object goes through.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use kube_dispatch_controller::precondition::{self, WriteError};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult, Widget, WidgetSpec, ensure_widget_crd,
};

fn label(value: &str) -> serde_json::Value {
    serde_json::json!({ "metadata": { "labels": { "round": value } } })
}

/// Changes the object `name` behind the reconciler's back, as a newer reconcile would.
async fn change<K>(api: &Api<K>, name: &str, round: &str) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&label(round)))
        .await
}

/// A namespace of its own (kept while the test holds it) with the Widget `name` in it, as a
/// reconcile is given it.
async fn widget(namespace: &str, name: &str) -> TestResult<(TestNamespace, Api<Widget>, Widget)> {
    let ns = TestNamespace::create(namespace).await?;
    let client = Cluster::shared().client().await?;
    ensure_widget_crd(&client).await?;
    let api: Api<Widget> = Api::namespaced(client, ns.name());
    let seen = api
        .create(
            &PostParams::default(),
            &Widget::new(name, WidgetSpec { size: 1 }),
        )
        .await?;
    Ok((ns, api, seen))
}

fn assert_stale<K: std::fmt::Debug>(result: Result<K, WriteError>, what: &str) {
    match result {
        Err(e) if e.is_stale() => {}
        other => panic!("{what}: expected a stale write (409), got {other:?}"),
    }
}

#[tokio::test]
async fn a_patch_against_a_changed_object_is_refused_and_one_against_the_current_goes_through()
-> TestResult {
    let ns = TestNamespace::create("precondition-patch").await?;
    let client = Cluster::shared().client().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, ns.name());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("target".into());
    let seen = api.create(&PostParams::default(), &cm).await?;

    let current = change(&api, "target", "newer").await?;
    assert_stale(
        precondition::patch(&api, &seen, label("stale")).await,
        "patch",
    );
    assert_eq!(
        api.get("target")
            .await?
            .labels()
            .get("round")
            .map(String::as_str),
        Some("newer"),
        "the stale patch changed nothing"
    );

    let written = precondition::patch(&api, &current, label("current")).await?;
    assert_eq!(
        written.labels().get("round").map(String::as_str),
        Some("current")
    );

    // A replace made from the object as first seen is refused too; from the latest it works.
    let mut stale = seen.clone();
    stale.data = Some([("k".to_owned(), "stale".to_owned())].into());
    assert_stale(precondition::replace(&api, &stale).await, "replace");
    let mut fresh = written.clone();
    fresh.data = Some([("k".to_owned(), "fresh".to_owned())].into());
    let replaced = precondition::replace(&api, &fresh).await?;
    assert_eq!(
        replaced.data.and_then(|d| d.get("k").cloned()).as_deref(),
        Some("fresh")
    );

    // An object without a resourceVersion (a tombstone) cannot be written conditionally.
    let mut tombstone = seen;
    tombstone.metadata.resource_version = None;
    assert!(matches!(
        precondition::patch(&api, &tombstone, label("x")).await,
        Err(WriteError::NoResourceVersion { .. })
    ));
    Ok(())
}

#[tokio::test]
async fn a_status_patch_against_a_changed_object_is_refused() -> TestResult {
    let (_ns, api, seen) = widget("precondition-status", "gear").await?;
    let status = |seen: i64| serde_json::json!({ "status": { "seen": seen } });

    let current = change(&api, "gear", "newer").await?;
    assert_stale(
        precondition::patch_status(&api, &seen, status(1)).await,
        "status patch",
    );
    assert!(
        api.get_status("gear").await?.status.is_none(),
        "the stale status patch changed nothing"
    );
    let written = precondition::patch_status(&api, &current, status(1)).await?;
    assert_eq!(written.status.map(|s| s.seen), Some(1));
    Ok(())
}

#[tokio::test]
async fn an_apply_as_a_field_manager_against_a_changed_object_is_refused() -> TestResult {
    let (_ns, api, seen) = widget("precondition-apply", "cog").await?;
    let status = |seen: i64| serde_json::json!({ "status": { "seen": seen } });
    const MANAGER: &str = "widget-controller";

    let current = change(&api, "cog", "newer").await?;
    assert_stale(
        precondition::apply_status(&api, &seen, MANAGER, status(1)).await,
        "status apply",
    );
    assert!(
        api.get_status("cog").await?.status.is_none(),
        "the stale status apply changed nothing"
    );
    let written = precondition::apply_status(&api, &current, MANAGER, status(2)).await?;
    assert_eq!(written.status.as_ref().map(|s| s.seen), Some(2));
    // The status is the controller's: its field manager applied it, on the status subresource.
    let owned = written
        .managed_fields()
        .iter()
        .find(|f| f.manager.as_deref() == Some(MANAGER))
        .map(|f| (f.operation.as_deref(), f.subresource.as_deref()));
    assert_eq!(owned, Some((Some("Apply"), Some("status"))));

    // The object itself the same way: refused against the object first seen, applied against
    // the latest.
    assert_stale(
        precondition::apply(&api, &seen, MANAGER, label("stale")).await,
        "apply",
    );
    let applied = precondition::apply(&api, &written, MANAGER, label("applied")).await?;
    assert_eq!(
        applied.labels().get("round").map(String::as_str),
        Some("applied")
    );
    Ok(())
}
