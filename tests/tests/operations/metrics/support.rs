//! What the tests of this module share.

pub(super) use futures::StreamExt;
pub(super) use k8s_openapi::api::core::v1::ConfigMap;
pub(super) use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
pub(super) use kube_dispatch_controller::{Action, Controller, precondition};
pub(super) use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
    eventually,
};
pub(super) use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};
pub(super) use tokio::sync::mpsc;
pub(super) use tokio_util::sync::CancellationToken;

/// controller-runtime's controller metrics (`pkg/internal/controller/metrics`): name as
/// scraped, type, and label names; the SDK must export each under the same name and labels.
pub(super) const CONTROLLER_RUNTIME: [(&str, &str, &[&str]); 6] = [
    (
        "controller_runtime_reconcile_total",
        "counter",
        &["controller", "result"],
    ),
    (
        "controller_runtime_reconcile_errors_total",
        "counter",
        &["controller"],
    ),
    (
        "controller_runtime_reconcile_timeouts_total",
        "counter",
        &["controller"],
    ),
    (
        "controller_runtime_reconcile_time_seconds",
        "histogram",
        &["controller"],
    ),
    (
        "controller_runtime_active_workers",
        "gauge",
        &["controller"],
    ),
    (
        "controller_runtime_max_concurrent_reconciles",
        "gauge",
        &["controller"],
    ),
];

pub(super) struct Ctx {
    pub(super) client: kube::Client,
    pub(super) done: mpsc::UnboundedSender<String>,
    /// Names whose first reconcile already happened.
    pub(super) seen: Mutex<HashSet<String>>,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum Failed {
    #[error("first attempts of fail-* fail")]
    FirstAttempt,
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// `ok-*` succeed; `requeue-*` ask to come back in an hour; `fail-*` fail once, then succeed;
/// `stale-*` make one conditional write against an outdated resourceVersion (409) the first
/// time.
pub(super) async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Failed> {
    let name = cm.name_any();
    let first = ctx
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.clone());
    let action = if name.starts_with("requeue") {
        Action::requeue(Duration::from_secs(3600))
    } else {
        Action::await_change()
    };
    if first && name.starts_with("fail") {
        return Err(Failed::FirstAttempt);
    }
    if first && name.starts_with("stale") {
        let api: Api<ConfigMap> =
            Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap_or_default());
        let bump = serde_json::json!({"data": {"bumped": "yes"}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&bump))
            .await?;
        let refused = precondition::patch(&api, &cm, serde_json::json!({"data": {"x": "y"}})).await;
        assert!(matches!(refused, Err(e) if e.is_stale()));
    }
    let _ = ctx.done.send(name);
    Ok(action)
}

pub(super) fn error_policy(_cm: Arc<ConfigMap>, _e: &Failed, _ctx: Arc<Ctx>) -> Action {
    Action::await_change()
}

pub(super) use kube_dispatch_tests::http::get as http_get;

pub(super) fn free_port() -> std::io::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// Writes the metric names `text` shows (as sampled: `_total` kept, histogram suffixes dropped)
/// to `exported-metrics-<process>.txt` under the test scratch folder, where the dashboard check
/// of `make test` (`tests/grafana/check-dashboard.sh`) reads what the tier exports.
pub(super) fn record_exported(process: &str, text: &str) -> std::io::Result<()> {
    let names: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|n| {
            ["_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|suffix| n.strip_suffix(suffix))
                .unwrap_or(n)
        })
        .collect();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir)?;
    let list: String = names.iter().map(|n| format!("{n}\n")).collect();
    std::fs::write(dir.join(format!("exported-metrics-{process}.txt")), list)
}

/// The samples of `/metrics` text whose labels name `group` (as `group`, `name` or
/// `controller`): the series as written to its value.
/// The user `group` on `d` belongs to, as its metrics label it.
pub(super) fn owner_of(d: &TestDispatcher, group: &str) -> Result<String, &'static str> {
    d.handles
        .groups
        .all()
        .into_iter()
        .find(|g| g.id.name == group)
        .map(|g| g.id.owner.clone().unwrap_or_default())
        .ok_or("no group")
}

pub(super) fn samples(text: &str, group: &str) -> BTreeMap<String, f64> {
    let quoted = format!("\"{group}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&quoted))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The number of series a scrape shows.
pub(super) fn series(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count()
}

/// Reconciles of one owner ConfigMap (`case=<case>`) under `group`: each writes the owner's
/// child Secret (server-side apply, controller owner reference) and reports the owner's
/// resourceVersion.
pub(super) async fn run_owner_controller(
    ns: &TestNamespace,
    d: &TestDispatcher,
    group: &str,
    case: &str,
    recent_objects: u64,
) -> TestResult<(
    CancellationToken,
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<String>,
)> {
    use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::OwnerReference};
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut owner = ConfigMap::default();
    owner.metadata.name = Some(format!("owner-{case}"));
    owner.metadata.labels = Some([("case".to_owned(), case.to_owned())].into());
    api.create(&PostParams::default(), &owner).await?;
    let (seen, reconciled) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let controller = Controller::<ConfigMap>::new(ns.client(), group)
        .namespace(ns.name())
        .labels(format!("case={case}"))
        .owns::<Secret>()
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .recent_objects(recent_objects)
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    let client = controller.client();
    let reconcile = move |cm: Arc<ConfigMap>, seen: Arc<mpsc::UnboundedSender<String>>| {
        let client = client.clone();
        async move {
            let name = format!("{}-child", cm.name_any());
            let child = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: cm.name_any(),
                        uid: cm.uid().unwrap_or_default(),
                        controller: Some(true),
                        ..OwnerReference::default()
                    }]),
                    ..Default::default()
                },
                string_data: Some([("from".to_owned(), cm.name_any())].into()),
                ..Secret::default()
            };
            let secrets: Api<Secret> = Api::namespaced(client, &cm.namespace().unwrap_or_default());
            secrets
                .patch(
                    &name,
                    &PatchParams::apply("owner-test").force(),
                    &Patch::Apply(&child),
                )
                .await?;
            let _ = seen.send(cm.resource_version().unwrap_or_default());
            Ok::<_, kube::Error>(Action::await_change())
        }
    };
    let stream = controller.run(
        reconcile,
        |_, _: &kube::Error, _| Action::await_change(),
        Arc::new(seen),
    );
    let task = tokio::spawn(stream.for_each(|_| async {}));
    Ok((stop, task, reconciled))
}
