//! The replica's metrics against the real API server: controller-runtime's names, types and
//! labels, counters that move with what reconciles do, and the admin endpoint that serves
//! them with the probes.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use kube_dispatch_controller::{Action, Controller, precondition};
use kube_dispatch_tests::{
    TestNamespace,
    dispatcher::{TestDispatcher, test_config},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// controller-runtime's controller metrics (`pkg/internal/controller/metrics`): name as
/// scraped, type, and label names; the SDK must export each under the same name and labels.
const CONTROLLER_RUNTIME: [(&str, &str, &[&str]); 6] = [
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

struct Ctx {
    client: kube::Client,
    done: mpsc::UnboundedSender<String>,
    /// Names whose first reconcile already happened.
    seen: Mutex<HashSet<String>>,
}

#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("first attempts of fail-* fail")]
    FirstAttempt,
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// `ok-*` succeed; `requeue-*` ask to come back in an hour; `fail-*` fail once, then succeed;
/// `stale-*` make one conditional write against an outdated resourceVersion (409) the first
/// time.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Failed> {
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

fn error_policy(_cm: Arc<ConfigMap>, _e: &Failed, _ctx: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// The samples of `/metrics` text whose labels include `controller="<controller>"`: the series
/// (name and labels as written) to its value.
fn samples_of(text: &str, controller: &str) -> BTreeMap<String, f64> {
    let needle = format!("controller=\"{controller}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&needle))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn http_get(address: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn free_port() -> std::io::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

#[tokio::test]
async fn sdk_metrics_carry_controller_runtimes_names_and_move_with_reconciles() -> TestResult {
    let ns = TestNamespace::create("sdk-metrics").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let names = ["ok-0", "ok-1", "ok-2", "requeue-0", "fail-0", "stale-0"];
    for name in names {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        api.create(&PostParams::default(), &cm).await?;
    }
    // The label is the group: unique to this test, as the registry is the process's.
    let group = format!("metrics-{}", ns.name());
    let admin = free_port()?;
    let (done, mut finished) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let controller = Controller::<ConfigMap>::new(ns.client(), group.as_str())
        .namespace(ns.name())
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .concurrency(4)
        .admin_listen(admin)
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    let stream = controller.run(
        reconcile,
        error_policy,
        Arc::new(Ctx {
            client: ns.client(),
            done,
            seen: Mutex::default(),
        }),
    );
    let task = tokio::spawn(stream.for_each(|_| async {}));

    // Every object ends reconciled (fail-0 on its retry, stale-0 after its bump).
    let mut left: BTreeSet<&str> = names.into_iter().collect();
    while !left.is_empty() {
        let name = tokio::time::timeout(Duration::from_secs(30), finished.recv())
            .await?
            .ok_or("the controller stopped")?;
        left.remove(name.as_str());
    }

    let (status, text) = http_get(admin, "/metrics").await?;
    assert_eq!(status, 200);
    // Names, types and label names as controller-runtime's.
    for (name, kind, labels) in CONTROLLER_RUNTIME {
        let family = name.trim_end_matches("_total");
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "{name} is not a {kind}"
        );
        let sample = if kind == "histogram" {
            format!("{name}_count{{")
        } else {
            format!("{name}{{")
        };
        let line = text
            .lines()
            .find(|l| l.starts_with(&sample) && l.contains(&format!("\"{group}\"")))
            .ok_or(format!("no {name} series for {group}"))?;
        let got: Vec<&str> = line[sample.len()..]
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
            .collect();
        assert_eq!(got, labels, "labels of {name}");
    }

    let s = samples_of(&text, &group);
    let get = |series: &str| {
        s.get(&series.replace("G", &group))
            .copied()
            .unwrap_or_else(|| panic!("no series {series}: {s:#?}"))
    };
    println!("{s:#?}");
    // ok-0..2, fail-0's retry and stale-0 (twice: its bump changed it) succeed; requeue-0
    // asks to come back; fail-0's first attempt fails.
    assert!(get(r#"controller_runtime_reconcile_total{controller="G",result="success"}"#) >= 6.0);
    assert_eq!(
        get(r#"controller_runtime_reconcile_total{controller="G",result="requeue_after"}"#),
        1.0
    );
    assert_eq!(
        get(r#"controller_runtime_reconcile_total{controller="G",result="error"}"#),
        1.0
    );
    assert_eq!(
        get(r#"controller_runtime_reconcile_total{controller="G",result="requeue"}"#),
        0.0
    );
    assert_eq!(
        get(r#"controller_runtime_reconcile_errors_total{controller="G"}"#),
        1.0
    );
    assert_eq!(
        get(r#"controller_runtime_reconcile_timeouts_total{controller="G"}"#),
        0.0
    );
    assert_eq!(
        get(r#"controller_runtime_max_concurrent_reconciles{controller="G"}"#),
        4.0
    );
    let reconciles: f64 = ["success", "requeue_after", "error", "requeue"]
        .iter()
        .map(|r| {
            get(&format!(
                r#"controller_runtime_reconcile_total{{controller="G",result="{r}"}}"#
            ))
        })
        .sum();
    assert_eq!(
        get(r#"controller_runtime_reconcile_time_seconds_count{controller="G"}"#),
        reconciles
    );
    assert_eq!(
        get(r#"kube_dispatch_stale_writes_total{controller="G"}"#),
        1.0
    );
    assert!(get(r#"kube_dispatch_deliveries_total{controller="G",reason="added"}"#) >= 6.0);
    assert_eq!(
        get(r#"kube_dispatch_deliveries_total{controller="G",reason="retry"}"#),
        1.0
    );
    assert_eq!(
        get(&format!(
            r#"kube_dispatch_sessions{{controller="G",dispatcher="{}"}}"#,
            d.addr
        )),
        1.0
    );
    assert_eq!(
        get(r#"kube_dispatch_delivery_to_reconcile_seconds_count{controller="G"}"#),
        reconciles
    );
    assert_eq!(http_get(admin, "/readyz").await?, (200, "ok\n".into()));

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    let (_, text) = http_get(admin, "/metrics").await?;
    let s = samples_of(&text, &group);
    assert_eq!(
        s.get(&format!(
            r#"controller_runtime_active_workers{{controller="{group}"}}"#
        )),
        Some(&0.0)
    );
    assert!(
        !s.keys().any(|k| k.starts_with("kube_dispatch_sessions{")),
        "a closed session's series stays: {s:#?}"
    );
    let (status, body) = http_get(admin, "/readyz").await?;
    assert_eq!((status, body.as_str()), (503, "not ready: shutting down\n"));
    d.stop().await;
    Ok(())
}
