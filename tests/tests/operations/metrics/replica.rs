//! The replica's metrics against the real API server: controller-runtime's names, types and
//! labels, moving with reconciles; a reconcile's echo of its own writes reads nothing.

use super::support::*;

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
    // Every delivery of a change says how long its key waited at the dispatcher, so its
    // reconcile's start is in the tier's ready-to-reconcile latency too; the first list's
    // deliveries, which wait behind the changes by design, are not.
    assert_eq!(
        get(r#"kube_dispatch_ready_to_reconcile_seconds_count{controller="G"}"#),
        reconciles - names.len() as f64
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

/// A reconcile that writes its object's children makes the dispatcher deliver the object again
/// once the children's changes come back (reason `OWNED`): the delivery carries the object as
/// the dispatcher's watch last showed it, which the dispatcher keeps for groups with children,
/// so the replica reads nothing, whether it keeps recent objects itself or not
/// (`recent_objects(0)`).
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
    let request = r#"kube_dispatch_objects_loaded_total{controller="G",source="request"}"#;
    for group in [&kept, &none] {
        assert_eq!(
            (count(group, read), count(group, gets)),
            (0.0, 0.0),
            "{group}: the echo read nothing"
        );
        // The first reconcile's object and the echo's both came with their deliveries.
        assert!(count(group, request) >= 2.0, "{group}");
        assert_eq!(count(group, recent), 0.0, "{group}");
    }
    for (stop, task) in running {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), task).await??;
    }
    d.stop().await;
    Ok(())
}

/// Two controllers of one process that name the same admin address share one endpoint, as an
/// operator's controllers share its manager's probes: `/readyz` is ready only while both have
/// a dispatcher session open, and names the one that has none.
#[tokio::test]
async fn controllers_of_one_process_share_one_admin_endpoint() -> TestResult {
    let ns = TestNamespace::create("shared-admin").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let admin = free_port()?;
    let stop = CancellationToken::new();
    let start = |group: String, dispatcher: String| {
        let controller = Controller::<ConfigMap>::new(ns.client(), group)
            .namespace(ns.name())
            .dispatchers([dispatcher])
            .credentials(kube_dispatch_tests::credentials())
            .admin_listen(admin)
            .graceful_shutdown_on(stop.clone().cancelled_owned());
        let (done, _) = mpsc::unbounded_channel();
        let ctx = Ctx {
            client: controller.client(),
            done,
            seen: Mutex::default(),
        };
        let run = controller.run(reconcile, error_policy, Arc::new(ctx));
        tokio::spawn(run.for_each(|_| async {}))
    };
    let first = format!("first-{}", ns.name());
    let connected = start(first, d.addr.to_string());
    let within = Duration::from_secs(20);
    eventually(
        within,
        "/readyz ready with the first controller",
        || async { (http_get(admin, "/readyz").await.ok()? == (200, "ok\n".into())).then_some(()) },
    )
    .await?;

    // The second has no dispatcher to reach (nothing listens on a port just freed), so no
    // session.
    let second = format!("second-{}", ns.name());
    let unreachable = format!("127.0.0.1:{}", free_port()?.port());
    let waiting = start(second.clone(), unreachable);
    let want = format!("not ready: controller {second}: no dispatcher session open\n");
    eventually(within, "/readyz naming the second controller", || async {
        let (status, body) = http_get(admin, "/readyz").await.ok()?;
        (status == 503 && body == want).then_some(())
    })
    .await?;
    let (status, _) = http_get(admin, "/healthz").await?;
    assert_eq!(
        status, 200,
        "one endpoint serves both: it was not bound twice"
    );

    stop.cancel();
    for task in [connected, waiting] {
        tokio::time::timeout(Duration::from_secs(30), task).await??;
    }
    d.stop().await;
    Ok(())
}
