//! The realistic example controller (`controller-sdk/examples/configset`) converges against the
//! real API server: children created with the declared content, status set, a deleted child
//! recreated, a change to the Secret it names rolled into its children, surplus children
//! removed, the parent's deletion handled. Twice: on the SDK through
//! a real dispatcher, and on plain kube-rs (the baseline it is ported from and compared with).

/// The controller as the SDK runs it.
#[path = "../../../controller-sdk/examples/configset"]
mod sdk {
    pub(crate) use kube_dispatch_controller::Action;
    #[path = "controller.rs"]
    pub(crate) mod configset;
}

/// The same controller, unchanged, as kube-rs runs it. Loading the file twice is the point:
/// each copy returns its own crate's `Action`.
#[path = "../../../controller-sdk/examples/configset"]
#[allow(clippy::duplicate_mod)]
mod kube_rs {
    pub(crate) use kube::runtime::controller::Action;
    #[path = "controller.rs"]
    pub(crate) mod configset;
}

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, CustomResourceExt, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{conditions, wait::await_condition, watcher},
};
use kube_dispatch_controller::Controller;
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
};
use sdk::configset::{ConfigSet, ConfigSetSpec, OWNER_LABEL, SECRET_ANNOTATION};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(60);

async fn children(api: &Api<ConfigMap>, set: &str) -> Result<Vec<ConfigMap>, kube::Error> {
    let mut list = api
        .list(&ListParams::default().labels(&format!("{OWNER_LABEL}={set}")))
        .await?
        .items;
    list.sort_by_key(ResourceExt::name_any);
    Ok(list)
}

async fn install_crd(client: &Client) -> TestResult {
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
    Ok(())
}

/// A running controller: stopped by `stop`, done when `task` ends, its errors on `errors`.
struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
    errors: mpsc::UnboundedReceiver<String>,
}

#[tokio::test]
async fn the_sdk_configset_controller_converges_and_heals() -> TestResult {
    let ns = TestNamespace::create("sdk-configset").await?;
    let client = ns.client();
    install_crd(&client).await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let stop = CancellationToken::new();
    let (tx, errors) = mpsc::unbounded_channel();
    // The reconciler's own reads: its requests carry the children, so it lists none.
    let lists = Arc::new(AtomicUsize::new(0));
    let reads = Cluster::shared()
        .client_counting_lists("configmaps", lists.clone())
        .await?;
    let outcomes = Controller::<sdk::configset::ConfigSet>::new(client.clone(), "configset")
        .namespace(ns.name())
        .owns::<ConfigMap>()
        .references::<Secret>(["spec.secretName"])
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .replica_id("configset-0")
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            sdk::configset::reconcile,
            sdk::configset::error_policy,
            Arc::new(sdk::configset::Context { client: reads }),
        );
    let task = tokio::spawn(outcomes.for_each(move |r| {
        if let Err(e) = r {
            let _ = tx.send(e.to_string());
        }
        async {}
    }));
    converges_and_heals(&ns, Running { stop, task, errors }).await?;
    assert_eq!(
        lists.load(Ordering::Relaxed),
        0,
        "the SDK reconciler read its children from its requests, never by a LIST"
    );
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn the_kube_rs_configset_controller_converges_and_heals() -> TestResult {
    let ns = TestNamespace::create("kube-rs-configset").await?;
    let client = ns.client();
    install_crd(&client).await?;
    let stop = CancellationToken::new();
    let (tx, errors) = mpsc::unbounded_channel();
    let sets: Api<kube_rs::configset::ConfigSet> = Api::namespaced(client.clone(), ns.name());
    let children: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let lists = Arc::new(AtomicUsize::new(0));
    let reads = Cluster::shared()
        .client_counting_lists("configmaps", lists.clone())
        .await?;
    let controller = kube::runtime::Controller::new(sets, watcher::Config::default());
    let cached = controller.store();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
    let outcomes = controller
        .owns(children, watcher::Config::default())
        .watches(secrets, watcher::Config::default(), move |secret| {
            cached
                .state()
                .into_iter()
                .filter(|set| {
                    set.namespace() == secret.namespace()
                        && set.spec.secret_name.as_deref() == Some(&secret.name_any())
                })
                .map(|set| kube::runtime::reflector::ObjectRef::from_obj(&*set))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            kube_rs::configset::reconcile,
            kube_rs::configset::error_policy,
            Arc::new(kube_rs::configset::Context { client: reads }),
        );
    // Only reconciler failures count: the incumbent's stream also reports scheduling outcomes
    // that are not failures of the controller (e.g. ObjectNotFound for a key triggered through
    // `owns` before the owner's watch has listed it), logged here for the record.
    let task = tokio::spawn(outcomes.for_each(move |r| {
        match r {
            Err(e @ kube::runtime::controller::Error::ReconcilerFailed(..)) => {
                let _ = tx.send(e.to_string());
            }
            Err(other) => {
                eprintln!("kube-rs controller outcome (not a reconcile failure): {other}")
            }
            Ok(_) => {}
        }
        async {}
    }));
    converges_and_heals(&ns, Running { stop, task, errors }).await?;
    // The baseline lists the children in each reconcile (its cache holds them, but the shared
    // reconciler cannot reach it).
    assert!(lists.load(Ordering::Relaxed) > 0);
    Ok(())
}

/// Drives a running ConfigSet controller through its life cycle in `ns` and checks each step.
async fn converges_and_heals(ns: &TestNamespace, running: Running) -> TestResult {
    let Running {
        stop,
        task,
        mut errors,
    } = running;
    let client = ns.client();
    let sets: Api<ConfigSet> = Api::namespaced(client.clone(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
    let secret = |value: &str| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("demo-secret".into()),
            ..Default::default()
        },
        string_data: Some([("password".to_owned(), value.to_owned())].into()),
        ..Secret::default()
    };
    let first = secrets
        .create(&PostParams::default(), &secret("one"))
        .await?
        .resource_version();
    let spec = ConfigSetSpec {
        count: 3,
        data: [("color".to_owned(), "blue".to_owned())].into(),
        secret_name: Some("demo-secret".into()),
    };
    sets.create(&PostParams::default(), &ConfigSet::new("demo", spec))
        .await?;

    // Converges: status says 3, and the three children hold the declared data.
    let ready = |n: i32| {
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
    let rolled_to = |version: Option<String>| {
        move |c: Option<&ConfigMap>| {
            c.is_some_and(|c| c.annotations().get(SECRET_ANNOTATION) == version.as_ref())
        }
    };
    assert!(
        kids.iter().all(|c| rolled_to(first.clone())(Some(c))),
        "each child carries the named Secret's version"
    );

    // A change to the named Secret reaches the ConfigSet, which rolls its children.
    let patch = serde_json::json!({ "stringData": { "password": "two" } });
    let second = secrets
        .patch(
            "demo-secret",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?
        .resource_version();
    assert_ne!(first, second);
    for name in ["demo-0", "demo-1", "demo-2"] {
        tokio::time::timeout(
            TIMEOUT,
            await_condition(configmaps.clone(), name, rolled_to(second.clone())),
        )
        .await??;
    }

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
    tokio::time::timeout(TIMEOUT, task).await??;
    let mut failures = Vec::new();
    while let Ok(e) = errors.try_recv() {
        failures.push(e);
    }
    assert!(failures.is_empty(), "reconcile errors: {failures:?}");
    Ok(())
}

/// `crd.yaml` beside the example is what `kubectl apply` installs: it must match the type.
/// `KD_BLESS=1` rewrites it from the type instead of comparing.
#[test]
fn the_example_crd_file_matches_the_type() {
    const HEADER: &str = "# The ConfigSet CRD, generated from ConfigSet::crd(); regenerate with\n# KD_BLESS=1 cargo test -p kube-dispatch-tests --test delivery the_example_crd\n";
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../controller-sdk/examples/configset/crd.yaml"
    );
    let generated = serde_json::to_value(ConfigSet::crd()).expect("serialize");
    if std::env::var_os("KD_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&generated).expect("serialize");
        std::fs::write(path, format!("{HEADER}{text}\n")).expect("write crd.yaml");
    }
    let text = std::fs::read_to_string(path).expect("crd.yaml");
    let json: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let file: serde_json::Value =
        serde_json::from_str(&json).expect("crd.yaml is JSON (valid YAML)");
    assert_eq!(
        file, generated,
        "crd.yaml is stale: regenerate it with KD_BLESS=1"
    );
}
