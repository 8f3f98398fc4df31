//! A shared tier survives every tenant (`proto/kubedispatch/v1/security.md`, "Threats and
//! bounds"): against the real API server, each attack runs at the most its bound allows while a
//! legitimate controller keeps being served, and each test fails without its bound.

use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use kube_dispatch_proto::{
    credentials::Credentials,
    v1::{AckItem, PollRequest, Requeue, ack_item, dispatcher_client::DispatcherClient},
};
use kube_dispatch_server::auth::AuthConfig;
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
    identity::{account, token},
    wait_for,
};
use tonic::Code;

/// Held by the tests that measure this process's memory and by those that fill it with large
/// objects, so no measurement counts another test's objects.
static MEMORY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ca() -> std::path::PathBuf {
    Cluster::shared().dir().join("pki/ca.crt")
}

/// A token that looks right (a JWT for our audience, not expired) but that no API server
/// issued: it reaches a TokenReview, which refuses it.
fn forged_token(n: u64) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    format!(
        "{}.{}.forged",
        b64(r#"{"alg":"RS256"}"#),
        b64(&format!(
            r#"{{"aud":["kube-dispatch"],"exp":{exp},"jti":"{n}"}}"#
        ))
    )
}

async fn write_configmap(api: &Api<ConfigMap>, name: &str, value: &str) -> kube::Result<()> {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": { "value": value },
    });
    api.patch(name, &PatchParams::apply("t").force(), &Patch::Apply(&cm))
        .await
        .map(drop)
}

/// Junk bearer tokens at 300 per second, forged JWTs among them, while a controller whose
/// verdicts age out every second polls: the controller is never refused, the forged tokens'
/// peer is held to its own budget, and the opaque ones never reach the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_flood_never_refuses_a_valid_controller() -> TestResult {
    let ns = TestNamespace::create("hostile-tokens").await?;
    account(&ns, "controller", &["list", "watch"]).await?;
    let valid = token(&ns, "controller", "kube-dispatch").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.security.authentication = Some(AuthConfig {
        cache_ttl: Duration::from_secs(1),
        ..AuthConfig::default()
    });
    let metrics = config.metrics.clone();
    let d = TestDispatcher::start(config).await?;
    let controller = Credentials::tls(ca()).with_token(&valid);
    let mut client = d.client_as(&controller).await;
    let session = client
        .open_session(kube_dispatch_proto::v1::OpenSessionRequest {
            group: "tokens".into(),
            replica_id: "tokens-0".into(),
            subscriptions: vec![subscription("v1", "ConfigMap", ns.name())],
            ttl: None,
            ..Default::default()
        })
        .await?
        .into_inner()
        .session_id;

    let flooding = tokio_util::sync::CancellationToken::new();
    let flood = {
        let channel = Credentials::tls(ca())
            .endpoint(&d.addr.to_string())?
            .connect()
            .await?;
        let stop = flooding.clone();
        tokio::spawn(async move {
            let mut junk = DispatcherClient::new(channel);
            let (mut sent, mut n) = (0u64, 0u64);
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !stop.is_cancelled() {
                tick.tick().await;
                for _ in 0..3 {
                    n += 1;
                    let token = if n % 2 == 0 {
                        forged_token(n)
                    } else {
                        format!("junk-{n}")
                    };
                    let mut request = tonic::Request::new(PollRequest {
                        session_id: "x".into(),
                        ..PollRequest::default()
                    });
                    request.metadata_mut().insert(
                        "authorization",
                        format!("Bearer {token}").parse().expect("ascii"),
                    );
                    let refused = junk.poll(request).await.expect_err("junk passes nothing");
                    assert!(
                        matches!(
                            refused.code(),
                            Code::Unauthenticated | Code::ResourceExhausted | Code::Unavailable
                        ),
                        "{refused:?}"
                    );
                    sent += 1;
                }
            }
            sent
        })
    };

    let mut refused = Vec::new();
    let began = Instant::now();
    for _ in 0..40 {
        let answer = client
            .poll(PollRequest {
                session_id: session.clone(),
                wait: prost_types::Duration::try_from(Duration::from_millis(250)).ok(),
                ..PollRequest::default()
            })
            .await;
        if let Err(status) = answer {
            refused.push(status);
        }
    }
    let took = began.elapsed();
    flooding.cancel();
    let sent = flood.await?;
    let held = metrics.refusals().count("failed_authentications_per_peer");
    println!(
        "token flood: {sent} junk calls in {took:?}, the valid controller refused {} of 40 polls, the flooding peer held {held} times",
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "the valid controller was refused: {refused:?}"
    );
    assert!(sent > 1000, "the flood ran: {sent} calls");
    assert!(
        held > 0,
        "the forged tokens' peer was never held to its budget"
    );
    d.stop().await;
    Ok(())
}

/// Health streams, which need no credential, opened far past their bound on many
/// connections: past it they are refused at once, memory stays bounded, and a controller is
/// served all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_stream_flood_is_refused_past_its_bound() -> TestResult {
    let _memory = MEMORY.lock().await;
    let ns = TestNamespace::create("hostile-streams").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.server.max_unauthenticated_calls = 32;
    let d = TestDispatcher::start(config).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut good = TestSession::open(
        &d,
        "good",
        "good-0",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    let before = kube_dispatch_tests::rss_kib();

    let mut streams = Vec::new();
    let (mut accepted, mut refused) = (0usize, 0usize);
    for _ in 0..20 {
        let channel = Credentials::tls(ca())
            .endpoint(&d.addr.to_string())?
            .connect()
            .await?;
        for _ in 0..50 {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
            let opened = tokio::time::timeout(
                Duration::from_secs(5),
                health.watch(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                }),
            )
            .await?;
            match opened {
                Ok(stream) => {
                    accepted += 1;
                    streams.push(stream.into_inner());
                }
                Err(status) => {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    refused += 1;
                }
            }
        }
    }
    let grown = kube_dispatch_tests::rss_kib().saturating_sub(before);
    write_configmap(&api, "served", "1").await?;
    let got = good
        .collect_until(Duration::from_secs(20), |got| !got.is_empty())
        .await;
    println!(
        "health stream flood: {accepted} of 1000 streams accepted, {refused} refused, RSS +{grown} KiB"
    );
    assert_eq!(
        accepted, 32,
        "exactly the bound of streams without a credential"
    );
    assert_eq!(refused, 1000 - 32);
    assert!(grown < 16 * 1024, "memory grew by {grown} KiB");
    assert_eq!(got.len(), 1, "the controller was served during the flood");
    // The streams' places come back as they end.
    streams.clear();
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        Credentials::tls(ca())
            .endpoint(&d.addr.to_string())?
            .connect()
            .await?,
    );
    wait_for(Duration::from_secs(10), "a health check's place", || {
        let mut health = health.clone();
        async move {
            health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .is_ok()
        }
    })
    .await?;
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    d.stop().await;
    Ok(())
}

/// Polls `session` acknowledging what it got, telling the dispatcher it accepts `max_bytes`
/// (0: gRPC's default 4 MiB, the limit of the client used here), until `n` requests arrived:
/// each answer's size is checked against the bound, and the answers' count and what arrived
/// (name, whether with its body) are returned.
async fn poll_heavy(
    session: &mut TestSession,
    max_bytes: u32,
    n: usize,
) -> Result<(usize, Vec<(String, bool)>), tonic::Status> {
    let bound = if max_bytes == 0 {
        4 * 1024 * 1024
    } else {
        max_bytes as usize
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut answers, mut got, mut acks) = (0, Vec::new(), Vec::new());
    while got.len() < n && Instant::now() < deadline {
        let answer = session
            .client
            .poll(PollRequest {
                session_id: session.id.clone(),
                max_items: 16,
                wait: prost_types::Duration::try_from(Duration::from_millis(500)).ok(),
                acks: std::mem::take(&mut acks),
                max_bytes,
                ended_sessions: Vec::new(),
            })
            .await?
            .into_inner();
        let bytes = prost::Message::encoded_len(&answer);
        assert!(bytes <= bound, "{bytes} bytes in one answer, over {bound}");
        if !answer.requests.is_empty() {
            answers += 1;
        }
        for r in answer.requests {
            acks.push(AckItem {
                delivery_id: r.delivery_id,
                outcome: Some(ack_item::Outcome::Success(Default::default())),
                memo: Vec::new(),
            });
            got.push((r.object.unwrap_or_default().name, !r.object_json.is_empty()));
        }
    }
    got.sort();
    Ok((answers, got))
}

/// Six ConfigMaps of 1000 KiB, full payload, polled 16 at a time by a client with gRPC's
/// default 4 MiB limit (the answer was 6.1 MB and broke the session): every answer fits, every
/// object arrives with its body. A client that accepts 512 KiB gets them all without their
/// bodies, to read fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_objects_never_break_a_session() -> TestResult {
    let _memory = MEMORY.lock().await;
    let ns = TestNamespace::create("hostile-heavy").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    // Sessions that outlive the writes and the other's polls however slow the machine (the
    // light one waits, unpolled, while the heavy one is served).
    let ttl = Duration::from_secs(60);
    let mut heavy = TestSession::open_for(&d, "heavy", "heavy-0", subs(), ttl).await?;
    let mut light = TestSession::open_for(&d, "light", "light-0", subs(), ttl).await?;
    let kib1000 = "x".repeat(1000 * 1024);
    for i in 0..6 {
        write_configmap(&api, &format!("big-{i}"), &kib1000).await?;
    }
    let all = |body: bool| {
        (0..6)
            .map(|i| (format!("big-{i}"), body))
            .collect::<Vec<_>>()
    };
    let (answers, got) = poll_heavy(&mut heavy, 0, 6).await?;
    assert_eq!(got, all(true));
    assert!(
        answers >= 2,
        "six objects of 1000 KiB in {answers} answer(s) of 4 MiB"
    );
    let (_, got) = poll_heavy(&mut light, 512 * 1024, 6).await?;
    assert_eq!(got, all(false));
    d.stop().await;
    Ok(())
}

/// A requeue of i64::MAX seconds (it overflowed a timer and panicked a task): refused as
/// INVALID_ARGUMENT with the bound, and the key is delivered again as after any refused ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_requeue_is_refused_and_the_key_kept() -> TestResult {
    let ns = TestNamespace::create("hostile-requeue").await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut session = TestSession::open(
        &d,
        "requeue",
        "requeue-0",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    write_configmap(&api, "cm", "1").await?;
    let held = session.hold(Duration::from_secs(20)).await?;
    assert_eq!(held.len(), 1);
    let absurd = AckItem {
        delivery_id: held[0].delivery_id,
        outcome: Some(ack_item::Outcome::Requeue(Requeue {
            after: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: 0,
            }),
        })),
        memo: Vec::new(),
    };
    let refused = session
        .poll_with(vec![absurd], Duration::from_millis(10))
        .await
        .expect_err("an absurd requeue");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("at most 604800s"), "{refused:?}");
    // The refused ack settled nothing: a week's requeue is taken, and the dispatcher serves on.
    let week = AckItem {
        delivery_id: held[0].delivery_id,
        outcome: Some(ack_item::Outcome::Requeue(Requeue {
            after: Some(prost_types::Duration {
                seconds: 604_800,
                nanos: 0,
            }),
        })),
        memo: Vec::new(),
    };
    session
        .poll_with(vec![week], Duration::from_millis(10))
        .await?;
    write_configmap(&api, "other", "1").await?;
    let next = session.hold(Duration::from_secs(20)).await?;
    assert_eq!(
        next.iter()
            .map(|r| r.object.clone().unwrap_or_default().name)
            .collect::<Vec<_>>(),
        ["other"]
    );
    d.stop().await;
    Ok(())
}

/// A tenant whose group fills the process's body pool, never polls and keeps writing cannot
/// keep bodies from another tenant: every group shares one pool (`--max-body-bytes`), and once
/// it runs short each user gets an even share and takes no more. A 4 MiB pool here: 1000 KiB
/// ConfigMaps of one identity, rewritten all along, fill it; once a second identity's group
/// exists the first is held to half, and the second's objects arrive with their bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_filling_the_body_pool_leaves_the_others_their_share() -> TestResult {
    use kube_dispatch_core::queue::pool::BodyPool;

    let _memory = MEMORY.lock().await;
    let (hog_ns, fair_ns) = (
        TestNamespace::create("hostile-pool-hog").await?,
        TestNamespace::create("hostile-pool-fair").await?,
    );
    account(&hog_ns, "hog", &["list", "watch"]).await?;
    account(&fair_ns, "fair", &["list", "watch"]).await?;
    let as_ = |token: String| Credentials::tls(ca()).with_token(&token);
    let hog_identity = as_(token(&hog_ns, "hog", "kube-dispatch").await?);
    let fair_identity = as_(token(&fair_ns, "fair", "kube-dispatch").await?);
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    let pool = BodyPool::new(4 * 1024 * 1024);
    config.settings.bodies = pool.clone();
    let d = TestDispatcher::start(config).await?;
    let hog_subs = vec![subscription("v1", "ConfigMap", hog_ns.name())];
    let _hog_session = TestSession::open_as(&d, &hog_identity, "tenant", "r-0", hog_subs).await?;
    let hog = d
        .handles
        .groups
        .all()
        .into_iter()
        .find(|g| g.id.name == "tenant")
        .ok_or("no hog group")?;
    let hog_api: Api<ConfigMap> = Api::namespaced(hog_ns.client(), hog_ns.name());
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (stop, api) = (stop.clone(), hog_api.clone());
        tokio::spawn(async move {
            let mut round = 0u32;
            while !stop.is_cancelled() {
                for i in 0..8 {
                    let value = format!("{round}{}", "x".repeat(1000 * 1024));
                    write_configmap(&api, &format!("big-{i}"), &value).await?;
                }
                round += 1;
            }
            Ok::<_, kube::Error>(round)
        })
    };
    wait_for(
        Duration::from_secs(30),
        "the hog's bodies fill the pool",
        || std::future::ready(pool.is_short()),
    )
    .await?;
    // The second tenant uses the same group name: its group is its own.
    let fair_subs = vec![subscription("v1", "ConfigMap", fair_ns.name())];
    let mut fair = TestSession::open_as(&d, &fair_identity, "tenant", "r-0", fair_subs).await?;
    wait_for(
        Duration::from_secs(10),
        "the hog is held to its share",
        || std::future::ready(hog.body_bytes() <= pool.capacity() / 2),
    )
    .await?;
    let fair_api: Api<ConfigMap> = Api::namespaced(fair_ns.client(), fair_ns.name());
    let kib100 = "y".repeat(100 * 1024);
    for i in 0..4 {
        write_configmap(&fair_api, &format!("cm-{i}"), &kib100).await?;
    }
    let (_, got) = poll_heavy(&mut fair, 0, 4).await?;
    let expected: Vec<(String, bool)> = (0..4).map(|i| (format!("cm-{i}"), true)).collect();
    assert_eq!(
        got, expected,
        "the second tenant's objects come with their bodies"
    );
    let hog_held = hog.body_bytes();
    stop.cancel();
    let rounds = writer.await??;
    println!(
        "body pool: the hog rewrote 8 x 1000 KiB {rounds} times, held {hog_held} bytes of a {} byte pool at the end",
        pool.capacity()
    );
    assert!(rounds >= 1, "the hog kept writing");
    assert!(
        hog_held <= pool.capacity() / 2,
        "the hog took back {hog_held} bytes"
    );
    d.stop().await;
    Ok(())
}
