//! The dispatcher's API surface: what an opened session says, precise statuses for bad
//! requests, session limits, idle groups released, health and reflection, and memos.

use super::support::*;

/// A session's answer names the dispatcher's version and the features it serves
/// (`proto/kubedispatch/v1/versions.md`), which the SDKs check against what their
/// subscriptions need.
#[tokio::test]
async fn an_opened_session_says_the_version_and_the_capabilities() -> TestResult {
    let ns = TestNamespace::create("dispatch-versions").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let opened = d
        .client()
        .await
        .open_session(OpenSessionRequest {
            group: "g".into(),
            replica_id: "r".into(),
            subscriptions: vec![subscription("v1", "ConfigMap", ns.name())],
            client: "kube-dispatch-tests/0".into(),
            capabilities: vec!["children".into(), "from-the-future".into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(opened.dispatcher_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        opened.capabilities,
        kube_dispatch_proto::capabilities::ALL
            .iter()
            .map(|c| (*c).to_owned())
            .collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_precise_statuses_and_the_server_keeps_serving() -> TestResult {
    let ns = TestNamespace::create("dispatch-bad-input").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let mut client = d.client().await;
    let open = |subs: Vec<Subscription>| OpenSessionRequest {
        group: "g".into(),
        replica_id: "r".into(),
        subscriptions: subs,
        ttl: None,
        ..Default::default()
    };
    fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
        r.err().map_or(Code::Ok, |s| s.code())
    }

    let mut cases: BTreeMap<&str, (Code, Code)> = BTreeMap::new();
    let unknown = subscription("v1", "NoSuchKind", ns.name());
    cases.insert(
        "unknown resource",
        (
            code(client.open_session(open(vec![unknown])).await),
            Code::NotFound,
        ),
    );
    let bad_selector = Subscription {
        label_selector: "a in (".into(),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    cases.insert(
        "malformed selector",
        (
            code(client.open_session(open(vec![bad_selector])).await),
            Code::InvalidArgument,
        ),
    );
    cases.insert(
        "no subscription",
        (
            code(client.open_session(open(vec![])).await),
            Code::InvalidArgument,
        ),
    );
    let zero_ttl = OpenSessionRequest {
        ttl: Some(prost_types::Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..open(vec![subscription("v1", "ConfigMap", ns.name())])
    };
    cases.insert(
        "zero ttl",
        (
            code(client.open_session(zero_ttl).await),
            Code::InvalidArgument,
        ),
    );
    let unknown_session = PollRequest {
        session_id: "no-such-session".into(),
        ..PollRequest::default()
    };
    cases.insert(
        "unknown session",
        (code(client.poll(unknown_session).await), Code::NotFound),
    );

    let mut s = TestSession::open(
        &d,
        "g",
        "r",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    let negative_wait = PollRequest {
        session_id: s.id.clone(),
        wait: Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        }),
        ..PollRequest::default()
    };
    cases.insert(
        "negative wait",
        (
            code(client.poll(negative_wait).await),
            Code::InvalidArgument,
        ),
    );
    let different =
        TestSession::open(&d, "g", "r2", vec![subscription("v1", "Secret", ns.name())]).await;
    cases.insert(
        "other subscriptions in a group",
        (
            different.map(|_| ()).err().map_or(Code::Ok, |s| s.code()),
            Code::FailedPrecondition,
        ),
    );
    let long_client = OpenSessionRequest {
        client: "x".repeat(2048),
        ..open(vec![subscription("v1", "ConfigMap", ns.name())])
    };
    cases.insert(
        "client name too long",
        (
            code(client.open_session(long_client).await),
            Code::InvalidArgument,
        ),
    );
    let huge = OpenSessionRequest {
        group: "x".repeat(5 * 1024 * 1024),
        ..open(vec![subscription("v1", "ConfigMap", ns.name())])
    };
    cases.insert(
        "too large message",
        (
            code(client.open_session(huge).await),
            Code::ResourceExhausted,
        ),
    );

    let mismatched: Vec<_> = cases
        .iter()
        .filter(|(_, (got, want))| got != want)
        .collect();
    assert!(
        mismatched.is_empty(),
        "wrong statuses (got, want): {mismatched:?}"
    );

    // An ack of a delivery that is not in flight is ignored and counted; the session lives on.
    let stray = vec![AckItem {
        delivery_id: 987_654,
        outcome: Some(ack_item::Outcome::Success(Default::default())),
        memo: Vec::new(),
    }];
    assert!(
        s.poll_with(stray, Duration::from_millis(100))
            .await?
            .is_empty()
    );
    assert_eq!(
        d.handles
            .groups
            .counters
            .unknown_acks
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    api.create(&PostParams::default(), &configmap("still-served", "0"))
        .await?;
    let got = s.collect_until(TIMEOUT, |g| !g.is_empty()).await;
    assert_eq!(got[0].key, cm_key(ns.name(), "still-served"));
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn session_limits_answer_resource_exhausted() -> TestResult {
    let ns = TestNamespace::create("dispatch-session-limits").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.limits.max_sessions = 3;
    config.settings.limits.max_sessions_per_group = 2;
    let d = TestDispatcher::start(config).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    TestSession::open(&d, "a", "r1", subs()).await?;
    TestSession::open(&d, "a", "r2", subs()).await?;
    let per_group = TestSession::open(&d, "a", "r3", subs()).await.unwrap_err();
    assert_eq!(per_group.code(), Code::ResourceExhausted, "{per_group}");
    TestSession::open(&d, "b", "r1", subs()).await?;
    let total = TestSession::open(&d, "c", "r1", subs()).await.unwrap_err();
    assert_eq!(total.code(), Code::ResourceExhausted, "{total}");
    // At both limits, a replica reopening still gets in: it replaces its old session.
    TestSession::open(&d, "a", "r1", subs()).await?;
    assert_eq!(d.handles.groups.session_count(), 3);
    // Groups count too, idle ones included: groups b and c, their sessions closed, linger in
    // their grace; with sessions to spare, a new group name is still refused.
    for group in ["b", "c"] {
        let s = TestSession::open(&d, group, "r1", subs()).await?;
        let mut client = s.client.clone();
        client
            .close_session(kube_dispatch_proto::v1::CloseSessionRequest {
                session_id: s.id.clone(),
                ..Default::default()
            })
            .await?;
    }
    assert_eq!(
        (
            d.handles.groups.session_count(),
            d.handles.groups.group_count()
        ),
        (2, 3)
    );
    let groups = TestSession::open(&d, "d", "r1", subs()).await.unwrap_err();
    assert_eq!(groups.code(), Code::ResourceExhausted, "{groups}");
    assert!(groups.message().contains("controller groups"), "{groups}");
    d.stop().await;
    Ok(())
}

/// Past `--max-opening-sessions` OpenSessions served at once, one more is refused at once with
/// RESOURCE_EXHAUSTED and gRPC's pushback (the SDKs wait it out with jitter) rather than queue;
/// asked again, it opens.
#[tokio::test]
async fn an_open_past_the_opens_in_progress_is_refused_at_once_with_a_pushback() -> TestResult {
    let ns = TestNamespace::create("dispatch-opening").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.limits.max_opening_sessions = 1;
    let d = TestDispatcher::start(config).await?;
    // Each group watches an object of its own: its open waits for that watch's first list, so
    // twenty opened at once overlap.
    let subs = |i: usize| {
        vec![Subscription {
            field_selector: format!("metadata.name=cm-{i}"),
            ..subscription("v1", "ConfigMap", ns.name())
        }]
    };
    // Over one connection: twenty handshakes at once from one address pass its bound.
    let client = d.client().await;
    let opens = (0..20).map(|i| {
        let client = client.clone();
        async move { TestSession::open_with(client, &format!("g{i}"), "r1", subs(i)).await }
    });
    let answered = futures::future::join_all(opens).await;
    let refused: Vec<(usize, &tonic::Status)> = answered
        .iter()
        .enumerate()
        .filter_map(|(i, a)| a.as_ref().err().map(|e| (i, e)))
        .collect();
    assert!(
        !refused.is_empty() && refused.len() < 20,
        "twenty opens at once for one place: {} refused",
        refused.len()
    );
    for (_, status) in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
        assert!(
            status.message().contains("--max-opening-sessions"),
            "{status}"
        );
        assert_eq!(
            status
                .metadata()
                .get(kube_dispatch_proto::RETRY_PUSHBACK)
                .and_then(|v| v.to_str().ok()),
            Some("500"),
            "{status:?}"
        );
    }
    for (i, _) in &refused {
        TestSession::open_with(client.clone(), &format!("g{i}"), "r1", subs(*i)).await?;
    }
    assert_eq!(d.handles.groups.session_count(), 20);
    d.stop().await;
    Ok(())
}

/// A replica that says it is stopping (`AckRequest.stopping`) has the poll the dispatcher holds
/// answered at once, and its later polls are not held: its stop need not wait out a wait (20 s
/// here). The keys stay its own to finish: what is ready is still handed to it.
#[tokio::test]
async fn a_stopping_replicas_polls_are_answered_at_once() -> TestResult {
    let ns = TestNamespace::create("dispatch-stopping").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s = TestSession::open_for(&d, "g", "r", subs, Duration::from_secs(120)).await?;
    let wait = Duration::from_secs(20);
    let mut held = s.clone();
    let poll = tokio::spawn(async move { held.poll_acking(&[], wait).await });
    s.stopping().await?;
    let answered = tokio::time::timeout(wait / 2, poll)
        .await
        .expect("the held poll is answered once the replica says it stops")??;
    assert!(answered.is_empty(), "{answered:?}");
    let later = tokio::time::timeout(wait / 2, s.poll_acking(&[], wait))
        .await
        .expect("a later poll is not held")?;
    assert!(later.is_empty(), "{later:?}");
    // What becomes ready is still handed to it.
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    api.create(&PostParams::default(), &configmap("cm-1", "1"))
        .await?;
    let got = s.collect_until(TIMEOUT, |got| !got.is_empty()).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].key, cm_key(ns.name(), "cm-1"));
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn idle_groups_and_their_watches_are_released_after_their_grace() -> TestResult {
    let ns = TestNamespace::create("dispatch-idle").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.idle_group_grace = Duration::from_millis(500);
    config.watch_grace = Duration::from_millis(500);
    let d = TestDispatcher::start(config).await?;
    let core = d.handles.groups.clone();
    let mut s = TestSession::open(
        &d,
        "g",
        "r",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    assert_eq!((core.group_count(), core.watch_count()), (1, 1));
    s.client
        .close_session(kube_dispatch_proto::v1::CloseSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await?;
    // Nothing to await but the release itself: check until it happened, within a bound.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while (core.group_count(), core.watch_count()) != (0, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "group or watch never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new session starts them again.
    TestSession::open(
        &d,
        "g",
        "r",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    assert_eq!((core.group_count(), core.watch_count()), (1, 1));
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn health_and_reflection_are_served_on_the_same_port() -> TestResult {
    use kube_dispatch_telemetry::admin::Status;
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let config = test_config("dispatcher-0", &["dispatcher-0"]);
    let mut readiness = config.readiness.subscribe();
    let d = TestDispatcher::start(config).await?;
    // The admin endpoint's /readyz follows the handover (a fixed ring of one settles at once).
    tokio::time::timeout(
        Duration::from_secs(10),
        readiness.wait_for(|s| *s == Status::Ready),
    )
    .await??;
    let credentials = kube_dispatch_tests::credentials();
    let channel = credentials.endpoint(&d.addr.to_string())?.connect().await?;
    // Health needs no credential: the kubelet's probes have none.
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "kubedispatch.v1.Dispatcher"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await?
            .into_inner()
            .status;
        assert_eq!(
            status,
            ServingStatus::Serving as i32,
            "health of {service:?}"
        );
    }
    let mut reflection = ServerReflectionClient::with_interceptor(channel, credentials.bearer());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(futures::stream::iter([request]))
        .await?
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        responses.message().await?.and_then(|r| r.message_response)
    else {
        panic!("no service list")
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains("kubedispatch.v1.Dispatcher"), "{names:?}");
    assert!(names.contains("grpc.health.v1.Health"), "{names:?}");
    d.stop().await;
    assert_eq!(
        *readiness.borrow(),
        Status::NotReady("draining".into()),
        "not ready from the drain on"
    );
    Ok(())
}

/// A memo an acknowledgement leaves comes back with the next delivery of the same object, and
/// only of that object: replaced by each ack, absent for an object made anew under the name,
/// and a memo past the bound refuses the acknowledgement with the bound.
#[tokio::test]
async fn a_memo_comes_back_with_the_next_delivery_of_the_same_object() -> TestResult {
    let (_ns, api, d, mut s) = configmap_setup("dispatch-memo").await?;
    let ack = |delivery_id, memo: &[u8]| AckItem {
        delivery_id,
        outcome: Some(ack_item::Outcome::Success(Default::default())),
        memo: memo.to_vec(),
    };
    api.create(&PostParams::default(), &configmap("noted", "0"))
        .await?;
    let first = s.hold(TIMEOUT).await?;
    assert_eq!(first[0].memo, b"");
    let too_long = s
        .poll_with(
            vec![ack(first[0].delivery_id, &[b'x'; 513])],
            Duration::from_millis(1),
        )
        .await
        .expect_err("a memo past 512 bytes");
    assert_eq!(too_long.code(), Code::InvalidArgument);
    assert!(too_long.message().contains("at most 512"), "{too_long:?}");
    let none = s
        .poll_with(
            vec![ack(first[0].delivery_id, b"child-0@41")],
            Duration::from_millis(1),
        )
        .await?;
    assert!(none.is_empty());

    let change = serde_json::json!({ "data": { "v": "1" } });
    api.patch("noted", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    let second = s.hold(TIMEOUT).await?;
    assert_eq!(second[0].memo, b"child-0@41");
    s.poll_with(
        vec![ack(second[0].delivery_id, b"child-0@42")],
        Duration::from_millis(1),
    )
    .await?;

    // Made anew under the same name: the memo was left for the object that is gone.
    api.delete("noted", &DeleteParams::default()).await?;
    let deleted = s.hold(TIMEOUT).await?;
    assert!(deleted[0].deleted);
    assert_eq!(deleted[0].memo, b"", "a deletion carries none");
    s.poll_with(
        vec![ack(deleted[0].delivery_id, b"")],
        Duration::from_millis(1),
    )
    .await?;
    api.create(&PostParams::default(), &configmap("noted", "2"))
        .await?;
    let again = s.hold(TIMEOUT).await?;
    assert_eq!(
        (again[0].deleted, again[0].memo.as_slice()),
        (false, &b""[..])
    );
    d.stop().await;
    Ok(())
}
