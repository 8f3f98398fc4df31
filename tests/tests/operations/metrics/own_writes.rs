//! A reconcile's own write of its object: the delivery of the version the write made (its
//! change coming back from the dispatcher's watch) is handed what the write answered, without
//! a read, even where requests carry no bodies.

use kube_dispatch_controller::PayloadMode;

use super::support::*;

/// The controller's client, and where it reports the versions its reconciles were given.
struct Marker {
    client: kube::Client,
    seen: mpsc::UnboundedSender<String>,
}

/// Marks the ConfigMap once, by a conditional patch of its own; reports every version given.
async fn reconcile(
    cm: Arc<ConfigMap>,
    ctx: Arc<Marker>,
) -> Result<Action, precondition::WriteError> {
    let _ = ctx.seen.send(cm.resource_version().unwrap_or_default());
    if cm.annotations().contains_key("marked") {
        return Ok(Action::await_change());
    }
    let api: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap_or_default());
    let mark = serde_json::json!({ "metadata": { "annotations": { "marked": "yes" } } });
    precondition::patch(&api, &cm, mark).await?;
    Ok(Action::await_change())
}

/// Requests without bodies: the first delivery is read; the second, of the version the
/// reconcile's own patch made, is the object that patch answered.
#[tokio::test]
async fn the_change_of_a_reconciles_own_write_is_handed_what_the_write_answered() -> TestResult {
    let ns = TestNamespace::create("own-writes").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let group = format!("own-{}", ns.name());
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("a".into());
    let created = api.create(&PostParams::default(), &cm).await?;
    let (seen, mut versions) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let controller = Controller::<ConfigMap>::new(ns.client(), &group)
        .namespace(ns.name())
        .payload(PayloadMode::KeyOnly)
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .graceful_shutdown_on(stop.clone().cancelled_owned());
    let stream = controller.run(
        reconcile,
        |_, _: &precondition::WriteError, _| Action::await_change(),
        Arc::new(Marker {
            client: ns.client(),
            seen,
        }),
    );
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), versions.recv())
            .await
            .ok()
            .flatten()
            .ok_or("no reconcile within 30 s")
    };
    assert_eq!(next().await?, created.resource_version().unwrap());
    let marked = next().await?;
    assert_eq!(
        api.get("a").await?.resource_version(),
        Some(marked),
        "the second reconcile is of the marked version"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;

    let text = kube_dispatch_controller::metrics::registry().encode();
    let s = samples(&text, &group);
    let count = |series: &str| {
        s.get(&series.replace('G', &group))
            .copied()
            .unwrap_or_default()
    };
    assert_eq!(
        (
            count(r#"kube_dispatch_objects_loaded_total{controller="G",source="read"}"#),
            count(r#"kube_dispatch_objects_loaded_total{controller="G",source="recent"}"#),
            count(r#"kube_dispatch_api_requests_total{controller="G",verb="get"}"#),
        ),
        (1.0, 1.0, 1.0),
        "one read, of the first version; the marked one was the patch's answer:\n{text}"
    );
    d.stop().await;
    Ok(())
}
