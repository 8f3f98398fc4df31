//! The 410 Gone path, as production clusters hit it: kube-apiserver restarts, its watch cache
//! starts over at a newer resourceVersion, and a watch that resumes from an older one is told
//! "too old resource version". The kube watcher must recover by re-listing.
//!
//! This file holds one test on purpose: it restarts the shared API server, and cargo runs test
//! binaries one after another, so no other test is running while it does.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    ResourceExt,
    api::{Api, PostParams, WatchEvent, WatchParams},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    },
};
use kube_dispatch_tests::{Cluster, TestNamespace};

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn watcher_relists_after_410_gone_from_an_apiserver_restart()
-> kube_dispatch_tests::TestResult {
    let ns = TestNamespace::create("apiserver-restart").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut before = ConfigMap::default();
    before.metadata.name = Some("before".into());
    let before = api.create(&PostParams::default(), &before).await?;
    let old_rv = before
        .resource_version()
        .expect("created objects have a resourceVersion");

    let mut events = watcher::watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut lists = 0;
    let mut listed = Vec::new();
    // The first list.
    loop {
        match tokio::time::timeout(TIMEOUT, events.next()).await? {
            Some(Ok(Event::Init)) => lists += 1,
            Some(Ok(Event::InitApply(cm))) => listed.push(cm.name_any()),
            Some(Ok(Event::InitDone)) => break,
            other => panic!("expected the initial list, got {other:?}"),
        }
    }
    assert_eq!(
        (lists, listed.as_slice()),
        (1, ["before".to_owned()].as_slice())
    );

    Cluster::shared()
        .restart_apiserver_expiring_watches(&ns)
        .await?;
    // The restarted server answered /readyz, so this client reconnects at once.
    let client = Cluster::shared().client().await?;
    let fresh: Api<ConfigMap> = Api::namespaced(client, ns.name());

    // The server side: a watch from before the restart is expired.
    let mut stream = fresh.watch(&WatchParams::default(), &old_rv).await?.boxed();
    match tokio::time::timeout(TIMEOUT, stream.next()).await? {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected 410 Gone for resourceVersion {old_rv}, got {other:?}"),
    }

    // A change made after the restart, which the watcher must see.
    let mut after = ConfigMap::default();
    after.metadata.name = Some("after".into());
    api.create(&PostParams::default(), &after).await?;

    // The watcher side: its watch broke, resuming it hit 410, and it listed again from scratch.
    // Connection errors while the server was down are expected and skipped.
    let mut relisted = Vec::new();
    let mut saw_after = false;
    while !saw_after {
        match tokio::time::timeout(TIMEOUT, events.next()).await? {
            Some(Ok(Event::Init)) => {
                lists += 1;
                relisted.clear();
            }
            Some(Ok(Event::InitApply(cm))) => relisted.push(cm.name_any()),
            Some(Ok(Event::InitDone)) => saw_after = relisted.contains(&"after".to_owned()),
            Some(Ok(Event::Apply(cm))) => saw_after = cm.name_any() == "after",
            Some(Ok(Event::Delete(cm))) => panic!("nothing was deleted, got delete of {cm:?}"),
            Some(Err(_)) => {}
            None => panic!("the watcher stream ended"),
        }
    }
    assert_eq!(
        lists, 2,
        "the watcher must re-list exactly once after 410 Gone"
    );
    assert!(
        relisted.contains(&"before".to_owned()),
        "re-list lost an object: {relisted:?}"
    );
    Ok(())
}
