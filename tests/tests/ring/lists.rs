//! Lists shared on a ring keyed by name, against the real API server: dispatchers that start
//! the same watch together read one LIST, made by the dispatcher its path falls on and relayed
//! to the others over `Peer.List`, and each still delivers exactly its own keys; so do the
//! survivors of a drain, for their lists beside the stream.

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

/// `OBJECTS` ConfigMaps in `ns`.
async fn fill(ns: &TestNamespace) -> TestResult {
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
    Ok(())
}

/// `DISPATCHERS` dispatchers in `ns`, each on a settled ring of all of them with every other
/// one sharing lists, and their names.
async fn ring_of_all(ns: &TestNamespace) -> TestResult<(Vec<String>, Vec<TestDispatcher>)> {
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
    Ok((names, dispatchers))
}

/// The ConfigMaps of `ns` that `ring` places on `member`.
fn placed_on(ring: &Ring, ns: &TestNamespace, member: &str) -> Vec<String> {
    (0..OBJECTS)
        .map(|i| format!("cm-{i}"))
        .filter(|name| {
            let key = RequestKey::new("", "ConfigMap", ns.name(), name.clone());
            ring.owner(&key) == Some(member)
        })
        .collect()
}

#[tokio::test]
async fn dispatchers_that_start_a_watch_together_read_one_list() -> TestResult {
    let ns = TestNamespace::create("shared-list").await?;
    fill(&ns).await?;
    let (names, dispatchers) = ring_of_all(&ns).await?;

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
        let want = placed_on(&ring, &ns, name).len();
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

/// The survivors of a dispatcher that drains gain its keys together, and each lists beside its
/// watch's stream for them: one LIST for both, made by the survivor the path falls on and
/// relayed to the other (its resourceVersion at least what the other's stream had shown), and
/// each delivers the keys that moved to it.
#[tokio::test]
async fn the_survivors_of_a_drain_read_one_list_beside_their_streams() -> TestResult {
    let ns = TestNamespace::create("shared-side-list").await?;
    fill(&ns).await?;
    let (names, mut dispatchers) = ring_of_all(&ns).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut sessions = futures::future::try_join_all(
        dispatchers
            .iter()
            .map(|d| TestSession::open(d, "g", "r", subs.clone())),
    )
    .await?;
    let ring = Ring::with_key(names.iter().cloned(), RingKey::Name);
    for (session, name) in sessions.iter_mut().zip(&names) {
        let want = placed_on(&ring, &ns, name).len();
        let got = session
            .collect_until(Duration::from_secs(30), |g| g.len() >= want)
            .await;
        assert_eq!(got.len(), want, "{name} delivered its keys first");
    }

    type Counter = fn(&SharingCounts) -> &std::sync::atomic::AtomicU64;
    let counters: [(&str, Counter); 4] = [
        ("made", |c| &c.made),
        ("from_peers", |c| &c.from_peers),
        ("relayed", |c| &c.relayed),
        ("too_old", |c| &c.too_old),
    ];
    let counts = |ds: &[TestDispatcher]| -> BTreeMap<&str, u64> {
        let mut counts: BTreeMap<&str, u64> = counters
            .iter()
            .map(|(name, counter)| (*name, ds.iter().map(|d| shared(d, counter)).sum()))
            .collect();
        counts.insert(
            "side_lists",
            ds.iter().map(|d| d.watch_total(|c| &c.side_lists)).sum(),
        );
        counts
    };
    let before = counts(&dispatchers[..DISPATCHERS - 1]);

    // The last one drains: its keys move to the other two.
    let leaving = names[DISPATCHERS - 1].clone();
    drop(sessions.pop());
    if let Some(d) = dispatchers.pop() {
        d.stop().await;
    }
    let survivors = Ring::with_key(names[..DISPATCHERS - 1].iter().cloned(), RingKey::Name);
    for (session, name) in sessions.iter_mut().zip(&names) {
        let moved: Vec<String> = placed_on(&ring, &ns, &leaving)
            .into_iter()
            .filter(|object| placed_on(&survivors, &ns, name).contains(object))
            .collect();
        let got = session
            .collect_until(Duration::from_secs(60), |g| {
                moved
                    .iter()
                    .all(|m| g.iter().any(|r| r.key.ends_with(&format!("/{m}"))))
            })
            .await;
        for m in &moved {
            assert!(
                got.iter().any(|r| r.key.ends_with(&format!("/{m}"))),
                "{name} delivered {m}, which moved to it: {got:?}"
            );
        }
    }

    let after = counts(&dispatchers);
    let grew = |name: &str| after[name] - before[name];
    println!("survivors' counts before the drain {before:?}, after {after:?}");
    assert!(
        grew("side_lists") >= 2,
        "each survivor listed beside its stream"
    );
    assert!(
        grew("from_peers") >= 1 && grew("from_peers") == grew("relayed"),
        "a survivor's list beside its stream was read from the other over Peer.List"
    );
    assert_eq!(grew("too_old"), 0, "no shared list older than a stream");
    for d in dispatchers {
        d.stop().await;
    }
    Ok(())
}
