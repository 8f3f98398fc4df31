//! Change filters (keys.md, "Change filters"): a subscription with `only_changes_of` is not
//! delivered the changes that leave the parts it compares as they were, on the real API server.

use kube_dispatch_proto::v1::ObjectPart;
use kube_dispatch_tests::widget_ref;

use super::support::*;

/// The changes the group's change filter has held back so far.
fn filtered(d: &TestDispatcher, group: &str) -> u64 {
    d.handles
        .groups
        .all()
        .into_iter()
        .find(|g| g.id.name == group)
        .map_or(0, |g| g.figures().queue.counts.changes_filtered)
}

/// Waits until the group's change filter has held back `n` changes.
async fn await_filtered(d: &TestDispatcher, group: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while filtered(d, group) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} changes filtered of {n} after {TIMEOUT:?}",
            filtered(d, group)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With a generation and label filter, a status write and an annotation are not delivered (a
/// group without the filter gets both), while a label change and a spec change are, at their
/// own versions.
#[tokio::test]
async fn a_change_filter_delivers_only_changes_of_its_parts() -> TestResult {
    let ns = TestNamespace::create("dispatch-change-filter").await?;
    ensure_widget_crd(&ns.client()).await?;
    let api: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let widgets = Subscription {
        resource: Some(widget_ref()),
        namespace: ns.name().into(),
        ..Subscription::default()
    };
    let filtered_sub = Subscription {
        only_changes_of: vec![ObjectPart::Generation as i32, ObjectPart::Labels as i32],
        ..widgets.clone()
    };
    let mut every = TestSession::open(&d, "every", "r1", vec![widgets]).await?;
    let mut some = TestSession::open(&d, "some", "r1", vec![filtered_sub]).await?;
    let delivered_at =
        |rv: String| move |got: &[ReconcileRequest]| got.iter().any(|r| r.resource_version == rv);

    let created = api
        .create(
            &PostParams::default(),
            &Widget::new("w", WidgetSpec { size: 1 }),
        )
        .await?;
    let rv = created.resource_version().unwrap();
    let mut got = some.collect_until(TIMEOUT, delivered_at(rv.clone())).await;
    every.collect_until(TIMEOUT, delivered_at(rv)).await;

    // A status write and an annotation: the generation and the labels stay.
    let status = serde_json::json!({ "status": { "seen": 1 } });
    let written = api
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    every
        .collect_until(TIMEOUT, delivered_at(written.resource_version().unwrap()))
        .await;
    await_filtered(&d, "some", 1).await;
    let note = serde_json::json!({ "metadata": { "annotations": { "note": "x" } } });
    let annotated = api
        .patch("w", &PatchParams::default(), &Patch::Merge(&note))
        .await?;
    assert_eq!(annotated.metadata.generation, created.metadata.generation);
    every
        .collect_until(TIMEOUT, delivered_at(annotated.resource_version().unwrap()))
        .await;
    await_filtered(&d, "some", 2).await;

    // A label change, then a spec change: each delivered at its version.
    let label = serde_json::json!({ "metadata": { "labels": { "tier": "a" } } });
    let labelled = api
        .patch("w", &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let labelled_rv = labelled.resource_version().unwrap();
    got.extend(
        some.collect_until(TIMEOUT, delivered_at(labelled_rv.clone()))
            .await,
    );
    let spec = serde_json::json!({ "spec": { "size": 2 } });
    let resized = api
        .patch("w", &PatchParams::default(), &Patch::Merge(&spec))
        .await?;
    let resized_rv = resized.resource_version().unwrap();
    got.extend(
        some.collect_until(TIMEOUT, delivered_at(resized_rv.clone()))
            .await,
    );

    let seen: Vec<(Reason, &str)> = got
        .iter()
        .map(|r| (reason(r), r.resource_version.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (Reason::Added, created.resource_version().unwrap().as_str()),
            (Reason::Modified, labelled_rv.as_str()),
            (Reason::Modified, resized_rv.as_str()),
        ],
        "the filtered group's deliveries"
    );
    let last: Widget = serde_json::from_slice(&got[2].object_json)?;
    assert_eq!(last.spec.size, 2);
    assert_eq!(filtered(&d, "some"), 2);
    assert_eq!(filtered(&d, "every"), 0);
    d.stop().await;
    Ok(())
}

/// A change filter on a subscription mapped to owners is refused, saying why.
#[tokio::test]
async fn a_change_filter_on_owned_objects_is_refused() -> TestResult {
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let mut owned = subscription("v1", "ConfigMap", "default");
    owned.owner = Some(widget_ref());
    owned.only_changes_of = vec![ObjectPart::Generation as i32];
    let primary = Subscription {
        resource: Some(widget_ref()),
        ..Subscription::default()
    };
    let err = TestSession::open(&d, "g", "r1", vec![primary, owned])
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("only_changes_of cannot be set with owner"),
        "{}",
        err.message()
    );
    d.stop().await;
    Ok(())
}
