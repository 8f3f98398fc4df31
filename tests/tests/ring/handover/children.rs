//! An owner's children across handovers: complete after a join and a restart, and with their
//! bodies, and the owners' own, when a member leaves and at a cold start.

use super::support::*;

/// An owner's children stay complete across a handover and a dispatcher restart: the owner's
/// key moves to a joining dispatcher, whose first request for it caused by a child's change
/// says COMPLETE and lists every child as it is now; the same after that dispatcher restarts.
#[tokio::test]
async fn an_owners_children_are_complete_after_a_handover_and_a_restart() -> TestResult {
    use kube::{Resource as _, api::PostParams};
    use kube_dispatch_proto::v1::{ChildrenState, ReconcileRequest};
    use kube_dispatch_tests::{Widget, WidgetSpec, ensure_widget_crd, widget_ref};

    let ns = TestNamespace::create("children-handover").await?;
    ensure_widget_crd(&ns.client()).await?;
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    // An owner the joining dispatcher-1 will own.
    let two = Ring::new((0..2).map(name));
    let owner = (0..64)
        .map(|i| format!("w-{i}"))
        .find(|w| {
            let key = RequestKey::new("test.kube-dispatch.dev", "Widget", ns.name(), w);
            two.owner(&key) == Some("dispatcher-1")
        })
        .expect("some name lands on dispatcher-1");
    let key = format!("test.kube-dispatch.dev/Widget/{}/{owner}", ns.name());
    let w = widgets
        .create(
            &PostParams::default(),
            &Widget::new(&owner, WidgetSpec { size: 1 }),
        )
        .await?;
    let reference = w
        .controller_owner_ref(&())
        .ok_or("a created Widget has a uid")?;
    for child in ["c1", "c2"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(child.into());
        cm.metadata.owner_references = Some(vec![reference.clone()]);
        configmaps.create(&PostParams::default(), &cm).await?;
    }
    let owned = || {
        vec![Subscription {
            owner: Some(widget_ref()),
            ..subscription("v1", "ConfigMap", ns.name())
        }]
    };
    // The children as the API server has them now: (name, resourceVersion).
    let now = async || -> TestResult<Vec<(String, String)>> {
        let mut kids: Vec<(String, String)> = configmaps
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(|c| (c.name_any(), c.resource_version().unwrap_or_default()))
            .collect();
        kids.sort();
        Ok(kids)
    };
    let shown = |r: &ReconcileRequest| -> Vec<(String, String)> {
        r.children
            .iter()
            .map(|c| {
                let name = c
                    .object
                    .as_ref()
                    .map(|o| o.name.clone())
                    .unwrap_or_default();
                (name, c.resource_version.clone())
            })
            .collect()
    };
    // Changes child `child`, then waits for the owner's first COMPLETE request on `session`
    // that shows the change.
    let complete_after_change = async |session: &mut TestSession, child: &str, value: &str| {
        let patch = serde_json::json!({ "data": { "v": value } });
        let changed = configmaps
            .patch(child, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("child changed")
            .resource_version()
            .unwrap_or_default();
        let shows = |r: &ReconcileRequest| {
            r.key == key
                && r.children_state == ChildrenState::Complete as i32
                && shown(r).contains(&(child.to_owned(), changed.clone()))
        };
        let got = session
            .collect_until(Duration::from_secs(30), |got| got.iter().any(shows))
            .await;
        got.into_iter()
            .find(shows)
            .unwrap_or_else(|| panic!("no complete request for {key} showing {child} changed"))
    };

    let mut ds = start_settled(ns.name(), 1, BOUND).await?;
    let mut s0 = TestSession::open(&ds[&0], "children", "replica-0", owned()).await?;
    let first = complete_after_change(&mut s0, "c1", "one").await;
    assert_eq!(shown(&first), now().await?, "on dispatcher-0");
    // The replica on dispatcher-0 goes on polling, as a real one does: what dispatcher-0 has
    // ready for it when the key moves away is delivered, so dispatcher-0 can release the ring.
    let replica_0 = tokio::spawn(async move {
        s0.collect_until(Duration::from_secs(3600), |_| false).await;
    });

    ds.insert(1, start(ns.name(), 1).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let mut s1 = TestSession::open(&ds[&1], "children", "replica-1", owned()).await?;
    let moved = complete_after_change(&mut s1, "c2", "two").await;
    assert_eq!(
        shown(&moved),
        now().await?,
        "on dispatcher-1 after the handover"
    );

    if let Some(d) = ds.remove(&1) {
        d.stop().await;
    }
    ds.insert(1, start(ns.name(), 1).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let mut s1 = TestSession::open(&ds[&1], "children", "replica-1b", owned()).await?;
    let restarted = complete_after_change(&mut s1, "c1", "three").await;
    assert_eq!(
        shown(&restarted),
        now().await?,
        "on dispatcher-1 after its restart"
    );
    replica_0.abort();
    stop_all([], ds, []).await;
    Ok(())
}

/// dispatcher-1 leaves the ring gracefully; dispatcher-0 lists beside its watches for the
/// owners that come to it, the children first: each moved owner's first request there carries
/// the owner's body and its children complete, each with its body, so a controller reads
/// neither (before, the children's list queued the owners without bodies, and owners listed
/// before their children were requested with them incomplete).
#[tokio::test]
async fn owners_that_come_to_a_survivor_bring_their_bodies_and_all_their_children() -> TestResult {
    use kube_dispatch_proto::{capabilities::CHILDREN_BODIES, v1::ReconcileRequest};

    const OWNERS: usize = 16;
    let two = Ring::new((0..2).map(name));
    // The keys of the owners `w-0..16` that land on dispatcher-1: at least one.
    let moving = |ns: &str| -> Vec<String> {
        (0..OWNERS)
            .map(|i| RequestKey::new("test.kube-dispatch.dev", "Widget", ns, format!("w-{i}")))
            .filter(|k| two.owner(k) == Some("dispatcher-1"))
            .map(|k| k.to_string())
            .collect()
    };
    let ns = TestNamespace::create_where("children-survivor", |ns| !moving(ns).is_empty()).await?;
    let owners = widgets_owning_two(&ns, OWNERS).await?;
    let key = |owner: &str| format!("test.kube-dispatch.dev/Widget/{}/{owner}", ns.name());
    let moving = moving(ns.name());
    let subscriptions = || widgets_and_their_configmaps(ns.name());
    let mut ds = start_settled(ns.name(), 2, BOUND).await?;
    let open = async |d: &TestDispatcher, replica: &str| {
        TestSession::open_with_capabilities(
            d,
            "owners",
            replica,
            subscriptions(),
            &[CHILDREN_BODIES],
        )
        .await
    };
    let mut s0 = open(&ds[&0], "replica-0").await?;
    let mut s1 = open(&ds[&1], "replica-1").await?;
    // Every owner reconciled once where it is, and acknowledged.
    let seen = |got: &[ReconcileRequest], keys: &[String]| {
        keys.iter().all(|k| got.iter().any(|r| r.key == *k))
    };
    let timeout = Duration::from_secs(30);
    let on_1 = s1.collect_until(timeout, |got| seen(got, &moving)).await;
    assert!(seen(&on_1, &moving), "{on_1:?}");
    let staying: Vec<String> = owners
        .iter()
        .map(|o| key(o))
        .filter(|k| !moving.contains(k))
        .collect();
    s0.collect_until(timeout, |got| seen(got, &staying)).await;

    if let Some(d) = ds.remove(&1) {
        d.stop().await;
    }
    let got = s0.collect_until(timeout, |got| seen(got, &moving)).await;
    assert_whole_at_first(&got, &moving, "on the survivor");
    stop_all([], ds, []).await;
    Ok(())
}

/// A dispatcher's cold start: its watch of the owners lists them once their children's watch
/// has listed the children, so each owner's first request carries its body and its children
/// complete, each with its body, and a controller reads none of them (before, the owners' list
/// ran beside the children's and most owners came with their children incomplete).
#[tokio::test]
async fn a_cold_starts_owners_come_with_their_bodies_and_all_their_children() -> TestResult {
    use kube_dispatch_proto::capabilities::CHILDREN_BODIES;

    const OWNERS: usize = 64;
    let ns = TestNamespace::create("children-cold-start").await?;
    let owners = widgets_owning_two(&ns, OWNERS).await?;
    let keys: Vec<String> = owners
        .iter()
        .map(|o| format!("test.kube-dispatch.dev/Widget/{}/{o}", ns.name()))
        .collect();
    let subscriptions = widgets_and_their_configmaps(ns.name());
    let ds = start_settled(ns.name(), 1, BOUND).await?;
    // The group's first session starts its watches.
    let mut s0 = TestSession::open_with_capabilities(
        &ds[&0],
        "owners",
        "replica-0",
        subscriptions,
        &[CHILDREN_BODIES],
    )
    .await?;
    let got = s0
        .collect_until(Duration::from_secs(30), |got| {
            keys.iter().all(|k| got.iter().any(|r| r.key == *k))
        })
        .await;
    assert_whole_at_first(&got, &keys, "at the cold start");
    stop_all([], ds, []).await;
    Ok(())
}

/// That the first request for each of `keys` in `got` carries the owner's body and its two
/// children, complete and each with its body.
fn assert_whole_at_first(
    got: &[kube_dispatch_proto::v1::ReconcileRequest],
    keys: &[String],
    when: &str,
) {
    use kube_dispatch_proto::v1::ChildrenState;

    for k in keys {
        let first = got
            .iter()
            .find(|r| r.key == *k)
            .unwrap_or_else(|| panic!("{k} was not reconciled {when}: {got:?}"));
        assert!(
            !first.object_json.is_empty(),
            "{k} came without its body {when}"
        );
        assert_eq!(
            first.children_state,
            ChildrenState::Complete as i32,
            "{k} {when}: {first:?}"
        );
        assert_eq!(first.children.len(), 2, "{k} {when}: {first:?}");
        assert!(
            first.children.iter().all(|c| !c.object_json.is_empty()),
            "{k} {when}: a child came without its body"
        );
    }
}

/// A controller of the Widgets in `namespace` that owns ConfigMaps: its subscriptions.
fn widgets_and_their_configmaps(namespace: &str) -> Vec<Subscription> {
    use kube_dispatch_tests::widget_ref;

    vec![
        Subscription {
            resource: Some(widget_ref()),
            namespace: namespace.to_owned(),
            ..Default::default()
        },
        Subscription {
            owner: Some(widget_ref()),
            ..subscription("v1", "ConfigMap", namespace)
        },
    ]
}

/// Widgets `w-0..count` in `ns`, each the controller of two ConfigMaps: their names.
async fn widgets_owning_two(ns: &TestNamespace, count: usize) -> TestResult<Vec<String>> {
    use kube::{Resource as _, api::PostParams};
    use kube_dispatch_tests::{Widget, WidgetSpec, ensure_widget_crd};

    ensure_widget_crd(&ns.client()).await?;
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let owners: Vec<String> = (0..count).map(|i| format!("w-{i}")).collect();
    for owner in &owners {
        let spec = WidgetSpec { size: 1 };
        let w = widgets
            .create(&PostParams::default(), &Widget::new(owner, spec))
            .await?;
        let reference = w
            .controller_owner_ref(&())
            .ok_or("a created Widget has a uid")?;
        for i in 0..2 {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("{owner}-c{i}"));
            cm.metadata.owner_references = Some(vec![reference.clone()]);
            cm.data = Some([("v".to_owned(), owner.clone())].into());
            configmaps.create(&PostParams::default(), &cm).await?;
        }
    }
    Ok(owners)
}
