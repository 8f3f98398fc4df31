//! Proof that the test harness is a real Kubernetes API server: watches see every change in
//! order, and custom resources work through the dynamic API with their schema enforced. The
//! 410 Gone path and the watcher's recovery from it are in `apiserver_restart.rs`.

use std::{collections::BTreeMap, fmt::Debug, time::Duration};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Resource, ResourceExt,
    api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    discovery,
    runtime::watcher::{self, Event},
};
use kube_dispatch_tests::{TestNamespace, TestResult, ensure_widget_crd};

/// Upper bound for any single expected event; the tests wait on events, never on the clock.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

async fn next_event<K, S>(events: &mut S) -> Event<K>
where
    K: Debug,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    match tokio::time::timeout(EVENT_TIMEOUT, events.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("watcher error: {e}"),
        Ok(None) => panic!("watch stream ended"),
        Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
    }
}

fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(
        data.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    );
    cm
}

fn data_of(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref()?.get(key).cloned()
}

/// Waits for the initial list of a fresh watcher to finish, returning the names it listed.
async fn initial_list<K, S>(events: &mut S) -> Vec<String>
where
    K: Resource + Debug,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    let mut names = Vec::new();
    loop {
        match next_event(events).await {
            Event::Init => {}
            Event::InitApply(obj) => names.push(obj.name_any()),
            Event::InitDone => return names,
            other => panic!("expected the initial list, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn configmap_create_update_delete_reach_a_watcher_in_order() -> TestResult {
    let ns = TestNamespace::create("configmap-watch").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let listed = initial_list(&mut events).await;
    assert!(
        !listed.contains(&"settings".to_owned()),
        "fresh namespace listed {listed:?}"
    );

    let created = api
        .create(
            &PostParams::default(),
            &configmap("settings", &[("mode", "a")]),
        )
        .await?;
    let Event::Apply(seen) = next_event(&mut events).await else {
        panic!("expected the creation")
    };
    assert_eq!(seen.name_any(), "settings");
    assert_eq!(seen.resource_version(), created.resource_version());
    assert_eq!(data_of(&seen, "mode").as_deref(), Some("a"));

    let patch = serde_json::json!({ "data": { "mode": "b" } });
    let updated = api
        .patch("settings", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let Event::Apply(seen) = next_event(&mut events).await else {
        panic!("expected the update")
    };
    assert_eq!(seen.resource_version(), updated.resource_version());
    assert_eq!(data_of(&seen, "mode").as_deref(), Some("b"));

    api.delete("settings", &DeleteParams::default()).await?;
    let Event::Delete(seen) = next_event(&mut events).await else {
        panic!("expected the deletion")
    };
    assert_eq!(seen.name_any(), "settings");
    assert_eq!(seen.uid(), created.uid());
    Ok(())
}

#[tokio::test]
async fn custom_resource_works_through_dynamic_object() -> TestResult {
    let ns = TestNamespace::create("crd-dynamic").await?;
    let client = ns.client();

    ensure_widget_crd(&client).await?;

    let gvk = GroupVersionKind::gvk("test.kube-dispatch.dev", "v1", "Widget");
    let (resource, capabilities) = discovery::pinned_kind(&client, &gvk).await?;
    assert_eq!(resource.plural, "widgets");
    assert_eq!(capabilities.scope, discovery::Scope::Namespaced);

    let widgets: Api<DynamicObject> = Api::namespaced_with(client, ns.name(), &resource);
    let mut widget = DynamicObject::new("gear", &resource);
    widget.data = serde_json::json!({ "spec": { "size": 3 } });
    let created = widgets.create(&PostParams::default(), &widget).await?;
    assert_eq!(created.data["spec"]["size"], 3);

    let patch = serde_json::json!({ "spec": { "size": 5 } });
    widgets
        .patch("gear", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let read = widgets.get("gear").await?;
    assert_eq!(read.data["spec"]["size"], 5);
    assert_ne!(read.resource_version(), created.resource_version());

    // The schema is enforced by the real server: a string is not an integer.
    let bad = serde_json::json!({ "spec": { "size": "big" } });
    let err = widgets
        .patch("gear", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .expect_err("the API server must reject a spec that violates the CRD schema");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422),
        "expected 422 Invalid, got {err}"
    );

    let names: Vec<String> = widgets
        .list(&Default::default())
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, ["gear"]);

    widgets.delete("gear", &DeleteParams::default()).await?;
    let gone = widgets.get_opt("gear").await?;
    assert!(
        gone.is_none(),
        "widget still readable after delete: {gone:?}"
    );
    Ok(())
}
