//! The dispatcher against the real API server: what arrives, with which reason and key, how
//! changes coalesce, retries back off, silent sessions lose their keys, and dispatchers split
//! the objects.

use super::support::*;

#[tokio::test]
async fn configmap_changes_arrive_with_reason_key_and_object() -> TestResult {
    let (ns, api, d, mut s) = configmap_setup("dispatch-configmaps").await?;
    let key = cm_key(ns.name(), "a");
    let has = |reason_wanted: Reason, rv: String| {
        let key = key.clone();
        move |got: &[ReconcileRequest]| {
            got.iter()
                .any(|r| r.key == key && reason(r) == reason_wanted && r.resource_version == rv)
        }
    };

    let created = api
        .create(&PostParams::default(), &configmap("a", "1"))
        .await?;
    let got = s
        .collect_until(
            TIMEOUT,
            has(Reason::Added, created.resource_version().unwrap()),
        )
        .await;
    let added = got
        .iter()
        .find(|r| r.key == key)
        .expect("the creation is delivered");
    assert_eq!(reason(added), Reason::Added);
    assert_eq!(added.uid, created.uid().unwrap());
    let object = added.object.as_ref().expect("object key");
    assert_eq!(
        (
            object.group.as_str(),
            object.version.as_str(),
            object.kind.as_str(),
            object.namespace.as_str(),
            object.name.as_str()
        ),
        ("", "v1", "ConfigMap", ns.name(), "a")
    );
    let body: ConfigMap = serde_json::from_slice(&added.object_json)?;
    assert_eq!(body.data.unwrap()["value"], "1");

    let patch = serde_json::json!({ "data": { "value": "2" } });
    let updated = api
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let got = s
        .collect_until(
            TIMEOUT,
            has(Reason::Modified, updated.resource_version().unwrap()),
        )
        .await;
    let modified = got
        .iter()
        .find(|r| r.key == key)
        .expect("the update is delivered");
    let body: ConfigMap = serde_json::from_slice(&modified.object_json)?;
    assert_eq!(body.data.unwrap()["value"], "2");

    api.delete("a", &DeleteParams::default()).await?;
    let got = s
        .collect_until(TIMEOUT, |got| {
            got.iter()
                .any(|r| r.key == key && reason(r) == Reason::Deleted)
        })
        .await;
    let deleted = got
        .iter()
        .find(|r| reason(r) == Reason::Deleted)
        .expect("the deletion is delivered");
    assert!(deleted.deleted);
    assert_eq!(deleted.uid, created.uid().unwrap());
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn custom_resources_and_their_owned_objects_arrive_as_the_owner_key() -> TestResult {
    let ns = TestNamespace::create("dispatch-owned").await?;
    ensure_widget_crd(&ns.client()).await?;
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let widget_ref = kube_dispatch_tests::widget_ref();
    let owned = Subscription {
        owner: Some(widget_ref.clone()),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let primary = Subscription {
        resource: Some(widget_ref),
        namespace: ns.name().into(),
        ..Subscription::default()
    };
    let mut s = TestSession::open(&d, "widgets", "r1", vec![primary, owned]).await?;

    let widget = widgets
        .create(
            &PostParams::default(),
            &Widget::new("gear", WidgetSpec { size: 1 }),
        )
        .await?;
    let key = format!("test.kube-dispatch.dev/Widget/{}/gear", ns.name());
    let got = s
        .collect_until(TIMEOUT, |g| g.iter().any(|r| r.key == key))
        .await;
    assert_eq!(reason(&got[0]), Reason::Added);
    assert_eq!(got[0].object.as_ref().unwrap().version, "v1");

    // A child with a controlling ownerReference triggers its owner, never itself.
    let mut child = configmap("gear-child", "x");
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "test.kube-dispatch.dev/v1".into(),
        kind: "Widget".into(),
        name: "gear".into(),
        uid: widget.uid().unwrap(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    configmaps.create(&PostParams::default(), &child).await?;
    // An unowned ConfigMap triggers nothing.
    configmaps
        .create(&PostParams::default(), &configmap("loner", "x"))
        .await?;
    let got = s
        .collect_until(TIMEOUT, |g| g.iter().any(|r| reason(r) == Reason::Owned))
        .await;
    let owned: Vec<(&str, Reason)> = got.iter().map(|r| (r.key.as_str(), reason(r))).collect();
    assert_eq!(owned, [(key.as_str(), Reason::Owned)]);
    // It carries the owner as the watch last showed it (the group keeps delivered bodies,
    // since its keys are queued by changes to other objects): its controller reads nothing.
    let body: serde_json::Value = serde_json::from_slice(&got[0].object_json)
        .map_err(|e| format!("an owned trigger's body is not the owner's JSON: {e}"))?;
    assert_eq!(
        (
            &body["metadata"]["name"],
            &body["metadata"]["resourceVersion"]
        ),
        (
            &serde_json::json!("gear"),
            &serde_json::json!(widget.resource_version().unwrap_or_default())
        ),
        "an owned trigger carries the owner at the version delivered before"
    );
    assert_eq!(
        got[0].resource_version,
        widget.resource_version().unwrap_or_default()
    );
    // Nothing for the unowned one, nor for the child as a key of its own.
    let quiet = s
        .collect_until(Duration::from_secs(2), |g| !g.is_empty())
        .await;
    assert!(quiet.is_empty(), "unexpected deliveries: {quiet:?}");
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn updates_while_in_flight_coalesce_into_one_more_delivery() -> TestResult {
    let ns = TestNamespace::create("dispatch-coalesce").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    // Neither session is renewed while the hundred updates are written, which on a loaded
    // machine takes longer than the test dispatcher's default ttl of 3 s: both outlive it.
    let ttl = Duration::from_secs(60);
    let mut s = TestSession::open_for(&d, "g", "r1", subs.clone(), ttl).await?;
    // A second group on the same watch tells us when the dispatcher has seen the last update.
    let mut observer = TestSession::open_for(&d, "observer", "o1", subs, ttl).await?;

    api.create(&PostParams::default(), &configmap("hot", "0"))
        .await?;
    // Take the key and hold it in flight (no ack).
    let held = s.hold(TIMEOUT).await?;
    let mut last_rv = String::new();
    for i in 0..100 {
        let patch = serde_json::json!({ "data": { "value": i.to_string() } });
        last_rv = api
            .patch("hot", &PatchParams::default(), &Patch::Merge(&patch))
            .await?
            .resource_version()
            .unwrap();
    }
    let rv = last_rv.clone();
    observer
        .collect_until(TIMEOUT, move |g| g.iter().any(|r| r.resource_version == rv))
        .await;
    // In flight: the key is not delivered again, however many changes arrived.
    assert!(
        s.poll_acking(&[], Duration::from_millis(300))
            .await?
            .is_empty()
    );
    s.ack(&[held[0].delivery_id]).await?;
    let again = s.collect_until(Duration::from_secs(3), |_| false).await;
    assert_eq!(again.len(), 1, "exactly one more delivery: {again:?}");
    assert_eq!(
        (reason(&again[0]), again[0].resource_version.as_str()),
        (Reason::Modified, last_rv.as_str())
    );
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn failed_reconciles_are_retried_with_growing_delays() -> TestResult {
    let (_ns, api, d, mut s) = configmap_setup("dispatch-retry").await?;
    api.create(&PostParams::default(), &configmap("flaky", "0"))
        .await?;
    let mut pending = s.hold(TIMEOUT).await?;
    // Fail it four times; the test config's backoff is 100 ms doubling.
    let mut gaps = Vec::new();
    let mut attempts = Vec::new();
    for _ in 0..4 {
        let fail = vec![AckItem {
            delivery_id: pending[0].delivery_id,
            outcome: Some(ack_item::Outcome::Failure(Failure {
                message: "boom".into(),
            })),
            memo: Vec::new(),
        }];
        let failed_at = tokio::time::Instant::now();
        pending = s.poll_with(fail, Duration::from_secs(2)).await?;
        if pending.is_empty() {
            pending = s.hold(TIMEOUT).await?;
        }
        gaps.push(failed_at.elapsed());
        attempts.push((reason(&pending[0]), pending[0].attempt));
    }
    assert_eq!(
        attempts,
        [
            (Reason::Retry, 1),
            (Reason::Retry, 2),
            (Reason::Retry, 3),
            (Reason::Retry, 4)
        ]
    );
    for (gap, expected_ms) in gaps.iter().zip([100u64, 200, 400, 800]) {
        assert!(
            *gap >= Duration::from_millis(expected_ms),
            "retry came after {gap:?}, before its {expected_ms} ms backoff; all gaps: {gaps:?}"
        );
    }
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn requeue_after_is_honoured() -> TestResult {
    let (_ns, api, d, mut s) = configmap_setup("dispatch-requeue").await?;
    api.create(&PostParams::default(), &configmap("periodic", "0"))
        .await?;
    let got = s.hold(TIMEOUT).await?;
    let requeue = vec![AckItem {
        delivery_id: got[0].delivery_id,
        outcome: Some(ack_item::Outcome::Requeue(
            kube_dispatch_proto::v1::Requeue {
                after: prost_types::Duration::try_from(Duration::from_millis(1500)).ok(),
            },
        )),
        memo: Vec::new(),
    }];
    let acked_at = tokio::time::Instant::now();
    let mut again = s.poll_with(requeue, Duration::from_secs(2)).await?;
    if again.is_empty() {
        again = s.hold(TIMEOUT).await?;
    }
    let waited = acked_at.elapsed();
    assert_eq!(reason(&again[0]), Reason::Requeue);
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(1500 + 2000),
        "requeued after {waited:?}, asked for 1.5 s"
    );
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_silent_session_keeps_its_keys_until_its_ttl_then_another_gets_them() -> TestResult {
    let ns = TestNamespace::create("dispatch-ttl").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut a = TestSession::open(&d, "g", "replica-a", subs.clone()).await?;
    for i in 0..20 {
        api.create(&PostParams::default(), &configmap(&format!("cm-{i}"), "0"))
            .await?;
    }
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while held.len() < 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica-a holds {} keys of 20 after 30 s",
            held.len()
        );
        held.extend(a.poll_acking(&[], Duration::from_secs(2)).await?);
    }
    let mut b = TestSession::open(&d, "g", "replica-b", subs).await?;
    // While a is alive (it keeps polling, never acking), b gets none of a's keys.
    for _ in 0..3 {
        assert!(
            a.poll_acking(&[], Duration::from_millis(500))
                .await?
                .is_empty()
        );
        let stolen = b.poll_acking(&[], Duration::from_millis(500)).await?;
        assert!(stolen.is_empty(), "b got keys in flight on a: {stolen:?}");
    }
    // a falls silent: after its ttl (3 s), b gets every key, each once.
    let silent_at = tokio::time::Instant::now();
    let got = b.collect_until(TIMEOUT, |g| g.len() >= 20).await;
    assert!(
        silent_at.elapsed() >= Duration::from_secs(2),
        "re-delivered before a's ttl ran out"
    );
    let keys: BTreeSet<&str> = got.iter().map(|r| r.key.as_str()).collect();
    let held_keys: BTreeSet<&str> = held.iter().map(|r| r.key.as_str()).collect();
    assert_eq!((got.len(), &keys), (20, &held_keys));
    // a's session is gone.
    let err = a
        .poll_acking(&[], Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn two_dispatchers_split_objects_with_no_overlap_and_no_gap() -> TestResult {
    let ns = TestNamespace::create("dispatch-split").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let members = ["dispatcher-0", "dispatcher-1"];
    let d0 = TestDispatcher::start(test_config("dispatcher-0", &members)).await?;
    let d1 = TestDispatcher::start(test_config("dispatcher-1", &members)).await?;
    const N: usize = 1000;
    // Created before the sessions open: a session idle for its 3 s ttl while a loaded machine
    // creates a thousand objects would expire. The dispatchers' first list carries them.
    create_configmaps(&api, N).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open(&d0, "g", "r", subs.clone()).await?;
    let mut s1 = TestSession::open(&d1, "g", "r", subs).await?;

    let mut by: HashMap<String, Vec<&str>> = HashMap::new();
    let (mut got0, mut got1) = (Vec::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got0.len() + got1.len() < N && tokio::time::Instant::now() < deadline {
        let (a, b) = tokio::join!(
            s0.collect_until(Duration::from_secs(1), |g| g.len() >= N),
            s1.collect_until(Duration::from_secs(1), |g| g.len() >= N)
        );
        got0.extend(a);
        got1.extend(b);
    }
    for (who, got) in [("dispatcher-0", &got0), ("dispatcher-1", &got1)] {
        for r in got.iter() {
            by.entry(r.key.clone()).or_default().push(who);
        }
    }
    let ring = Ring::new(members);
    let twice: Vec<_> = by.iter().filter(|(_, w)| w.len() > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let expected: BTreeSet<String> = (0..N)
        .map(|i| cm_key(ns.name(), &format!("cm-{i}")))
        .collect();
    let delivered: BTreeSet<String> = by.keys().cloned().collect();
    assert_eq!(expected.difference(&delivered).count(), 0, "missing keys");
    for (key, who) in &by {
        let owner = ring.owner(&RequestKey::parse(key)?);
        assert_eq!(
            owner,
            Some(who[0]),
            "{key} delivered by the wrong dispatcher"
        );
    }
    let split = (got0.len(), got1.len());
    assert!(split.0 > N / 4 && split.1 > N / 4, "uneven split {split:?}");
    // On a ring keyed by name, each dispatcher receives the other's objects too, and drops them.
    for (d, got) in [(&d0, &got0), (&d1, &got1)] {
        let elsewhere = d.watch_total(|c| &c.elsewhere);
        assert!(
            elsewhere as usize >= N - got.len(),
            "{elsewhere} objects dropped as owned elsewhere; the other dispatcher delivered {}",
            N - got.len()
        );
    }
    d0.stop().await;
    d1.stop().await;
    Ok(())
}

/// Groups that join a running watch get every object: those that join while the watch still
/// lists get the rest of its list from the watch and list beside it only as far as it had got;
/// one that joins once the list is done lists everything beside the watch.
#[tokio::test]
async fn groups_joining_a_running_watch_get_every_object() -> TestResult {
    let ns = TestNamespace::create("dispatch-join").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    // Four pages of the watch's list.
    const N: usize = 2000;
    create_configmaps(&api, N).await?;
    let expected: BTreeSet<String> = (0..N)
        .map(|i| cm_key(ns.name(), &format!("cm-{i}")))
        .collect();
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];

    /// Collects on every session until each has received every key (or a minute passed).
    async fn every_key(
        sessions: &mut [TestSession],
        expected: &BTreeSet<String>,
    ) -> Vec<BTreeSet<String>> {
        let mut got = vec![BTreeSet::new(); sessions.len()];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while got.iter().any(|g| g.len() < expected.len()) && tokio::time::Instant::now() < deadline
        {
            let batches = futures::future::join_all(
                sessions
                    .iter_mut()
                    .map(|s| s.collect_until(Duration::from_millis(500), |_| false)),
            )
            .await;
            for (keys, batch) in got.iter_mut().zip(batches) {
                keys.extend(batch.into_iter().map(|r| r.key));
            }
        }
        got
    }

    // The first group starts the watch (its session opens once the list has begun to
    // arrive); two more join at once, while the watch is listing.
    let first = TestSession::open(&d, "g0", "r", subs.clone()).await?;
    let (g1, g2) = tokio::join!(
        TestSession::open(&d, "g1", "r", subs.clone()),
        TestSession::open(&d, "g2", "r", subs.clone())
    );
    let mut sessions = vec![first, g1?, g2?];
    for (i, got) in every_key(&mut sessions, &expected).await.iter().enumerate() {
        let missing: Vec<_> = expected.difference(got).take(5).collect();
        assert!(missing.is_empty(), "group g{i} missed {missing:?}");
        assert!(got.is_subset(&expected), "group g{i} got foreign keys");
    }
    // A group that joins after the list: it lists beside the watch, everything.
    let mut late = vec![TestSession::open(&d, "g3", "r", subs).await?];
    let got = every_key(&mut late, &expected).await;
    assert_eq!(got[0], expected, "the late group's keys");
    let side_lists = d.watch_total(|c| &c.side_lists);
    assert!(side_lists >= 1, "the late group listed beside the watch");
    d.stop().await;
    Ok(())
}
