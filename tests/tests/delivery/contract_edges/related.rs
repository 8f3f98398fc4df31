//! Contract edges of related objects: ownership chains, owners that lose children, children as
//! new as the change, named objects, and triggers.

use super::support::*;

#[tokio::test]
async fn a_grandchild_does_not_reach_the_top_of_an_ownership_chain() -> TestResult {
    let ns = TestNamespace::create("edges-chain").await?;
    ensure_widget_crd(&ns.client()).await?;
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let widget_ref = kube_dispatch_tests::widget_ref();
    let primary = Subscription {
        resource: Some(widget_ref.clone()),
        namespace: ns.name().into(),
        ..Subscription::default()
    };
    let owned = Subscription {
        owner: Some(widget_ref),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut s = TestSession::open(&d, "widgets", "r1", vec![primary, owned]).await?;
    let owner_ref = |api_version: &str, kind: &str, name: &str, uid: String| OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid,
        controller: Some(true),
        ..OwnerReference::default()
    };
    let owned_by = |name: &str, owner: OwnerReference| {
        let mut cm = labelled(name, "x");
        cm.metadata.owner_references = Some(vec![owner]);
        cm
    };
    // Two widgets; "top" owns ConfigMap "mid", which owns ConfigMap "leaf".
    let mut uids = Vec::new();
    for name in ["top", "other"] {
        let w = widgets
            .create(
                &PostParams::default(),
                &Widget::new(name, WidgetSpec { size: 1 }),
            )
            .await?;
        uids.push(w.uid().unwrap_or_default());
    }
    let widget_key = |name: &str| format!("test.kube-dispatch.dev/Widget/{}/{name}", ns.name());
    let got = s.collect_until(TIMEOUT, |g| g.len() >= 2).await;
    assert_eq!(got.len(), 2);
    let mid = configmaps
        .create(
            &PostParams::default(),
            &owned_by(
                "mid",
                owner_ref(
                    "test.kube-dispatch.dev/v1",
                    "Widget",
                    "top",
                    uids[0].clone(),
                ),
            ),
        )
        .await?;
    // The child reaches its owner.
    let child = next(&mut s).await?;
    assert_eq!(
        (reason(&child), child.key.as_str()),
        (Reason::Owned, widget_key("top").as_str())
    );
    // The grandchild is owned by a ConfigMap, not a Widget: it reaches nothing. A child of the
    // other widget, created after it on the same watch, shows it has been seen.
    configmaps
        .create(
            &PostParams::default(),
            &owned_by(
                "leaf",
                owner_ref("v1", "ConfigMap", "mid", mid.uid().unwrap_or_default()),
            ),
        )
        .await?;
    configmaps
        .create(
            &PostParams::default(),
            &owned_by(
                "marker",
                owner_ref(
                    "test.kube-dispatch.dev/v1",
                    "Widget",
                    "other",
                    uids[1].clone(),
                ),
            ),
        )
        .await?;
    let got = s
        .collect_until(TIMEOUT, |g| g.iter().any(|r| r.key == widget_key("other")))
        .await;
    let keys: Vec<(Reason, &str)> = got.iter().map(|r| (reason(r), r.key.as_str())).collect();
    assert_eq!(keys, [(Reason::Owned, widget_key("other").as_str())]);
    d.stop().await;
    Ok(())
}

/// A child whose controlling owner changes is delivered to both owners: the new one, and the
/// one that lost it (which the child no longer names, so only the dispatcher's memory of it can
/// tell); a child that loses its owner tells the owner it had.
#[tokio::test]
async fn an_owner_that_loses_a_child_hears_of_it() -> TestResult {
    let ns = TestNamespace::create("edges-adoption").await?;
    ensure_widget_crd(&ns.client()).await?;
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let widget_ref = kube_dispatch_tests::widget_ref();
    let owned = Subscription {
        owner: Some(widget_ref),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut s = TestSession::open(&d, "adoption", "r1", vec![owned]).await?;
    let mut refs = Vec::new();
    for name in ["first", "second"] {
        let w = widgets
            .create(
                &PostParams::default(),
                &Widget::new(name, WidgetSpec { size: 1 }),
            )
            .await?;
        refs.push(OwnerReference {
            api_version: "test.kube-dispatch.dev/v1".into(),
            kind: "Widget".into(),
            name: name.into(),
            uid: w.uid().unwrap_or_default(),
            controller: Some(true),
            ..OwnerReference::default()
        });
    }
    let widget_key = |name: &str| format!("test.kube-dispatch.dev/Widget/{}/{name}", ns.name());
    let mut child = labelled("child", "x");
    child.metadata.owner_references = Some(vec![refs[0].clone()]);
    configmaps.create(&PostParams::default(), &child).await?;
    let got = next(&mut s).await?;
    assert_eq!(
        (reason(&got), got.key.as_str()),
        (Reason::Owned, widget_key("first").as_str())
    );
    // Indexed before its owner was queued, and counted with its size.
    assert_eq!(d.watch_total(|c| &c.children), 1);
    let bytes = d.watch_total(|c| &c.children_bytes);
    assert!(
        (100..1000).contains(&bytes),
        "one child's entry: {bytes} bytes"
    );
    // Adopted by the second widget: both widgets hear of it.
    configmaps
        .patch(
            "child",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"ownerReferences": [refs[1]]}})),
        )
        .await?;
    let mut got = s.collect_until(TIMEOUT, |g| g.len() >= 2).await;
    got.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<(Reason, &str)> = got.iter().map(|r| (reason(r), r.key.as_str())).collect();
    assert_eq!(
        keys,
        [
            (Reason::Owned, widget_key("first").as_str()),
            (Reason::Owned, widget_key("second").as_str()),
        ]
    );
    // Orphaned: the second widget, which lost it, hears of it.
    configmaps
        .patch(
            "child",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"ownerReferences": null}})),
        )
        .await?;
    let got = next(&mut s).await?;
    assert_eq!(
        (reason(&got), got.key.as_str()),
        (Reason::Owned, widget_key("second").as_str())
    );
    assert_eq!(
        (
            d.watch_total(|c| &c.children),
            d.watch_total(|c| &c.children_bytes)
        ),
        (0, 0),
        "an orphan is no one's child"
    );
    d.stop().await;
    Ok(())
}

/// An owner's request carries its children as the dispatcher's watch knows them, at least as
/// new as the change that caused it: a child created shows with its uid and resourceVersion,
/// a child deleted is gone from the very request its deletion caused.
#[tokio::test]
async fn an_owners_request_carries_its_children_as_new_as_the_change() -> TestResult {
    use kube_dispatch_proto::v1::ChildrenState;
    let ns = TestNamespace::create("edges-children").await?;
    ensure_widget_crd(&ns.client()).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let owned = Subscription {
        owner: Some(kube_dispatch_tests::widget_ref()),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut s = TestSession::open(&d, "children", "r1", vec![owned]).await?;
    let owner = widget_owner(&ns).await?;
    let children_of = |r: &ReconcileRequest| -> Vec<(String, String, String)> {
        r.children
            .iter()
            .map(|c| {
                let name = c
                    .object
                    .as_ref()
                    .map(|o| o.name.clone())
                    .unwrap_or_default();
                (name, c.uid.clone(), c.resource_version.clone())
            })
            .collect()
    };
    let seen = |cm: &ConfigMap| {
        (
            cm.name_any(),
            cm.uid().unwrap_or_default(),
            cm.resource_version().unwrap_or_default(),
        )
    };
    let mut created = Vec::new();
    for name in ["c1", "c2"] {
        let mut child = labelled(name, "x");
        child.metadata.owner_references = Some(vec![owner.clone()]);
        created.push(configmaps.create(&PostParams::default(), &child).await?);
        let got = next(&mut s).await?;
        assert_eq!(
            got.key,
            format!("test.kube-dispatch.dev/Widget/{}/w", ns.name())
        );
        assert_eq!(
            got.children_state,
            ChildrenState::Complete as i32,
            "the watch had listed everything"
        );
        let want: Vec<_> = created.iter().map(seen).collect();
        assert_eq!(children_of(&got), want, "every child so far, as created");
        let object = got.children[0].object.clone().unwrap_or_default();
        assert_eq!(
            (object.version.as_str(), object.kind.as_str()),
            ("v1", "ConfigMap")
        );
    }
    configmaps.delete("c1", &DeleteParams::default()).await?;
    let got = next(&mut s).await?;
    assert_eq!(
        children_of(&got),
        [seen(&created[1])],
        "the deletion that caused the request is already reflected in it"
    );
    d.stop().await;
    Ok(())
}

/// An owner's request carries its children's bodies, as the watch showed them at the versions
/// it lists, to a group whose client takes them (the capability "children-bodies"), and only to
/// it: another group fed by the same watch is told the names and versions alone. Children the
/// watch's first list shows come with theirs; a change of a child brings its new body; a
/// deleted child leaves with its body.
#[tokio::test]
async fn an_owners_children_come_with_their_bodies_to_clients_that_take_them() -> TestResult {
    use kube_dispatch_proto::{capabilities::CHILDREN_BODIES, v1::OpenSessionRequest};
    let ns = TestNamespace::create("edges-child-bodies").await?;
    ensure_widget_crd(&ns.client()).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let owner = widget_owner(&ns).await?;
    let child = |name: &str, value: &str| {
        let mut child = labelled(name, "x");
        child.metadata.owner_references = Some(vec![owner.clone()]);
        child.data = Some([("k".to_owned(), value.to_owned())].into());
        child
    };
    // A child that exists before any session: the watch's first list shows it.
    let before = configmaps
        .create(&PostParams::default(), &child("c0", "before"))
        .await?;
    let owned = Subscription {
        owner: Some(kube_dispatch_tests::widget_ref()),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut client = d.client().await;
    let id = client
        .open_session(OpenSessionRequest {
            group: "bodies".into(),
            replica_id: "r1".into(),
            subscriptions: vec![owned.clone()],
            capabilities: vec![CHILDREN_BODIES.into()],
            ..Default::default()
        })
        .await?
        .into_inner()
        .session_id;
    let mut taking = TestSession { client, id };
    let mut plain = TestSession::open(&d, "no-bodies", "r1", vec![owned]).await?;
    let bodies = |r: &ReconcileRequest| -> TestResult<Vec<Option<ConfigMap>>> {
        r.children
            .iter()
            .map(|c| match c.object_json.as_slice() {
                [] => Ok(None),
                json => Ok(Some(serde_json::from_slice(json)?)),
            })
            .collect()
    };
    let as_seen = |cm: &ConfigMap| (cm.uid(), cm.resource_version(), cm.data.clone());
    let got = next(&mut taking).await?;
    let carried = bodies(&got)?;
    let [Some(body)] = carried.as_slice() else {
        return Err(format!(
            "c0 with its body from the first list, got {:?}",
            got.children
        )
        .into());
    };
    assert_eq!(as_seen(body), as_seen(&before), "the child as listed");
    let got = next(&mut plain).await?;
    assert_eq!(
        bodies(&got)?,
        [None],
        "a client that does not take bodies is sent none"
    );

    configmaps.delete("c0", &DeleteParams::default()).await?;
    let got = next(&mut taking).await?;
    assert!(got.children.is_empty(), "{:?}", got.children);
    let created = configmaps
        .create(&PostParams::default(), &child("c1", "first"))
        .await?;
    let got = next(&mut taking).await?;
    let carried = bodies(&got)?;
    let [Some(body)] = carried.as_slice() else {
        return Err(format!("c1 with its body, got {:?}", got.children).into());
    };
    assert_eq!(as_seen(body), as_seen(&created), "the child as created");
    assert_eq!(
        got.children[0].resource_version,
        created.resource_version().unwrap_or_default()
    );
    let patch = serde_json::json!({"data": {"k": "second"}});
    let changed = configmaps
        .patch("c1", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let got = next(&mut taking).await?;
    let carried = bodies(&got)?;
    let [Some(body)] = carried.as_slice() else {
        return Err(format!("c1 with its body, got {:?}", got.children).into());
    };
    assert_eq!(as_seen(body), as_seen(&changed), "the child as changed");
    d.stop().await;
    Ok(())
}

/// A group that reconciles ConfigMaps naming a Secret at `data.secret` (`referenced_by`): a
/// change, creation or deletion of a Secret reconciles exactly the ConfigMaps that name it at
/// that moment, with reason REFERENCED; a ConfigMap that stops naming it is not told any more;
/// a Secret nobody names reconciles nothing. A `referenced_by` whose naming kind the group does
/// not reconcile, or a second `referenced_by` of one named kind, is refused with the fix.
#[tokio::test]
async fn a_named_objects_change_reconciles_exactly_the_objects_that_name_it() -> TestResult {
    use k8s_openapi::api::core::v1::Secret;
    use kube_dispatch_proto::v1::{References, ResourceRef};
    let ns = TestNamespace::create("edges-references").await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let named_by = |kind: &str| Subscription {
        referenced_by: Some(References {
            resource: Some(ResourceRef {
                version: "v1".into(),
                kind: kind.into(),
                ..ResourceRef::default()
            }),
            field_paths: vec!["data.secret".into()],
        }),
        ..subscription("v1", "Secret", ns.name())
    };
    let refused = TestSession::open(&d, "refs-bad", "r1", vec![named_by("ConfigMap")])
        .await
        .expect_err("no subscription reconciles ConfigMaps");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("no subscription of this session reconciles"),
        "{}",
        refused.message()
    );

    let mut twice = named_by("ConfigMap");
    if let Some(r) = twice.referenced_by.as_mut() {
        r.field_paths = vec!["data.other".into()];
    }
    let refused = TestSession::open(
        &d,
        "refs-bad",
        "r1",
        vec![
            subscription("v1", "ConfigMap", ns.name()),
            named_by("ConfigMap"),
            Subscription {
                namespace: String::new(),
                ..twice
            },
        ],
    )
    .await
    .expect_err("two referenced_by subscriptions name Secrets");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("merge their field paths"),
        "{}",
        refused.message()
    );

    let mut s = TestSession::open(
        &d,
        "refs",
        "r1",
        vec![
            subscription("v1", "ConfigMap", ns.name()),
            named_by("ConfigMap"),
        ],
    )
    .await?;
    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    let naming = |name: &str, secret: Option<&str>| {
        let mut cm = labelled(name, "x");
        cm.data = secret.map(|s| [("secret".to_owned(), s.to_owned())].into());
        cm
    };
    let secret = |name: &str, value: &str| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some([("v".to_owned(), value.to_owned())].into()),
        ..Secret::default()
    };
    // Reads deliveries until `want` (keys) have all arrived, and returns what arrived: each
    // acknowledged.
    let mut until = async |want: &[String]| -> Vec<(Reason, String)> {
        let got = s
            .collect_until(TIMEOUT, |got| {
                want.iter().all(|w| got.iter().any(|r| &r.key == w))
            })
            .await;
        let mut got: Vec<(Reason, String)> =
            got.iter().map(|r| (reason(r), r.key.clone())).collect();
        got.sort();
        got
    };
    secrets
        .create(&PostParams::default(), &secret("s1", "one"))
        .await?;
    for (name, names) in [
        ("a", Some("s1")),
        ("b", Some("s1")),
        ("c", Some("s2")),
        ("d", None),
    ] {
        configmaps
            .create(&PostParams::default(), &naming(name, names))
            .await?;
    }
    let all = ["a", "b", "c", "d"].map(key);
    let added = until(&all).await;
    assert_eq!(
        added,
        all.iter()
            .map(|k| (Reason::Added, k.clone()))
            .collect::<Vec<_>>()
    );

    let patch = |value: &str| Patch::Merge(serde_json::json!({ "stringData": { "v": value } }));
    secrets
        .patch("s1", &PatchParams::default(), &patch("two"))
        .await?;
    assert_eq!(
        until(&[key("a"), key("b")]).await,
        [
            (Reason::Referenced, key("a")),
            (Reason::Referenced, key("b"))
        ],
        "the ConfigMaps naming s1, and no other"
    );
    secrets
        .create(&PostParams::default(), &secret("s2", "x"))
        .await?;
    assert_eq!(
        until(&[key("c")]).await,
        [(Reason::Referenced, key("c"))],
        "a Secret created after the ConfigMap that names it"
    );
    secrets
        .create(&PostParams::default(), &secret("s3", "x"))
        .await?;
    configmaps
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "secret": "s3" } })),
        )
        .await?;
    assert_eq!(until(&[key("a")]).await, [(Reason::Modified, key("a"))]);
    secrets.delete("s1", &DeleteParams::default()).await?;
    assert_eq!(
        until(&[key("b")]).await,
        [(Reason::Referenced, key("b"))],
        "a deletion; a no longer names s1"
    );
    secrets.delete("s2", &DeleteParams::default()).await?;
    assert_eq!(until(&[key("c")]).await, [(Reason::Referenced, key("c"))]);
    secrets
        .create(&PostParams::default(), &secret("s1", "back"))
        .await?;
    assert_eq!(
        until(&[key("b")]).await,
        [(Reason::Referenced, key("b"))],
        "created again: b still names it"
    );
    // A Secret nobody names tells nobody: the next delivery is the ConfigMap made after it,
    // alone.
    secrets
        .create(&PostParams::default(), &secret("s9", "x"))
        .await?;
    configmaps
        .create(&PostParams::default(), &naming("e", None))
        .await?;
    assert_eq!(until(&[key("e")]).await, [(Reason::Added, key("e"))]);
    d.stop().await;
    Ok(())
}

/// A trigger names keys of the kinds its group reconciles, at most 1000: a key of another kind
/// or a malformed one is refused (`INVALID_ARGUMENT`), more keys are refused
/// (`RESOURCE_EXHAUSTED`), and a key whose object the dispatcher has not seen adds nothing.
#[tokio::test]
async fn a_trigger_is_refused_for_other_kinds_and_past_its_bound_and_adds_no_key() -> TestResult {
    use kube_dispatch_proto::v1::TriggerRequest;
    let ns = TestNamespace::create("edges-trigger").await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let mut s = TestSession::open(
        &d,
        "trigger",
        "r1",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    let id = s.id.clone();
    let request = |keys: Vec<String>| TriggerRequest {
        session_id: id.clone(),
        keys,
        all: false,
    };
    let mut client = s.client.clone();
    for (keys, code) in [
        (
            vec![format!("apps/Deployment/{}/x", ns.name())],
            tonic::Code::InvalidArgument,
        ),
        (vec!["not-a-key".to_owned()], tonic::Code::InvalidArgument),
        (
            (0..1001)
                .map(|i| format!("/ConfigMap/{}/c{i}", ns.name()))
                .collect(),
            tonic::Code::ResourceExhausted,
        ),
    ] {
        let refused = client.trigger(request(keys)).await.expect_err("refused");
        assert_eq!(refused.code(), code, "{}", refused.message());
    }
    client
        .trigger(request(vec![format!("/ConfigMap/{}/never", ns.name())]))
        .await?;
    configmaps
        .create(&PostParams::default(), &labelled("made", "x"))
        .await?;
    let got = next(&mut s).await?;
    assert_eq!(
        (reason(&got), got.key.as_str()),
        (
            Reason::Added,
            format!("/ConfigMap/{}/made", ns.name()).as_str()
        ),
        "the trigger of an unseen object added nothing before it"
    );
    client
        .trigger(request(vec![format!("/ConfigMap/{}/made", ns.name())]))
        .await?;
    let got = next(&mut s).await?;
    assert_eq!(reason(&got), Reason::Triggered);
    d.stop().await;
    Ok(())
}

/// A named object's deletion reconciles the object that names it although the dispatcher's
/// watch showed the named object before anything named it (without the fix, the deletion was
/// taken for one already told and nothing was delivered: a Mirror on the real node never heard
/// that its ConfigMap was gone), and a replica that stops as the deletion reaches it hands the
/// key on to the other replica of the group, whether the deletion answered a poll it still had
/// waiting (it acknowledges the delivery as a requeue, as the Go SDK does with what arrives
/// once controller-runtime's workers have stopped, and closes its session) or arrived after its last poll (queued for it, then its
/// session closes).
#[tokio::test]
async fn a_named_objects_deletion_reaches_another_replica_when_its_replica_stops() -> TestResult {
    let ns = TestNamespace::create("edges-handback").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    for (n, polling) in [(0, true), (1, false)] {
        hand_over_on_stop(&ns, &d, n, polling).await?;
    }
    d.stop().await;
    Ok(())
}

/// One case of the test above, with objects and replicas numbered `n`: the stopping replica's
/// poll waits at the dispatcher when the Secret goes (`polling`), or it polls no more.
async fn hand_over_on_stop(
    ns: &TestNamespace,
    d: &TestDispatcher,
    n: u32,
    polling: bool,
) -> TestResult {
    use k8s_openapi::api::core::v1::Secret;
    use kube_dispatch_proto::v1::{
        AckItem, AckRequest, CloseSessionRequest, References, Requeue, ResourceRef, ack_item,
    };
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(ns.client(), ns.name());
    let group = format!("handback-{n}");
    let subscriptions = vec![
        subscription("v1", "ConfigMap", ns.name()),
        Subscription {
            referenced_by: Some(References {
                resource: Some(ResourceRef {
                    version: "v1".into(),
                    kind: "ConfigMap".into(),
                    ..ResourceRef::default()
                }),
                field_paths: vec!["data.secret".into()],
            }),
            ..subscription("v1", "Secret", ns.name())
        },
    ];
    let (secret_name, name) = (format!("s{n}"), format!("a{n}"));
    let mut secret = Secret::default();
    secret.metadata.name = Some(secret_name.clone());
    secrets.create(&PostParams::default(), &secret).await?;
    let key = format!("/ConfigMap/{}/{name}", ns.name());

    // Two replicas; the one handed the key is the one that will stop. The ConfigMap names the
    // Secret only once the dispatcher's watch has shown the Secret (as when it lists the named
    // kind first), so that the Secret's deletion is the next thing the watch shows of it.
    let first = TestSession::open(d, &group, "replica-a", subscriptions.clone()).await?;
    let first_id = first.id.clone();
    let second = TestSession::open(d, &group, "replica-b", subscriptions).await?;
    secrets_shown(d).await?;
    let mut naming = labelled(&name, "x");
    naming.data = Some([("secret".to_owned(), secret_name.clone())].into());
    configmaps.create(&PostParams::default(), &naming).await?;
    let (mut owner, mut other) = handed(&key, first, second).await?;
    let poll = polling.then(|| {
        let mut owner = owner.clone();
        tokio::spawn(async move { owner.poll_acking(&[], Duration::from_secs(5)).await })
    });
    // The poll may reach the dispatcher before the deletion (answered by it) or after (taking
    // it queued): either way the owner has it, and hands it back.
    secrets
        .delete(&secret_name, &DeleteParams::default())
        .await?;
    if let Some(poll) = poll {
        let delivered = poll.await??;
        let handed = delivered
            .iter()
            .find(|r| r.key == key)
            .ok_or_else(|| format!("the owner's poll brought {delivered:?}, not {key}"))?;
        assert_eq!(reason(handed), Reason::Referenced);
        // Stopping: handed straight back.
        let back = AckItem {
            delivery_id: handed.delivery_id,
            outcome: Some(ack_item::Outcome::Requeue(Requeue {
                after: prost_types::Duration::try_from(Duration::from_millis(1)).ok(),
            })),
            memo: handed.memo.clone(),
        };
        let acks = AckRequest {
            session_id: owner.id.clone(),
            acks: vec![back],
            ended_sessions: Vec::new(),
            stopping: false,
        };
        owner.client.ack(acks).await?;
    } else {
        // The deletion is queued for the owner, which polls no more.
        let owner_replica = if owner.id == first_id {
            "replica-a"
        } else {
            "replica-b"
        };
        queued_for(d, &group, &key, owner_replica).await?;
    }
    let close = CloseSessionRequest {
        session_id: owner.id.clone(),
        ..Default::default()
    };
    owner.client.close_session(close).await?;
    let got = other
        .collect_until(Duration::from_secs(10), |got| {
            got.iter().any(|r| r.key == key)
        })
        .await;
    assert!(
        got.iter().any(|r| r.key == key),
        "polling {polling}: the other replica was never handed {key} after the owner stopped: {got:?}"
    );
    Ok(())
}

/// The two sessions, the one `key` is handed to first: each polls, acknowledging what it gets,
/// until one of them gets `key`.
async fn handed(
    key: &str,
    mut first: TestSession,
    mut second: TestSession,
) -> TestResult<(TestSession, TestSession)> {
    loop {
        let (a, b) = tokio::join!(
            first.poll_acking(&[], Duration::from_millis(300)),
            second.poll_acking(&[], Duration::from_millis(300))
        );
        let (a, b) = (a?, b?);
        first
            .ack(&a.iter().map(|r| r.delivery_id).collect::<Vec<_>>())
            .await?;
        second
            .ack(&b.iter().map(|r| r.delivery_id).collect::<Vec<_>>())
            .await?;
        if a.iter().any(|r| r.key == key) {
            return Ok((first, second));
        }
        if b.iter().any(|r| r.key == key) {
            return Ok((second, first));
        }
    }
}

/// Waits until the dispatcher's watch of Secrets has shown a Secret.
async fn secrets_shown(d: &TestDispatcher) -> TestResult {
    let shown = || {
        d.handles
            .groups
            .watch_figures()
            .iter()
            .filter(|w| w.resource.ends_with("/secrets"))
            .map(|w| w.counts.applied.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
    };
    kube_dispatch_tests::eventually(TIMEOUT, "the watch of Secrets shows the Secret", || async {
        (shown() > 0).then_some(())
    })
    .await?;
    Ok(())
}

/// Waits until `key` of `group` is queued for `replica`'s session.
async fn queued_for(d: &TestDispatcher, group: &str, key: &str, replica: &str) -> TestResult {
    kube_dispatch_tests::eventually(TIMEOUT, format!("{key} queued for {replica}"), || async {
        let group = d
            .handles
            .groups
            .all()
            .into_iter()
            .find(|g| g.id.name == group)?;
        let status = group.key_status(key)?;
        (status.state == kube_dispatch_core::queue::KeyState::Queued
            && status.replica.as_deref() == Some(replica))
        .then_some(())
    })
    .await?;
    Ok(())
}
