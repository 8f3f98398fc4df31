//! The dispatcher's and the load balancer's metrics: the queue, the ring and sessions,
//! leadership and placements, and series bounded whatever the keys and replicas.

use super::support::*;

/// The dispatcher's per-group metrics move with what its queue does: adds, deliveries by
/// reason, acks by outcome, retries, work duration, and the figures of keys in flight and
/// delayed, with controller-runtime's `workqueue_*` names and labels.
#[tokio::test]
async fn dispatcher_metrics_move_with_the_queue() -> TestResult {
    use kube_dispatch_proto::v1::{AckItem, Requeue, ack_item};
    use kube_dispatch_telemetry::metrics::Metrics;
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

/// The ring's metrics follow a handover: a second dispatcher joins, the first adopts the new
/// ring, serves nothing moved until it settles, and records how long that took; a session that
/// stops polling shows as expired.
#[tokio::test]
async fn ring_and_session_metrics_follow_a_handover_and_an_expiry() -> TestResult {
    use kube_dispatch_telemetry::metrics::Metrics;
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

/// A dispatcher's series do not grow with keys or replicas: the same count with 10 keys and one
/// session as with 10 000 keys, 100 sessions and deliveries in flight on each.
#[tokio::test]
async fn series_stay_bounded_with_10k_keys_and_100_replicas() -> TestResult {
    use kube_dispatch_core::{
        key::KeyRef,
        queue::Observed,
        transit::{GroupEvent, Origin},
    };
    use kube_dispatch_telemetry::metrics::Metrics;
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
                fingerprint: None,
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
