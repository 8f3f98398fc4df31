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
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
    eventually,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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
    // The controller's own client: what it sends is counted by verb.
    let client = controller.client();
    let stream = controller.run(
        reconcile,
        error_policy,
        Arc::new(Ctx {
            client,
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

    let s = samples(&text, &group);
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
    // Every object came with its request.
    assert!(get(r#"kube_dispatch_objects_loaded_total{controller="G",source="request"}"#) >= 6.0);
    assert_eq!(
        get(r#"kube_dispatch_objects_loaded_total{controller="G",source="read"}"#),
        0.0
    );
    // stale-0's bump and its refused conditional write: the reconciler's only requests.
    assert_eq!(
        get(r#"kube_dispatch_api_requests_total{controller="G",verb="patch"}"#),
        2.0
    );
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
    record_exported("controller", &text)?;
    let s = samples(&text, &group);
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

/// The dispatcher's per-group metrics move with what its queue does: adds, deliveries by
/// reason, acks by outcome, retries, work duration, and the figures of keys in flight and
/// delayed, with controller-runtime's `workqueue_*` names and labels.
#[tokio::test]
async fn dispatcher_metrics_move_with_the_queue() -> TestResult {
    use kube_dispatch_proto::v1::{AckItem, Requeue, ack_item};
    use kube_dispatch_runtime::metrics::Metrics;
    use kube_dispatch_tests::dispatcher::{TestSession, subscription};

    let ns = TestNamespace::create("dispatcher-metrics").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let metrics = Metrics::default();
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.metrics = metrics.clone();
    let d = TestDispatcher::start(config).await?;
    let group = format!("dm-{}", ns.name());
    let mut s = TestSession::open(
        &d,
        &group,
        "replica-0",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    for name in ["ok", "fail", "requeue", "held"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        api.create(&PostParams::default(), &cm).await?;
    }
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} deliveries of 4 after 30 s",
            got.len()
        );
        got.extend(s.hold(Duration::from_secs(10)).await?);
    }
    let id = |name: &str| {
        got.iter()
            .find(|r| r.key.ends_with(&format!("/{name}")))
            .map(|r| r.delivery_id)
            .unwrap_or_else(|| panic!("{name} not delivered: {got:?}"))
    };
    let (ok, fail, requeue) = (id("ok"), id("fail"), id("requeue"));
    let outcome = |delivery_id, outcome| AckItem {
        delivery_id,
        outcome: Some(outcome),
        memo: Vec::new(),
    };
    s.poll_with(
        vec![
            outcome(ok, ack_item::Outcome::Success(Default::default())),
            outcome(
                fail,
                ack_item::Outcome::Failure(kube_dispatch_proto::v1::Failure {
                    message: "no".into(),
                }),
            ),
            outcome(
                requeue,
                ack_item::Outcome::Requeue(Requeue {
                    after: prost_types::Duration::try_from(Duration::from_secs(3600)).ok(),
                }),
            ),
            // Acknowledged twice: the second is unknown.
            outcome(ok, ack_item::Outcome::Success(Default::default())),
        ],
        Duration::from_millis(1),
    )
    .await?;

    let text = metrics.encode();
    record_exported("dispatcher", &text)?;
    let s_ = samples(&text, &group);
    // Groups are scoped by identity: every group series names the user it belongs to.
    let owner = owner_of(&d, &group)?;
    let get = |series: &str| {
        let series = series
            .replace(r#"controller="G""#, r#"controller="G",owner="O""#)
            .replace(r#"group="G""#, r#"group="G",owner="O""#)
            .replace("\"G\"", &format!("\"{group}\""))
            .replace("\"O\"", &format!("\"{owner}\""));
        s_.get(&series)
            .copied()
            .unwrap_or_else(|| panic!("no series {series} in {s_:#?}"))
    };
    // Four keys were added and delivered; "held" is still out.
    assert_eq!(get(r#"workqueue_adds_total{name="G",controller="G"}"#), 4.0);
    assert_eq!(
        get(r#"workqueue_retries_total{name="G",controller="G"}"#),
        1.0
    );
    assert_eq!(
        get(r#"workqueue_work_duration_seconds_count{name="G",controller="G"}"#),
        3.0
    );
    assert_eq!(
        get(r#"workqueue_queue_duration_seconds_count{name="G",controller="G"}"#),
        4.0
    );
    assert!(get(r#"workqueue_longest_running_processor_seconds{name="G",controller="G"}"#) > 0.0);
    assert!(get(r#"workqueue_unfinished_work_seconds{name="G",controller="G"}"#) > 0.0);
    assert_eq!(get(r#"kube_dispatch_group_keys{group="G"}"#), 4.0);
    assert_eq!(get(r#"kube_dispatch_group_in_flight{group="G"}"#), 1.0);
    // "requeue" waits an hour; "fail" waits for its backoff unless it is ready again already.
    let delayed = get(r#"kube_dispatch_group_delayed{group="G"}"#);
    let ready = get(r#"workqueue_depth{name="G",controller="G"}"#);
    assert_eq!(delayed + ready, 2.0, "delayed {delayed}, ready {ready}");
    assert!(delayed >= 1.0);
    // Of the delayed keys, "fail" backs off (if its 100 ms backoff has not run out yet).
    let backing_off = get(r#"kube_dispatch_group_backing_off{group="G"}"#);
    assert_eq!(backing_off, delayed - 1.0, "delayed {delayed}");
    assert_eq!(get(r#"kube_dispatch_group_sessions{group="G"}"#), 1.0);
    assert_eq!(
        get(r#"kube_dispatch_group_deliveries_total{group="G",reason="added"}"#),
        4.0
    );
    for (outcome, count) in [
        ("success", 1.0),
        ("failure", 1.0),
        ("requeue", 1.0),
        ("unknown", 1.0),
    ] {
        assert_eq!(
            get(&format!(
                r#"kube_dispatch_group_acks_total{{group="G",outcome="{outcome}"}}"#
            )),
            count,
            "{outcome}"
        );
    }
    assert_eq!(
        get(r#"kube_dispatch_group_expired_deliveries_total{group="G"}"#),
        0.0
    );
    // The watch behind the group: its first list, and the four objects it saw, under an
    // opaque id: no namespace or selector is served without authentication.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("kube_dispatch_watch") && l.contains(ns.name())),
        "{text}"
    );
    let id = kube_dispatch_dispatcher::watch::registry::watch_id(ns.name(), "", "");
    let w = samples(&text, &id);
    let watch = |series: String| {
        w.get(&series)
            .copied()
            .unwrap_or_else(|| panic!("no series {series} in {w:#?}"))
    };
    let labels = format!("resource=\"v1/configmaps\",watch=\"{id}\"");
    assert_eq!(
        watch(format!(
            "kube_dispatch_watch_events_total{{{labels},type=\"applied\"}}"
        )),
        4.0
    );
    assert_eq!(
        watch(format!("kube_dispatch_watch_relists_total{{{labels}}}")),
        1.0
    );
    assert_eq!(
        watch(format!("kube_dispatch_watch_gone_total{{{labels}}}")),
        0.0
    );
    d.stop().await;
    Ok(())
}

/// Writes the metric names `text` shows (as sampled: `_total` kept, histogram suffixes dropped)
/// to `exported-metrics-<process>.txt` under the test scratch folder, where the dashboard check
/// of `make test` (`tests/grafana/check-dashboard.sh`) reads what the tier exports.
fn record_exported(process: &str, text: &str) -> std::io::Result<()> {
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
fn owner_of(d: &TestDispatcher, group: &str) -> Result<String, &'static str> {
    d.handles
        .groups
        .all()
        .into_iter()
        .find(|g| g.id.name == group)
        .map(|g| g.id.owner.clone().unwrap_or_default())
        .ok_or("no group")
}

fn samples(text: &str, group: &str) -> BTreeMap<String, f64> {
    let quoted = format!("\"{group}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&quoted))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The ring's metrics follow a handover: a second dispatcher joins, the first adopts the new
/// ring, serves nothing moved until it settles, and records how long that took; a session that
/// stops polling shows as expired.
#[tokio::test]
async fn ring_and_session_metrics_follow_a_handover_and_an_expiry() -> TestResult {
    use kube_dispatch_runtime::metrics::Metrics;
    use kube_dispatch_tests::dispatcher::{TestSession, lease_config, subscription};

    let ns = TestNamespace::create("ring-metrics").await?;
    let bound = Duration::from_secs(2);
    let metrics = Metrics::default();
    let mut config = lease_config(ns.name(), "dispatcher-0", bound);
    config.metrics = metrics.clone();
    let d0 = TestDispatcher::start(config).await?;
    let mut slice = d0.handles.slice.clone();
    let settled_on = |n: usize| {
        move |s: &Arc<kube_dispatch_core::handover::Slice>| {
            s.is_settled() && s.ring.members().len() == n
        }
    };
    tokio::time::timeout(Duration::from_secs(30), slice.wait_for(settled_on(1))).await??;
    let d1 = TestDispatcher::start(lease_config(ns.name(), "dispatcher-1", bound)).await?;
    tokio::time::timeout(Duration::from_secs(30), slice.wait_for(settled_on(2))).await??;

    // A session that never polls expires after its ttl (3 s in tests).
    let _idle = TestSession::open(
        &d0,
        "idle",
        "replica-0",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    let value = |text: &str, series: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    // Expiry is found by the housekeeping task's timer: nothing to await but the figure.
    let text = eventually(Duration::from_secs(15), "the idle session expired", || {
        let text = metrics.encode();
        std::future::ready(
            (value(&text, "kube_dispatch_expired_sessions_total") == Some(1.0)).then_some(text),
        )
    })
    .await?;
    println!("{text}");
    assert_eq!(value(&text, "kube_dispatch_ring_members"), Some(2.0));
    assert_eq!(value(&text, "kube_dispatch_ring_changes_total"), Some(1.0));
    assert_eq!(value(&text, "kube_dispatch_ring_serving"), Some(1.0));
    // Two handovers settled: the first ring, and the one with dispatcher-1.
    assert_eq!(
        value(&text, "kube_dispatch_handover_seconds_count"),
        Some(2.0)
    );
    assert!(value(&text, "kube_dispatch_handover_seconds_sum").is_some_and(|s| s > 0.0));
    assert_eq!(value(&text, "kube_dispatch_groups"), Some(1.0));
    assert_eq!(value(&text, "kube_dispatch_sessions"), Some(0.0));
    d1.stop().await;
    d0.stop().await;
    Ok(())
}

/// The load balancer's metrics: leadership, and the replica it places.
#[tokio::test]
async fn load_balancer_metrics_show_leadership_and_placements() -> TestResult {
    use kube_dispatch_proto::v1::{RegisterRequest, load_balancer_client::LoadBalancerClient};
    use kube_dispatch_tests::loadbalancer::TestLoadBalancer;

    let ns = TestNamespace::create("lb-metrics").await?;
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let credentials = kube_dispatch_tests::credentials();
    let channel = credentials
        .endpoint(&lb.addr.to_string())?
        .connect()
        .await?;
    let mut client = LoadBalancerClient::with_interceptor(channel, credentials.bearer());
    let mut stream = client
        .register(RegisterRequest {
            group: "placed".into(),
            replica_id: "replica-0".into(),
            dispatchers: Vec::new(),
        })
        .await?
        .into_inner();
    stream.message().await?;
    let text = lb.metrics.encode();
    record_exported("loadbalancer", &text)?;
    let value = |series: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    assert_eq!(value("kube_dispatch_lb_leader"), Some(1.0), "{text}");
    assert_eq!(value("kube_dispatch_lb_replicas"), Some(1.0), "{text}");
    assert_eq!(value("kube_dispatch_lb_groups"), Some(1.0), "{text}");
    assert_eq!(
        value("kube_dispatch_lb_assignments_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value("kube_dispatch_lb_moves_total"), Some(0.0), "{text}");
    Ok(())
}

/// The number of series a scrape shows.
fn series(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count()
}

/// A dispatcher's series do not grow with keys or replicas: the same count with 10 keys and one
/// session as with 10 000 keys, 100 sessions and deliveries in flight on each.
#[tokio::test]
async fn series_stay_bounded_with_10k_keys_and_100_replicas() -> TestResult {
    use kube_dispatch_core::{
        key::KeyRef,
        queue::Observed,
        transit::{GroupEvent, Origin},
    };
    use kube_dispatch_runtime::metrics::Metrics;
    use kube_dispatch_tests::dispatcher::{TestSession, subscription};

    let ns = TestNamespace::create("cardinality").await?;
    let metrics = Metrics::default();
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.metrics = metrics.clone();
    // Opening 100 sessions and queueing 10k keys can take longer than the tests' 3 s session
    // ttl on a loaded machine; the first session must outlive it.
    config.settings.limits.default_ttl = Duration::from_secs(60);
    let d = TestDispatcher::start(config).await?;
    let group = "cardinality";
    let sub = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut sessions = vec![TestSession::open(&d, group, "replica-0", sub()).await?];
    let g = d
        .handles
        .groups
        .all()
        .into_iter()
        .find(|g| g.id.name == group)
        .ok_or("no group")?;
    let owner = owner_of(&d, group)?;
    let change = |i: usize| {
        let key = format!("/ConfigMap/{}/cm-{i}", ns.name());
        g.record(GroupEvent::Exists {
            key: KeyRef::new(&key),
            object: Observed {
                resource_version: i.to_string(),
                uid: String::new(),
                body: None,
                trace: None,
            },
            epoch: 1,
            origin: Origin::Stream,
        });
    };
    (0..10).for_each(change);
    sessions[0].hold(Duration::from_secs(10)).await?;
    let small = metrics.encode();

    for r in 1..100 {
        sessions.push(TestSession::open(&d, group, &format!("replica-{r}"), sub()).await?);
    }
    (10..10_000).for_each(change);
    // Deliveries in flight on many sessions, the rest of the keys queued.
    for s in sessions.iter_mut().take(20) {
        s.hold(Duration::from_secs(10)).await?;
    }
    let large = metrics.encode();
    assert_eq!(g.key_count(), 10_000);
    let value = |text: &str, series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    let sessions_series =
        format!("kube_dispatch_group_sessions{{group=\"{group}\",owner=\"{owner}\"}}");
    assert_eq!(value(&large, &sessions_series), 100.0, "{large}");
    assert_eq!(
        value(
            &large,
            &format!("kube_dispatch_group_keys{{group=\"{group}\",owner=\"{owner}\"}}")
        ),
        10_000.0
    );
    println!(
        "series: {} with 10 keys and 1 replica, {} with 10000 keys and 100 replicas",
        series(&small),
        series(&large)
    );
    assert_eq!(series(&small), series(&large), "{large}");
    d.stop().await;
    Ok(())
}

/// Reconciles of one owner ConfigMap (`case=<case>`) under `group`: each writes the owner's
/// child Secret (server-side apply, controller owner reference) and reports the owner's
/// resourceVersion.
async fn run_owner_controller(
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

/// A reconcile that writes its object's children makes the dispatcher deliver the object again
/// once the children's changes come back (reason `OWNED`, no body): the replica hands the
/// object it already holds at that version to the reconcile, and reads nothing. With no
/// objects kept (`recent_objects(0)`), the same delivery costs a GET.
#[tokio::test]
async fn the_echo_of_a_reconciles_own_writes_reads_nothing() -> TestResult {
    // A namespace each: a group's watch of children would otherwise see the other's child,
    // and deliver its owner too (an owned change queues an owner the group has not seen).
    let (ns_kept, ns_none) = (
        TestNamespace::create("recent-kept").await?,
        TestNamespace::create("recent-none").await?,
    );
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let kept = format!("kept-{}", ns_kept.name());
    let none = format!("none-{}", ns_none.name());
    let mut running = Vec::new();
    for (ns, group, case, bytes) in [
        (&ns_kept, &kept, "kept", 1 << 20),
        (&ns_none, &none, "none", 0),
    ] {
        let (stop, task, mut reconciled) = run_owner_controller(ns, &d, group, case, bytes).await?;
        // The first reconcile (the object's body came with it), then the one its write of the
        // child caused, at the same version of the owner.
        let first = tokio::time::timeout(Duration::from_secs(30), reconciled.recv())
            .await?
            .ok_or("the controller stopped")?;
        let echo = tokio::time::timeout(Duration::from_secs(30), reconciled.recv())
            .await?
            .ok_or("the controller stopped")?;
        assert_eq!(first, echo, "{case}: the owner did not change between them");
        running.push((stop, task));
    }
    let text = kube_dispatch_controller::metrics::registry().encode();
    let count = |group: &str, series: &str| {
        samples(&text, group)
            .get(&series.replace('G', group))
            .copied()
            .unwrap_or_else(|| panic!("no series {series} for {group}:\n{text}"))
    };
    for group in [&kept, &none] {
        assert!(
            count(
                group,
                r#"kube_dispatch_deliveries_total{controller="G",reason="owned"}"#
            ) >= 1.0
        );
    }
    let read = r#"kube_dispatch_objects_loaded_total{controller="G",source="read"}"#;
    let recent = r#"kube_dispatch_objects_loaded_total{controller="G",source="recent"}"#;
    let gets = r#"kube_dispatch_api_requests_total{controller="G",verb="get"}"#;
    assert_eq!(
        (count(&kept, read), count(&kept, gets)),
        (0.0, 0.0),
        "kept: the echo read nothing"
    );
    assert!(count(&kept, recent) >= 1.0);
    assert!(count(&none, read) >= 1.0, "none: the echo is read");
    assert_eq!(count(&none, gets), count(&none, read));
    assert_eq!(count(&none, recent), 0.0);
    for (stop, task) in running {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), task).await??;
    }
    d.stop().await;
    Ok(())
}
