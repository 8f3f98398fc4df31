//! A ring keyed by namespace against the real API server: each dispatcher asks for the
//! namespaces it owns only and delivers every key once, by its owner. Where the server has the
//! `ShardedListAndWatch` feature gate (1.36 and newer; the local control plane enables it) each
//! receives nothing else; where it has not (1.35, `KUBERNETES_VERSION=1.35`), the server ignores
//! the parameter, each receives everything and filters it itself, with the same deliveries. Owner
//! kinds are resolved when a session opens.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube_dispatch_proto::{RequestKey, Ring, RingKey, v1::Subscription};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
    wait_for,
};

/// Namespaces: with 16 well-spread names, the chance that all fall on one of two dispatchers
/// is 2^-15.
const NAMESPACES: usize = 16;
const PER_NAMESPACE: usize = 5;

/// Objects seen by the dispatcher's watches, and those of them owned by another dispatcher.
fn seen(d: &TestDispatcher) -> (u64, u64) {
    (
        d.watch_total(|c| &c.applied),
        d.watch_total(|c| &c.elsewhere),
    )
}

#[tokio::test]
async fn a_namespace_ring_watches_only_the_namespaces_each_dispatcher_owns() -> TestResult {
    let mut namespaces = Vec::new();
    // The index early in the name: FNV-1a, the API server's shard hash, leaves names that differ
    // only in their last characters (`shard-1`, `shard-2`, ...) close together, often on one
    // dispatcher (README, "Ring keyed by name or by namespace").
    for i in 0..NAMESPACES {
        namespaces.push(TestNamespace::create(&format!("s{i}-shard")).await?);
    }
    // Only this test's objects: the watch covers every namespace of the shared cluster.
    let label = format!("kube-dispatch-test-shard={}", namespaces[0].name());
    let (label_key, label_value) = label.split_once('=').unwrap_or_default();
    let objects: Vec<(String, String)> = namespaces
        .iter()
        .flat_map(|ns| (0..PER_NAMESPACE).map(move |i| (ns.name().to_owned(), format!("cm-{i}"))))
        .collect();
    let client = namespaces[0].client();
    futures::stream::iter(objects.clone())
        .map(|(ns, name)| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name);
            cm.metadata.labels = Some([(label_key.to_owned(), label_value.to_owned())].into());
            async move { api.create(&PostParams::default(), &cm).await }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;

    let members = ["dispatcher-0", "dispatcher-1"];
    let ring = Ring::with_key(members, RingKey::Namespace);
    let mut owned: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (ns, name) in &objects {
        let key = RequestKey::new("", "ConfigMap", ns.as_str(), name.as_str());
        let owner = ring.owner(&key).ok_or("an empty ring")?;
        owned.entry(owner).or_default().insert(key.to_string());
    }
    assert_eq!(owned.len(), 2, "both dispatchers own some namespaces");

    let mut dispatchers = Vec::new();
    for member in members {
        let mut config = test_config(member, &members);
        config.ring_key = RingKey::Namespace;
        dispatchers.push(TestDispatcher::start(config).await?);
    }
    let subs = vec![Subscription {
        label_selector: label.clone(),
        ..subscription("v1", "ConfigMap", "")
    }];
    let mut delivered: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (d, member) in dispatchers.iter().zip(members) {
        let want = owned[member].len();
        let mut session = TestSession::open(d, "g", "r", subs.clone()).await?;
        let got = session
            .collect_until(Duration::from_secs(30), |g| g.len() >= want)
            .await;
        for r in got {
            delivered.entry(r.key).or_default().push(member);
        }
    }
    let twice: Vec<_> = delivered.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    for (member, keys) in &owned {
        for key in keys {
            assert_eq!(
                delivered.get(key).map(Vec::as_slice),
                Some(&[*member][..]),
                "{key} must be delivered by its namespace's owner"
            );
        }
    }
    assert_eq!(delivered.len(), objects.len(), "no key beyond the test's");

    // What each dispatcher received: with the server's sharding, its own namespaces' objects,
    // none of the other's; without it, the other's too (the fallback filtered them).
    let sharded = Cluster::shared().shards_lists_and_watches().await?;
    for (d, member) in dispatchers.iter().zip(members) {
        let (applied, elsewhere) = seen(d);
        let others = objects.len() - owned[member].len();
        if sharded {
            assert_eq!(
                elsewhere, 0,
                "{member} received objects of the other dispatcher's namespaces: the API server did not apply shardSelector"
            );
            assert!(
                applied >= owned[member].len() as u64 && applied < objects.len() as u64,
                "{member} saw {applied} objects; it owns {} of {}",
                owned[member].len(),
                objects.len()
            );
        } else {
            // The list goes on after the dispatcher's own keys were delivered: wait for the
            // rest of it.
            wait_for(
                Duration::from_secs(30),
                &format!("{member} to receive the {others} objects of the other's namespaces, which this API server sends as it ignores shardSelector"),
                || async { seen(d).1 >= others as u64 },
            )
            .await?;
        }
    }
    for d in dispatchers {
        d.stop().await;
    }
    Ok(())
}

/// An owner kind is resolved when a session opens: one discovery does not serve is refused
/// with NOT_FOUND, as a subscription's resource is (the group's keys would otherwise depend on
/// when it first opened); a cluster-scoped one is taken on a ring keyed by namespace, where
/// such controllers ran before (the dispatcher warns that its owners hear only of children in
/// the namespaces it owns).
#[tokio::test]
async fn owner_kinds_are_resolved_when_a_session_opens() -> TestResult {
    use kube_dispatch_proto::v1::ResourceRef;

    let ns = TestNamespace::create("sharding-owner-kinds").await?;
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.ring_key = RingKey::Namespace;
    let d = TestDispatcher::start(config).await?;
    let owned_by = |group: &str, kind: &str| {
        vec![Subscription {
            owner: Some(ResourceRef {
                group: group.into(),
                version: "v1".into(),
                kind: kind.into(),
                plural: String::new(),
            }),
            ..subscription("v1", "ConfigMap", ns.name())
        }]
    };
    let refused = TestSession::open(&d, "nothing", "r1", owned_by("example.invalid", "Nothing"))
        .await
        .err()
        .ok_or("an owner kind discovery does not serve was taken")?;
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    TestSession::open(&d, "namespaces", "r1", owned_by("", "Namespace")).await?;
    TestSession::open(&d, "services", "r1", owned_by("", "Service")).await?;
    d.stop().await;
    Ok(())
}
