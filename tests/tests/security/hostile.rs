//! Hostile clients against one dispatcher, all at once: a session that never acks, polls with
//! absurd values, sessions opened in a loop, connections dropped in the middle of a message,
//! oversized requests. Meanwhile a well-behaved session must keep getting every change, and the
//! process's memory must stay bounded.

use std::{
    io::Write as _,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use kube_dispatch_proto::v1::{OpenSessionRequest, PollRequest};
use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_do_not_stop_others_and_memory_stays_bounded() -> TestResult {
    let ns = TestNamespace::create("hostile").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.limits.max_sessions = 64;
    config.settings.limits.max_sessions_per_group = 32;
    config.max_message_bytes = 64 * 1024;
    // The well-behaved session is not polled while the session loop runs: a ttl no loaded
    // machine outlasts.
    config.settings.limits.default_ttl = Duration::from_secs(30);
    let d = TestDispatcher::start(config).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let write = |i: usize, round: u64| {
        let api = api.clone();
        async move {
            let cm = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": format!("cm-{i}") },
                "data": { "round": round.to_string() },
            });
            api.patch(
                &format!("cm-{i}"),
                &PatchParams::apply("t").force(),
                &Patch::Apply(&cm),
            )
            .await
        }
    };
    for i in 0..20 {
        write(i, 0).await?;
    }
    let mut good = TestSession::open(&d, "good", "good-0", subs()).await?;
    let first = good
        .collect_until(Duration::from_secs(20), |got| got.len() >= 20)
        .await;
    assert_eq!(first.len(), 20);
    let before = kube_dispatch_tests::rss_kib();

    let stop = CancellationToken::new();
    let mut hostile = tokio::task::JoinSet::new();
    // A session of another group that takes everything and never acks.
    {
        let mut s = TestSession::open(&d, "greedy", "greedy-0", subs()).await?;
        let stop = stop.clone();
        hostile.spawn(async move {
            while !stop.is_cancelled() {
                let _ = s.poll_acking(&[], Duration::from_millis(500)).await;
            }
        });
    }
    // Absurd polls: huge item counts, waits of years, on valid and invalid sessions.
    {
        let mut client = d.client().await;
        let stop = stop.clone();
        hostile.spawn(async move {
            let session = client
                .open_session(OpenSessionRequest {
                    group: "absurd".into(),
                    replica_id: "absurd-0".into(),
                    subscriptions: vec![],
                    ttl: None,
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().session_id)
                .unwrap_or_default();
            while !stop.is_cancelled() {
                for (id, wait) in [
                    (session.clone(), 10 * 365 * 24 * 3600),
                    ("no-such-session".to_owned(), 1),
                    (session.clone(), -5),
                ] {
                    let _ = client
                        .poll(PollRequest {
                            session_id: id,
                            max_items: u32::MAX,
                            wait: Some(prost_types::Duration {
                                seconds: wait,
                                nanos: 0,
                            }),
                            acks: vec![],
                            max_bytes: 0,
                            ended_sessions: Vec::new(),
                        })
                        .await;
                }
            }
        });
    }
    // Sessions opened in a loop, never used again: bounded by the limits, then expired.
    let refused = {
        let mut client = d.client().await;
        let mut refused = 0usize;
        for i in 0..200 {
            let opened = client
                .open_session(OpenSessionRequest {
                    group: format!("loop-{}", i % 8),
                    replica_id: format!("loop-{i}"),
                    subscriptions: subs(),
                    ttl: None,
                    ..Default::default()
                })
                .await;
            if let Err(status) = opened {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                refused += 1;
            }
        }
        refused
    };
    assert!(refused > 0, "the session limit was never reached");
    // Connections dropped in the middle of an HTTP/2 request, and oversized requests.
    {
        let addr = d.addr;
        let stop = stop.clone();
        hostile.spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    {
        let mut client = d.client().await;
        let too_big = client
            .open_session(OpenSessionRequest {
                group: "x".repeat(100 * 1024),
                replica_id: "big".into(),
                subscriptions: vec![],
                ttl: None,
                ..Default::default()
            })
            .await;
        assert_eq!(
            too_big.err().map(|s| s.code()),
            Some(tonic::Code::ResourceExhausted)
        );
    }

    // Meanwhile, every change reaches the well-behaved session, promptly.
    let mut worst = Duration::ZERO;
    for round in 1..=5u64 {
        let written = Instant::now();
        for i in 0..20 {
            write(i, round).await?;
        }
        let got = good
            .collect_until(Duration::from_secs(20), |got| {
                (0..20).all(|i| got.iter().any(|r| r.key.ends_with(&format!("/cm-{i}"))))
            })
            .await;
        assert!(
            (0..20).all(|i| got.iter().any(|r| r.key.ends_with(&format!("/cm-{i}")))),
            "round {round}: changes did not all reach the well-behaved session"
        );
        worst = worst.max(written.elapsed());
    }
    stop.cancel();
    while hostile.join_next().await.is_some() {}
    let after = kube_dispatch_tests::rss_kib();
    let grown = after.saturating_sub(before);
    println!(
        "hostile clients: {refused} of 200 looped sessions refused; 5 rounds of 20 changes each reached the well-behaved session within {worst:?}; RSS {before} KiB before, {after} KiB after (+{grown} KiB)"
    );
    assert!(
        grown < 64 * 1024,
        "memory grew by {grown} KiB under hostile clients"
    );
    d.stop().await;
    Ok(())
}
