//! An API-server restart expires the dispatcher's watch (410 Gone on resume): the re-list must
//! lose no update and no delete, must not re-deliver what did not change, and must show an
//! object that left a subscription's selector meanwhile as gone from it.
//!
//! One test in this file on purpose: it restarts the shared API server, and cargo runs test
//! binaries one after another.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    ResourceExt,
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
};
use kube_dispatch_dispatcher::config::ListMode;
use kube_dispatch_proto::v1::{Reason, Subscription};
use kube_dispatch_tests::{
    Cluster, TestNamespace,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
};

#[tokio::test]
async fn an_apiserver_restart_loses_no_update_and_no_delete()
-> Result<(), Box<dyn std::error::Error>> {
    let ns = TestNamespace::create("dispatch-apiserver-restart").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    // The session is not polled while the test waits for the restart: give it a long ttl.
    let mut config = test_config("dispatcher-0", &["dispatcher-0"]);
    config.settings.limits.default_ttl = Duration::from_secs(60);
    // Every other test lists in pages (the default); this one lists by streaming, and again
    // after the watch expires, so both ways are shown to lose nothing.
    config.list_mode = ListMode::Stream;
    let d = TestDispatcher::start(config).await?;
    let mut s = TestSession::open(
        &d,
        "g",
        "r",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    for name in ["a", "b", "c"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        api.create(&PostParams::default(), &cm).await?;
    }
    let first = s
        .collect_until(Duration::from_secs(30), |g| g.len() >= 3)
        .await;
    assert_eq!(first.len(), 3);
    // A group that sees only ConfigMaps labelled tier=web, and one such object.
    let web = Subscription {
        label_selector: "tier=web".into(),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut selected = TestSession::open(&d, "web", "r", vec![web]).await?;
    let mut w = ConfigMap::default();
    w.metadata.name = Some("w".into());
    w.metadata.labels = Some([("tier".to_owned(), "web".to_owned())].into());
    let w = api.create(&PostParams::default(), &w).await?;
    let got = selected
        .collect_until(Duration::from_secs(30), |g| !g.is_empty())
        .await;
    assert_eq!(got.len(), 1);

    Cluster::shared()
        .restart_apiserver_expiring_watches(&ns)
        .await?;

    // Changes right after the restart, while the dispatcher is reconnecting and re-listing.
    let client = Cluster::shared().client().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, ns.name());
    let patch = serde_json::json!({ "data": { "v": "2" } });
    let updated = api
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    api.delete("b", &DeleteParams::default()).await?;
    // "w" leaves the selection while the watches are re-listing.
    let relabel = serde_json::json!({ "metadata": { "labels": { "tier": "db" } } });
    api.patch("w", &PatchParams::default(), &Patch::Merge(&relabel))
        .await?;

    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    let a_rv = updated.resource_version().unwrap();
    let (ka, kb) = (key("a"), key("b"));
    let got = s
        .collect_until(Duration::from_secs(60), |g| {
            g.iter().any(|r| r.key == ka && r.resource_version == a_rv)
                && g.iter().any(|r| r.key == kb && r.deleted)
        })
        .await;
    let a = got
        .iter()
        .find(|r| r.key == key("a"))
        .expect("the update after the restart");
    assert_eq!(
        (Reason::try_from(a.reason)?, a.resource_version.as_str()),
        (Reason::Modified, a_rv.as_str())
    );
    let b = got
        .iter()
        .find(|r| r.key == key("b"))
        .expect("the delete after the restart");
    assert_eq!(Reason::try_from(b.reason)?, Reason::Deleted);
    // The re-list saw c unchanged: no delivery for it.
    let rest = s.collect_until(Duration::from_secs(2), |_| false).await;
    let c: Vec<_> = got
        .iter()
        .chain(&rest)
        .filter(|r| r.key == key("c"))
        .collect();
    assert!(
        c.is_empty(),
        "unchanged object re-delivered after the re-list: {c:?}"
    );
    // The selector's group is told "w" is gone from it, with its uid.
    let kw = key("w");
    let left = selected
        .collect_until(Duration::from_secs(60), |g| g.iter().any(|r| r.key == kw))
        .await;
    let gone: Vec<_> = left
        .iter()
        .filter(|r| r.key == kw)
        .map(|r| (Reason::try_from(r.reason), r.deleted, r.uid.as_str()))
        .collect();
    assert_eq!(
        gone,
        [(
            Ok(Reason::Deleted),
            true,
            w.uid().unwrap_or_default().as_str()
        )]
    );
    d.stop().await;
    Ok(())
}
