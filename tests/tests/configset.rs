//! The realistic example controller (`controller-sdk/examples/configset`) converges against the
//! real API server, through a real dispatcher: children created with the declared content,
//! status set, a deleted child recreated, surplus children removed, the parent's deletion
//! handled.

#[path = "../../controller-sdk/examples/configset/controller.rs"]
mod configset;

use std::{sync::Arc, time::Duration};

use configset::{ConfigSet, ConfigSetSpec, Context, OWNER_LABEL, error_policy, reconcile};
use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::ConfigMap,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, CustomResourceExt, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{conditions, wait::await_condition},
};
use kube_dispatch_controller::{Action, Controller};
use kube_dispatch_tests::{
    TestNamespace,
    dispatcher::{TestDispatcher, test_config},
};
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TIMEOUT: Duration = Duration::from_secs(60);

async fn children(api: &Api<ConfigMap>, set: &str) -> Result<Vec<ConfigMap>, kube::Error> {
    let mut list = api
        .list(&ListParams::default().labels(&format!("{OWNER_LABEL}={set}")))
        .await?
        .items;
    list.sort_by_key(ResourceExt::name_any);
    Ok(list)
}

#[tokio::test]
async fn the_configset_controller_converges_and_heals() -> TestResult {
    let ns = TestNamespace::create("sdk-configset").await?;
    let client = ns.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = ConfigSet::crd();
    crds.patch(
        &crd.name_any(),
        &PatchParams::apply("kube-dispatch-tests").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    tokio::time::timeout(
        TIMEOUT,
        await_condition(crds, &crd.name_any(), conditions::is_crd_established()),
    )
    .await??;

    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let stop = CancellationToken::new();
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let outcomes = Controller::<ConfigSet>::new(client.clone(), "configset")
        .namespace(ns.name())
        .owns::<ConfigMap>()
        .dispatchers([format!("http://{}", d.addr)])
        .replica_id("configset-0")
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            reconcile,
            error_policy,
            Arc::new(Context {
                client: client.clone(),
            }),
        );
    let controller = tokio::spawn(outcomes.for_each(move |r| {
        if let Err(e) = r {
            let _ = errors_tx.send(e.to_string());
        }
        async {}
    }));

    let sets: Api<ConfigSet> = Api::namespaced(client.clone(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let spec = ConfigSetSpec {
        count: 3,
        data: [("color".to_owned(), "blue".to_owned())].into(),
    };
    sets.create(&PostParams::default(), &ConfigSet::new("demo", spec))
        .await?;

    // Converges: status says 3, and the three children hold the declared data.
    let ready = |n: u32| {
        move |s: Option<&ConfigSet>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.ready == n)
        }
    };
    tokio::time::timeout(TIMEOUT, await_condition(sets.clone(), "demo", ready(3))).await??;
    let kids = children(&configmaps, "demo").await?;
    let names: Vec<String> = kids.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["demo-0", "demo-1", "demo-2"]);
    assert!(
        kids.iter()
            .all(|c| c.data.as_ref().is_some_and(|d| d["color"] == "blue"))
    );
    assert!(kids.iter().all(|c| {
        c.owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.name == "demo")
    }));

    // A deleted child comes back (the owner is reconciled through `owns`).
    let old_uid = kids[1].uid();
    configmaps
        .delete("demo-1", &DeleteParams::default())
        .await?;
    let recreated = move |c: Option<&ConfigMap>| c.is_some_and(|c| c.uid() != old_uid);
    tokio::time::timeout(
        TIMEOUT,
        await_condition(configmaps.clone(), "demo-1", recreated),
    )
    .await??;

    // Lowering the count removes the surplus children.
    let patch = serde_json::json!({ "spec": { "count": 1 } });
    sets.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let surplus_uid = kids[2].uid().unwrap_or_default();
    let gone = conditions::is_deleted(&surplus_uid);
    tokio::time::timeout(TIMEOUT, await_condition(configmaps.clone(), "demo-2", gone)).await??;
    tokio::time::timeout(TIMEOUT, await_condition(sets.clone(), "demo", ready(1))).await??;
    assert_eq!(children(&configmaps, "demo").await?.len(), 1);

    // Deleting the parent: the garbage collector removes the children; the controller copes.
    let set_uid = sets.get("demo").await?.uid().unwrap_or_default();
    sets.delete("demo", &DeleteParams::background()).await?;
    tokio::time::timeout(
        TIMEOUT,
        await_condition(sets.clone(), "demo", conditions::is_deleted(&set_uid)),
    )
    .await??;
    let child_uid = kids[0].uid().unwrap_or_default();
    // The garbage collector picks up a new custom resource type at its next discovery pass
    // (every 30 s), so on a fresh cluster this wait can be that long.
    tokio::time::timeout(
        2 * TIMEOUT,
        await_condition(
            configmaps.clone(),
            "demo-0",
            conditions::is_deleted(&child_uid),
        ),
    )
    .await??;

    stop.cancel();
    tokio::time::timeout(TIMEOUT, controller).await??;
    let mut failures = Vec::new();
    while let Ok(e) = errors.try_recv() {
        failures.push(e);
    }
    assert!(failures.is_empty(), "reconcile errors: {failures:?}");
    d.stop().await;
    Ok(())
}

/// `crd.yaml` beside the example is what `kubectl apply` installs: it must match the type.
#[test]
fn the_example_crd_file_matches_the_type() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../controller-sdk/examples/configset/crd.yaml"
    );
    let text = std::fs::read_to_string(path).expect("crd.yaml");
    let json: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let file: serde_json::Value =
        serde_json::from_str(&json).expect("crd.yaml is JSON (valid YAML)");
    let generated = serde_json::to_value(ConfigSet::crd()).expect("serialize");
    assert_eq!(file, generated, "regenerate crd.yaml from ConfigSet::crd()");
}
