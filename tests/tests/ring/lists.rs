//! Lists shared on a ring keyed by name, against the real API server: dispatchers that start
//! the same watch together read one LIST, made by the dispatcher its path falls on and relayed
//! to the others over `Peer.List`, and each still delivers exactly its own keys.

use std::{collections::BTreeMap, sync::atomic::Ordering, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube_dispatch_dispatcher::watch::sharing::SharingCounts;
use kube_dispatch_proto::{RequestKey, Ring, RingKey};
use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
};

const DISPATCHERS: usize = 3;
const OBJECTS: usize = 30;

/// A counter of `d`'s sharing.
fn shared(
    d: &TestDispatcher,
    counter: impl Fn(&SharingCounts) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    d.handles
        .groups
        .sharing()
        .map_or(0, |s| counter(&s.counts).load(Ordering::Relaxed))
}

#[tokio::test]
async fn dispatchers_that_start_a_watch_together_read_one_list() -> TestResult {
    let ns = TestNamespace::create("shared-list").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("cm-{i}"));
            let api = api.clone();
            async move { api.create(&PostParams::default(), &cm).await }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;

    let names: Vec<String> = (0..DISPATCHERS)
        .map(|i| format!("dispatcher-{i}"))
        .collect();
    let mut dispatchers = Vec::new();
    for name in &names {
        let config = lease_config(ns.name(), name, Duration::from_secs(3));
        dispatchers.push(TestDispatcher::start(config).await?);
    }
    for d in &dispatchers {
        let mut slice = d.handles.slice.clone();
        tokio::time::timeout(
            Duration::from_secs(30),
            slice.wait_for(|s| {
                s.ring.members() == names.as_slice()
                    && s.is_settled()
                    && s.list_sharers.len() == DISPATCHERS - 1
            }),
        )
        .await??;
    }

    // One replica's sessions, opened on every dispatcher at once, as an SDK opens them.
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let sessions = futures::future::try_join_all(
        dispatchers
            .iter()
            .map(|d| TestSession::open(d, "g", "r", subs.clone())),
    )
    .await?;
    let ring = Ring::with_key(names.iter().cloned(), RingKey::Name);
    let mut delivered: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (mut session, name) in sessions.into_iter().zip(&names) {
        let want = (0..OBJECTS)
            .filter(|i| {
                let key = RequestKey::new("", "ConfigMap", ns.name(), format!("cm-{i}"));
                ring.owner(&key) == Some(name.as_str())
            })
            .count();
        let got = session
            .collect_until(Duration::from_secs(30), |g| g.len() >= want)
            .await;
        for r in got {
            delivered.entry(r.key).or_default().push(name.clone());
        }
    }
    assert_eq!(
        delivered.len(),
        OBJECTS,
        "every key delivered: {delivered:?}"
    );
    for (key, by) in &delivered {
        assert_eq!(by.len(), 1, "{key} delivered by {by:?}");
    }

    let total = |counter: fn(&SharingCounts) -> &std::sync::atomic::AtomicU64| -> u64 {
        dispatchers.iter().map(|d| shared(d, counter)).sum()
    };
    let (made, alone, from_peers, relayed) = (
        total(|c| &c.made),
        total(|c| &c.alone),
        total(|c| &c.from_peers),
        total(|c| &c.relayed),
    );
    println!("LISTs made {made}, alone {alone}; read from a peer {from_peers}, relayed {relayed}");
    assert!(
        made + alone < DISPATCHERS as u64,
        "{DISPATCHERS} dispatchers asked the API server {} times for one list",
        made + alone
    );
    assert!(
        from_peers >= 1 && from_peers == relayed,
        "a list was read from a peer over Peer.List ({from_peers} read, {relayed} relayed)"
    );
    for d in dispatchers {
        d.stop().await;
    }
    Ok(())
}
