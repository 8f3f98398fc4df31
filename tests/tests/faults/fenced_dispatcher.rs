//! A dispatcher cut off from the API server fences itself (it cannot renew its Lease), then
//! drops off its own ring (its Lease looks lapsed to it), and hands nothing out, but keeps its
//! key index: when it is back and its watch must re-list (the API server restarted meanwhile,
//! so the watch cannot resume), the re-list shows which objects were deleted while it was away,
//! and nothing unchanged is delivered again; an owner whose child was deleted while it was away
//! is told.
//!
//! This file holds one test on purpose: it restarts the shared API server, and cargo runs test
//! binaries one after another, so no other test is running while it does.

use std::time::Duration;

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, PostParams},
};
use kube_dispatch_proto::v1::{ResourceRef, Subscription};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
    faultproxy::{Fault, FaultProxy},
    journal::{Journal, write_round},
};
use tokio::time::Instant;

#[tokio::test]
async fn a_deletion_while_fenced_is_found_by_the_relist() -> TestResult {
    let ns = TestNamespace::create("fenced").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    write_round(&api, 10, 0, &Journal::default()).await?;
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    let config = lease_config(ns.name(), "dispatcher-0", Duration::from_secs(3));
    let d = TestDispatcher::start_with(config, "127.0.0.1:0", Some(proxy.addr), None).await?;
    let mut slice = d.handles.slice.clone();
    tokio::time::timeout(Duration::from_secs(30), slice.wait_for(|s| s.is_settled())).await??;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut session = TestSession::open(&d, "fenced", "replica-0", subs).await?;
    let all = session
        .collect_until(Duration::from_secs(20), |got| got.len() >= 10)
        .await;
    assert_eq!(all.len(), 10);
    // A second group is told of owned ConfigMaps (owned by ConfigMaps) of another namespace:
    // "parent" owns "child".
    let family = TestNamespace::create("fenced-owners").await?;
    let family_api: Api<ConfigMap> = Api::namespaced(family.client(), family.name());
    let parent = family_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "parent"}}))?,
        )
        .await?;
    let mut child: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "child"}}))?;
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "parent".into(),
        uid: parent.uid().unwrap_or_default(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    family_api.create(&PostParams::default(), &child).await?;
    let owned = Subscription {
        owner: Some(ResourceRef {
            version: "v1".into(),
            kind: "ConfigMap".into(),
            ..ResourceRef::default()
        }),
        ..subscription("v1", "ConfigMap", family.name())
    };
    let mut owners = TestSession::open(&d, "owners", "replica-0", vec![owned]).await?;
    let parent_key = format!("/ConfigMap/{}/parent", family.name());
    let first = owners
        .collect_until(Duration::from_secs(20), |got| !got.is_empty())
        .await;
    assert_eq!(
        first.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        [parent_key.as_str()]
    );

    // Cut the dispatcher off until it fences itself (its 2 s Lease lapses unrenewed). While it
    // is away: a deletion, then an API-server restart, so its watch cannot resume and must
    // re-list. The session is polled throughout (nothing is handed out while fenced).
    let key = format!("/ConfigMap/{}/cm-3", ns.name());
    let cut_at = Instant::now();
    let away = async {
        proxy.set(Fault::Cut);
        let mut slice = d.handles.slice.clone();
        tokio::time::timeout(
            Duration::from_secs(30),
            slice.wait_for(|s| s.settled.is_none()),
        )
        .await??;
        api.delete("cm-3", &DeleteParams::default()).await?;
        family_api.delete("child", &DeleteParams::default()).await?;
        Cluster::shared()
            .restart_apiserver_expiring_watches(&ns)
            .await?;
        proxy.set(Fault::None);
        Ok::<_, kube_dispatch_tests::TestError>(())
    };
    let (got, told, away) = tokio::join!(
        session.collect_until(Duration::from_secs(90), |got| {
            got.iter().any(|r| r.key == key && r.deleted)
        }),
        owners.collect_until(Duration::from_secs(90), |got| !got.is_empty()),
        away
    );
    away?;
    assert_eq!(
        told.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        [parent_key.as_str()],
        "the owner of the child deleted while the dispatcher was away is told"
    );
    let seen: Vec<(&str, bool)> = got.iter().map(|r| (r.key.as_str(), r.deleted)).collect();
    let reasons: Vec<(&str, i32, &str)> = got
        .iter()
        .map(|r| (r.key.as_str(), r.reason, r.resource_version.as_str()))
        .collect();
    assert_eq!(
        seen,
        [(key.as_str(), true)],
        "exactly the deletion made while the dispatcher was fenced is delivered; (key, reason, resourceVersion): {reasons:?}"
    );
    println!(
        "deletion made while fenced delivered {:?} after the cut, nothing else",
        cut_at.elapsed()
    );
    d.stop().await;
    Ok(())
}
