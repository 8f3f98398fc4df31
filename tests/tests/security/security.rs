//! The tier gives a caller exactly what its own identity may read (`proto/kubedispatch/v1/security.md`):
//! against the real API server, with ServiceAccounts of a test namespace, tokens from
//! TokenRequest and the static test users.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, PostParams};
use kube_dispatch_proto::{
    credentials::Credentials,
    v1::{
        AckItem, AckRequest, OpenSessionRequest, PollRequest, RecentDeletionsRequest, ResourceRef,
        Subscription, ack_item, peer_client::PeerClient,
    },
};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, subscription, test_config},
    eventually,
    identity::{account, token},
};
use tonic::Code;

use crate::ca;

fn as_token(token: &str) -> Credentials {
    Credentials::tls(ca()).with_token(token)
}

fn open(group: &str, subscriptions: Vec<Subscription>) -> OpenSessionRequest {
    OpenSessionRequest {
        group: group.into(),
        replica_id: "replica-0".into(),
        subscriptions,
        ttl: None,
        ..Default::default()
    }
}

/// The code and message an OpenSession with `credentials` gets (`Ok` as code OK).
async fn open_as(
    d: &TestDispatcher,
    credentials: &Credentials,
    request: OpenSessionRequest,
) -> (Code, String) {
    match d.client_as(credentials).await.open_session(request).await {
        Ok(opened) => (Code::Ok, opened.into_inner().session_id),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

/// Identity x subscription x expected status: exactly what the caller could list and watch
/// itself is allowed.
#[tokio::test]
async fn each_identity_gets_what_it_may_list_and_watch_and_nothing_more() -> TestResult {
    let ns = TestNamespace::create("security-table").await?;
    account(&ns, "reader", &["list", "watch"]).await?;
    account(&ns, "getter", &["get"]).await?;
    let reader = token(&ns, "reader", "kube-dispatch").await?;
    let getter = token(&ns, "getter", "kube-dispatch").await?;
    let other_audience = token(&ns, "reader", "another-service").await?;
    let static_user = std::fs::read_to_string(Cluster::shared().dir().join("tokens.csv"))?
        .lines()
        .find(|l| l.contains(",kd-test-user-1,"))
        .and_then(|l| l.split(',').next().map(str::to_owned))
        .ok_or("no static test user")?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let here = || vec![subscription("v1", "ConfigMap", ns.name())];
    let everywhere = || vec![subscription("v1", "ConfigMap", "")];
    let with_owned_secrets = || {
        let mut subs = here();
        subs.push(Subscription {
            resource: Some(ResourceRef {
                group: String::new(),
                version: "v1".into(),
                kind: "Secret".into(),
                ..ResourceRef::default()
            }),
            namespace: ns.name().to_owned(),
            owner: Some(ResourceRef {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                ..ResourceRef::default()
            }),
            ..Subscription::default()
        });
        subs
    };
    let n = ns.name();
    let table: Vec<(&str, Credentials, Vec<Subscription>, Code, String)> = vec![
        (
            "reader, its namespace",
            as_token(&reader),
            here(),
            Code::Ok,
            String::new(),
        ),
        (
            "reader, every namespace",
            as_token(&reader),
            everywhere(),
            Code::PermissionDenied,
            format!("system:serviceaccount:{n}:reader may not list configmaps in every namespace"),
        ),
        (
            "reader, owned Secrets without rights on Secrets",
            as_token(&reader),
            with_owned_secrets(),
            Code::PermissionDenied,
            format!("system:serviceaccount:{n}:reader may not list secrets in namespace {n}"),
        ),
        (
            "getter (get only), its namespace",
            as_token(&getter),
            here(),
            Code::PermissionDenied,
            format!("system:serviceaccount:{n}:getter may not list configmaps in namespace {n}"),
        ),
        (
            "no token",
            Credentials::tls(ca()),
            here(),
            Code::Unauthenticated,
            "no credential: send `authorization: Bearer <token>`".into(),
        ),
        (
            "a token for another audience",
            as_token(&other_audience),
            here(),
            Code::Unauthenticated,
            "token is for audiences [\"another-service\"], not kube-dispatch".into(),
        ),
        // Refused without a TokenReview: no answer of the API server could make them pass.
        (
            "a static token (not a JWT, no audience)",
            as_token(&static_user),
            here(),
            Code::Unauthenticated,
            "the bearer token is not a JWT".into(),
        ),
        (
            "not a token",
            as_token("not-a-token"),
            here(),
            Code::Unauthenticated,
            "the bearer token is not a JWT".into(),
        ),
    ];
    let mut failures = Vec::new();
    println!("{:<50} {:<18} message", "identity, subscription", "status");
    for (i, (row, credentials, subs, want, message)) in table.into_iter().enumerate() {
        let (got, said) = open_as(&d, &credentials, open(&format!("table-{i}"), subs)).await;
        println!(
            "{row:<50} {:<18} {}",
            format!("{got:?}"),
            if got == Code::Ok { "" } else { &said }
        );
        assert!(
            !said.contains(&reader) && !said.contains(&static_user),
            "{row}: a token in a message: {said}"
        );
        if got != want || (want != Code::Ok && !said.contains(&message)) {
            failures.push(format!(
                "{row}: got {got:?} {said:?}, want {want:?} {message:?}"
            ));
        }
    }
    d.stop().await;
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

/// Groups are scoped by identity: another identity, with the same rights, that takes a
/// controller's group name first (squatting it) gets a group of its own, and can neither take
/// the controller's keys nor acknowledge its deliveries away with its session id.
#[tokio::test]
async fn a_second_identity_can_neither_squat_join_nor_ack_in_another_group() -> TestResult {
    let ns = TestNamespace::create("security-groups").await?;
    account(&ns, "team-a", &["list", "watch"]).await?;
    account(&ns, "team-b", &["list", "watch"]).await?;
    let (a, b) = (
        as_token(&token(&ns, "team-a", "kube-dispatch").await?),
        as_token(&token(&ns, "team-b", "kube-dispatch").await?),
    );
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(ns.client(), ns.name());
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "one"}}))?,
        )
        .await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let poll = |session: &str| PollRequest {
        session_id: session.to_owned(),
        wait: prost_types::Duration::try_from(Duration::from_secs(2)).ok(),
        ..PollRequest::default()
    };
    // B takes the name first: the group it gets is its own.
    let mut client_b = d.client_as(&b).await;
    let squatter = client_b
        .open_session(open("owned", subs()))
        .await?
        .into_inner()
        .session_id;
    let mut client_a = d.client_as(&a).await;
    let session = client_a
        .open_session(open("owned", subs()))
        .await?
        .into_inner()
        .session_id;
    // A holds the key in flight, and B's group has the key too, for B alone.
    let held = client_a.poll(poll(&session)).await?.into_inner().requests;
    assert_eq!(held.len(), 1, "A got the ConfigMap");
    let its_own = client_b.poll(poll(&squatter)).await?.into_inner().requests;
    assert_eq!(its_own.len(), 1, "B's group has its own queue");
    // B tries to ack A's delivery away (saying A's replica stops, too), and to poll and close
    // A's session.
    let ack = client_b
        .ack(AckRequest {
            session_id: session.clone(),
            acks: vec![AckItem {
                delivery_id: held[0].delivery_id,
                outcome: Some(ack_item::Outcome::Success(Default::default())),
                memo: Vec::new(),
            }],
            ended_sessions: Vec::new(),
            stopping: true,
        })
        .await
        .expect_err("B acks on A's session");
    assert_eq!(ack.code(), Code::PermissionDenied, "{ack:?}");
    assert!(ack.message().contains("was not opened by"), "{ack:?}");
    let poll = client_b
        .poll(PollRequest {
            session_id: session.clone(),
            ..PollRequest::default()
        })
        .await
        .expect_err("B polls A's session");
    assert_eq!(poll.code(), Code::PermissionDenied, "{poll:?}");
    // The key is still A's to finish: its ack is taken.
    client_a
        .ack(AckRequest {
            session_id: session,
            acks: vec![AckItem {
                delivery_id: held[0].delivery_id,
                outcome: Some(ack_item::Outcome::Success(Default::default())),
                memo: Vec::new(),
            }],
            ended_sessions: Vec::new(),
            stopping: false,
        })
        .await?;
    d.stop().await;
    Ok(())
}

/// Only the dispatchers' own identity may call Peer.
#[tokio::test]
async fn peer_refuses_unauthenticated_and_foreign_callers() -> TestResult {
    let ns = TestNamespace::create("security-peer").await?;
    account(&ns, "reader", &["list", "watch"]).await?;
    let reader = as_token(&token(&ns, "reader", "kube-dispatch").await?);
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let request = || RecentDeletionsRequest {
        group: "g".into(),
        identity: "dispatcher-0".into(),
        members: vec!["dispatcher-0".into()],
        ..RecentDeletionsRequest::default()
    };
    let ask = |credentials: Credentials| {
        let address = d.addr.to_string();
        let request = request();
        async move {
            let channel = credentials.endpoint(&address)?.connect().await?;
            let answer = PeerClient::with_interceptor(channel, credentials.bearer())
                .recent_deletions(request)
                .await;
            Ok::<_, kube_dispatch_tests::TestError>(answer.map(|_| ()).map_err(|s| s.code()))
        }
    };
    assert_eq!(
        ask(Credentials::tls(ca())).await?,
        Err(Code::Unauthenticated)
    );
    assert_eq!(ask(reader).await?, Err(Code::PermissionDenied));
    assert_eq!(ask(kube_dispatch_tests::credentials()).await?, Ok(()));
    d.stop().await;
    Ok(())
}

/// A plaintext client gets nothing from a TLS server, not even an answer.
#[tokio::test]
async fn a_plaintext_client_is_refused_by_a_tls_server() -> TestResult {
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let tester = std::fs::read_to_string(Cluster::shared().dir().join("tokens/tester.token"))?;
    let plaintext = Credentials::plaintext().with_token(tester.trim());
    let answer = match plaintext.endpoint(&d.addr.to_string())?.connect().await {
        Err(_) => None,
        Ok(channel) => Some(
            kube_dispatch_proto::v1::dispatcher_client::DispatcherClient::with_interceptor(
                channel,
                plaintext.bearer(),
            )
            .open_session(open("plain", vec![]))
            .await,
        ),
    };
    match answer {
        None => {}
        Some(Err(status)) => assert!(
            matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::Internal
            ),
            "{status:?}"
        ),
        Some(Ok(_)) => panic!("a plaintext call was answered"),
    }
    d.stop().await;
    Ok(())
}

/// A RoleBinding removed while a session is open ends the session within the recheck period
/// plus one poll.
#[tokio::test]
async fn a_revoked_role_binding_ends_the_session_within_the_recheck() -> TestResult {
    let ns = TestNamespace::create("security-revoke").await?;
    account(&ns, "reader", &["list", "watch"]).await?;
    let reader = as_token(&token(&ns, "reader", "kube-dispatch").await?);
    let recheck = Duration::from_secs(2);
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.security.authorization.recheck = recheck;
    let d = TestDispatcher::start(config).await?;
    let mut client = d.client_as(&reader).await;
    let session = client
        .open_session(open(
            "revoked",
            vec![subscription("v1", "ConfigMap", ns.name())],
        ))
        .await?
        .into_inner()
        .session_id;
    Api::<RoleBinding>::namespaced(ns.client(), ns.name())
        .delete("reader", &DeleteParams::default())
        .await?;
    let revoked = tokio::time::Instant::now();
    let poll_wait = Duration::from_millis(500);
    let ended = eventually(
        Duration::from_secs(30),
        "the session ended after its RoleBinding was deleted",
        || {
            let mut client = client.clone();
            let session_id = session.clone();
            async move {
                client
                    .poll(PollRequest {
                        session_id,
                        wait: prost_types::Duration::try_from(poll_wait).ok(),
                        ..PollRequest::default()
                    })
                    .await
                    .err()
            }
        },
    )
    .await?;
    let took = revoked.elapsed();
    println!(
        "session ended {took:?} after its RoleBinding was deleted (recheck {recheck:?}, poll wait {poll_wait:?})"
    );
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(
        ended.message().contains("may not list configmaps"),
        "{ended:?}"
    );
    assert!(
        took <= recheck + poll_wait + Duration::from_secs(2),
        "ended {took:?} after the revocation, past the recheck bound"
    );
    // The session is gone: polling again says so.
    let again = client
        .poll(PollRequest {
            session_id: session,
            ..PollRequest::default()
        })
        .await
        .expect_err("the session was closed");
    assert_eq!(again.code(), Code::NotFound, "{again:?}");
    d.stop().await;
    Ok(())
}

/// One identity over its limits (groups, sessions, request rate) gets RESOURCE_EXHAUSTED
/// naming the limit, and another identity on the same dispatcher is served as before.
#[tokio::test]
async fn one_identity_over_its_limits_leaves_the_others_alone() -> TestResult {
    use std::num::NonZeroU32;

    use kube_dispatch_server::{auth::AuthConfig, limits::RequestRate};

    let ns = TestNamespace::create("security-limits").await?;
    account(&ns, "greedy", &["list", "watch"]).await?;
    account(&ns, "modest", &["list", "watch"]).await?;
    let greedy = as_token(&token(&ns, "greedy", "kube-dispatch").await?);
    let modest = as_token(&token(&ns, "modest", "kube-dispatch").await?);
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.limits.max_groups_per_identity = 2;
    config.settings.limits.max_sessions_per_identity = 3;
    let rate = NonZeroU32::new(20).ok_or("zero")?;
    config.security.authentication = Some(AuthConfig {
        rate: RequestRate {
            per_second: rate,
            burst: rate,
        },
        ..AuthConfig::default()
    });
    let d = TestDispatcher::start(config).await?;
    let here = || vec![subscription("v1", "ConfigMap", ns.name())];
    let session = |group: &str, replica: &str| OpenSessionRequest {
        replica_id: replica.into(),
        ..open(group, here())
    };

    let mut seen = Vec::new();
    for (who, credentials, group, replica) in [
        ("greedy", &greedy, "greedy-0", "r0"),
        ("greedy", &greedy, "greedy-1", "r0"),
        ("greedy", &greedy, "greedy-2", "r0"),
        ("greedy", &greedy, "greedy-0", "r1"),
        ("greedy", &greedy, "greedy-0", "r2"),
        ("greedy", &greedy, "greedy-0", "r1"),
        ("modest", &modest, "modest-0", "r0"),
    ] {
        let (code, said) = open_as(&d, credentials, session(group, replica)).await;
        println!("{who} opens {group}/{replica}: {code:?} {said}");
        seen.push((code, said));
    }
    let codes: Vec<Code> = seen.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::ResourceExhausted, // a third group
            Code::Ok,
            Code::ResourceExhausted, // a fourth session
            Code::Ok,                // a replica reopening takes no new slot
            Code::Ok,                // the other identity
        ]
    );
    let greedy_user = format!("system:serviceaccount:{}:greedy", ns.name());
    assert!(
        seen[2].1.contains(&format!(
            "{greedy_user} already holds 2 controller groups (idle ones included)"
        )),
        "{}",
        seen[2].1
    );
    assert!(
        seen[4]
            .1
            .contains(&format!("{greedy_user} already holds 3 sessions")),
        "{}",
        seen[4].1
    );

    // Rate: the greedy identity polls as fast as it can; past its burst it is refused, and the
    // modest one's next call is served.
    let poll = |session_id: &str| PollRequest {
        session_id: session_id.into(),
        max_items: 1,
        wait: prost_types::Duration::try_from(Duration::from_millis(1)).ok(),
        acks: vec![],
        max_bytes: 0,
        ended_sessions: Vec::new(),
    };
    let mut client = d.client_as(&greedy).await;
    let mut refused = None;
    for _ in 0..100 {
        if let Err(status) = client.poll(poll(&seen[0].1)).await
            && status.code() == Code::ResourceExhausted
        {
            refused = Some(status.message().to_owned());
            break;
        }
    }
    let refused = refused.ok_or("100 quick polls were never refused")?;
    assert!(
        refused.contains(&format!(
            "{greedy_user} sent more than 20 requests per second (bursts of 20)"
        )),
        "{refused}"
    );
    let answer = d.client_as(&modest).await.poll(poll(&seen[6].1)).await;
    assert!(
        answer.is_ok(),
        "the modest identity was refused: {answer:?}"
    );
    d.stop().await;
    Ok(())
}

/// The certificate a TLS server at `address` presents to a new connection (its leaf, DER).
async fn served_certificate(address: std::net::SocketAddr) -> TestResult<Vec<u8>> {
    use rustls_pki_types::ServerName;
    let stream = tokio::net::TcpStream::connect(address).await?;
    let tls = crate::tls_connector()?
        .connect(ServerName::try_from("localhost")?, stream)
        .await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or("no certificate presented")?;
    Ok(leaf.to_vec())
}

fn certificate_in(path: &std::path::Path) -> TestResult<Vec<u8>> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    Ok(CertificateDer::from_pem_file(path)?.to_vec())
}

/// A certificate rotated on disk (as the kubelet updates a mounted Secret) is presented to new
/// connections within the reload interval, while a session opened before it keeps polling on
/// its connection and new sessions open under the new certificate.
#[tokio::test]
async fn a_certificate_rotation_keeps_sessions_alive() -> TestResult {
    use kube_dispatch_server::tls::{ServerTls, Transport};

    let ns = TestNamespace::create("security-rotation").await?;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(ns.name());
    std::fs::create_dir_all(&dir)?;
    let (old, next) = (
        kube_dispatch_tests::serving_tls(false),
        kube_dispatch_tests::serving_tls(true),
    );
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::copy(&old.cert_file, &cert)?;
    std::fs::copy(&old.key_file, &key)?;
    let mut tls = ServerTls::new(&cert, &key);
    tls.reload_interval = Duration::from_millis(200);
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.security.transport = Transport::Tls(tls);
    let d = TestDispatcher::start(config).await?;
    assert_eq!(
        served_certificate(d.addr).await?,
        certificate_in(&old.cert_file)?
    );

    let mut client = d.client().await;
    let here = || vec![subscription("v1", "ConfigMap", ns.name())];
    let session = client
        .open_session(open("rotation", here()))
        .await?
        .into_inner()
        .session_id;
    let poll = || PollRequest {
        session_id: session.clone(),
        max_items: 10,
        wait: prost_types::Duration::try_from(Duration::from_millis(50)).ok(),
        acks: vec![],
        max_bytes: 0,
        ended_sessions: Vec::new(),
    };
    client.poll(poll()).await?;

    // Rotate as the kubelet does: the new files appear whole (written aside, then renamed).
    for (from, to) in [(&next.key_file, &key), (&next.cert_file, &cert)] {
        let aside = to.with_extension("new");
        std::fs::copy(from, &aside)?;
        std::fs::rename(&aside, to)?;
    }
    let want = certificate_in(&next.cert_file)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The server re-reads its files on a timer; nothing to await but a fresh handshake.
    while served_certificate(d.addr).await? != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated certificate was not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The session opened before the rotation polls on, on its connection ...
    client.poll(poll()).await?;
    // ... and a new connection opens a session under the new certificate.
    d.client()
        .await
        .open_session(OpenSessionRequest {
            replica_id: "replica-1".into(),
            ..open("rotation", here())
        })
        .await?;
    d.stop().await;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The load balancer places only authenticated callers, each user in groups of its own: a
/// caller without a token is refused, and another identity registering under a group's name
/// gets a group of its own, whichever registered first.
#[tokio::test]
async fn register_refuses_unauthenticated_callers_and_scopes_groups() -> TestResult {
    use kube_dispatch_proto::v1::{RegisterRequest, load_balancer_client::LoadBalancerClient};
    use kube_dispatch_tests::loadbalancer::TestLoadBalancer;

    let ns = TestNamespace::create("security-register").await?;
    account(&ns, "team-a", &[]).await?;
    account(&ns, "team-b", &[]).await?;
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let register = |credentials: Credentials, replica: &str| {
        let (address, replica) = (lb.addr.to_string(), replica.to_owned());
        async move {
            let channel = credentials.endpoint(&address)?.connect().await?;
            let mut client = LoadBalancerClient::with_interceptor(channel, credentials.bearer());
            let answer = client
                .register(RegisterRequest {
                    group: "placed".into(),
                    replica_id: replica,
                    dispatchers: Vec::new(),
                })
                .await;
            // A registration lasts as long as its stream: the stream is kept.
            Ok::<_, kube_dispatch_tests::TestError>(match answer {
                Ok(mut stream) => {
                    stream.get_mut().message().await?;
                    (Code::Ok, String::new(), Some(stream))
                }
                Err(status) => (status.code(), status.message().to_owned(), None),
            })
        }
    };
    let (a, b) = (
        as_token(&token(&ns, "team-a", "kube-dispatch").await?),
        as_token(&token(&ns, "team-b", "kube-dispatch").await?),
    );
    let (code, said, _) = register(Credentials::tls(ca()), "anonymous").await?;
    assert_eq!(code, Code::Unauthenticated, "{said}");
    let mut streams = Vec::new();
    for (credentials, replica) in [(a.clone(), "a-0"), (b, "b-0"), (a, "a-1")] {
        let (code, said, stream) = register(credentials, replica).await?;
        assert_eq!(code, Code::Ok, "{replica}: {said}");
        streams.push(stream);
    }
    let user = |name: &str| Some(format!("system:serviceaccount:{}:{name}", ns.name()));
    let groups: Vec<(Option<String>, Vec<String>)> = lb
        .handles
        .registry
        .placements()
        .into_iter()
        .map(|(id, placement)| (id.owner, placement.keys().cloned().collect()))
        .collect();
    assert_eq!(
        groups,
        [
            (user("team-a"), vec!["a-0".to_owned(), "a-1".to_owned()]),
            (user("team-b"), vec!["b-0".to_owned()]),
        ]
    );
    Ok(())
}

/// A group listed with `--group-owner` is open to exactly the users listed, whoever comes
/// first: a controller running under two ServiceAccounts shares it, a third cannot take it.
#[tokio::test]
async fn a_listed_group_is_shared_by_the_listed_identities_only() -> TestResult {
    use kube_dispatch_server::auth::GroupOwners;

    let ns = TestNamespace::create("security-owners").await?;
    for name in ["old-sa", "new-sa", "other"] {
        account(&ns, name, &["list", "watch"]).await?;
    }
    let user = |name: &str| format!("system:serviceaccount:{}:{name}", ns.name());
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.group_owners = GroupOwners::from_pairs([
        ("migrating".to_owned(), user("old-sa")),
        ("migrating".to_owned(), user("new-sa")),
    ]);
    let d = TestDispatcher::start(config).await?;
    let here = || vec![subscription("v1", "ConfigMap", ns.name())];
    // Sessions outlive the test's token mints and reviews on a loaded machine.
    let session = |group: &str, replica: &str| OpenSessionRequest {
        replica_id: replica.into(),
        ttl: prost_types::Duration::try_from(Duration::from_secs(60)).ok(),
        ..open(group, here())
    };
    let other = as_token(&token(&ns, "other", "kube-dispatch").await?);
    let (code, said) = open_as(&d, &other, session("migrating", "r0")).await;
    assert_eq!(code, Code::PermissionDenied, "{said}");
    assert!(
        said.contains(&format!(
            "is listed with --group-owner for {} or {}",
            user("old-sa"),
            user("new-sa")
        )),
        "{said}"
    );
    for (name, replica) in [("new-sa", "r1"), ("old-sa", "r2")] {
        let credentials = as_token(&token(&ns, name, "kube-dispatch").await?);
        let (code, said) = open_as(&d, &credentials, session("migrating", replica)).await;
        assert_eq!(code, Code::Ok, "{name}: {said}");
    }
    // One listed identity cannot take over a replica id (and its keys) another one holds.
    let old = as_token(&token(&ns, "old-sa", "kube-dispatch").await?);
    let (code, said) = open_as(&d, &old, session("migrating", "r1")).await;
    assert_eq!(code, Code::PermissionDenied, "{said}");
    assert!(
        said.contains(&format!("has a live session opened by {}", user("new-sa"))),
        "{said}"
    );
    // Groups not listed keep the default: each user's own.
    assert_eq!(
        open_as(&d, &other, session("its-own", "r0")).await.0,
        Code::Ok
    );
    d.stop().await;
    Ok(())
}
